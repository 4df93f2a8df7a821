"""Deliveries waiting for an acknowledgement, with their deadlines in order. Pure: no I/O, no clock.

Deadlines sit in a heap, so finding what expired costs O(log n) per expiry and never a scan. A run
added at once (one deadline, consecutive tokens) is one heap item, read from its first ref not yet
passed: a take of 100 costs one push, not 100 (issue 27), and expiry stays per message, in (deadline,
token) order. An entry removed early (acked, nacked) leaves a stale ref behind in its item; stale refs
are skipped when reached and the heap is rebuilt when they outnumber the live ones, which keeps memory
proportional to what is in flight.

Each delivery also carries the bytes of its body and the payer they are charged to (the broker's byte
account, pzq/broker/accounts.py): the tracker keeps each payer's sum as entries come and go, undo
included, so what is charged can never drift from what is in flight.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, KeysView, Mapping, Sequence
from operator import attrgetter
from typing import Generic, NamedTuple, TypeVar

Ref = TypeVar("Ref", bound=Hashable)


class Delivery(NamedTuple, Generic[Ref]):
    """One message handed to a consumer and not yet acknowledged. A tuple: a run's are built in C
    (``_new``), with no Python call per delivery (issue 40: a dataclass's ``__init__`` was a third of
    ``add_many``)."""

    ref: Ref
    deadline: float
    consumer: Hashable
    token: int
    size: int = 0  # bytes of its body, charged to its payer while it is in flight
    payer: Hashable = None  # whose share the bytes are charged to (its consumer unless given)


_new = tuple.__new__  # (``_new(Delivery, fields)``: one delivery from a tuple of its fields, in C)
_consumer, _size, _payer = attrgetter("consumer"), attrgetter("size"), attrgetter("payer")


def _drain(iterator: Iterable) -> None:
    """Run ``iterator`` to its end in C (a ``map`` of calls made for their effect)."""
    collections.deque(iterator, 0)


class InFlight(Generic[Ref]):
    """Tracks deliveries by message reference, each with one deadline and one consumer."""

    def __init__(self) -> None:
        self._entries: dict[Ref, Delivery[Ref]] = {}
        # (deadline, token of the first ref not passed, token of refs[0], refs): ref i has token t0 + i
        self._heap: list[tuple[float, int, int, tuple[Ref, ...]]] = []
        self._heaped = 0  # refs in heap items not passed yet, live or stale (what bounds the heap's memory)
        self._per_consumer: dict[Hashable, int] = {}
        self._bytes: dict[Hashable, int] = {}  # payer -> bytes of its deliveries in flight
        self.bytes_total = 0  # of every payer
        self._tokens = 0
        # Since mark(): each ref changed, with its entry before the first change (None: not in flight).
        self._journal: dict[Ref, Delivery[Ref] | None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ref: object) -> bool:
        return ref in self._entries

    def refs(self) -> KeysView[Ref]:
        """The refs in flight, as a live view (a run's ``in`` tests without a call each)."""
        return self._entries.keys()

    def table(self) -> Mapping[Ref, Delivery[Ref]]:
        """Each ref in flight and its delivery, read-only (a run's lookups without a call each)."""
        return self._entries

    def get(self, ref: Ref) -> Delivery[Ref] | None:
        return self._entries.get(ref)

    def deadline_of(self, consumer: Hashable) -> Callable[[Ref], float | None]:
        """A function of a ref: its deadline if ``consumer`` holds it, else None. One call for a
        gateway's question about each delivery of a run (three through the broker; the entries are
        this tracker's for its life)."""
        get = self._entries.get

        def deadline(ref: Ref) -> float | None:
            entry = get(ref)
            return entry.deadline if entry is not None and entry.consumer == consumer else None

        return deadline

    def held_by(self, consumer: Hashable) -> Callable[[Ref], bool]:
        """A function of a ref: whether ``consumer`` holds it (``deadline_of``'s question as a bool)."""
        get = self._entries.get

        def held(ref: Ref) -> bool:
            entry = get(ref)
            return entry is not None and entry.consumer == consumer

        return held

    def count(self, consumer: Hashable) -> int:
        """How many deliveries ``consumer`` holds."""
        return self._per_consumer.get(consumer, 0)

    def bytes_of(self, payer: Hashable) -> int:
        """Bytes of the deliveries in flight charged to ``payer``."""
        return self._bytes.get(payer, 0)

    def add(
        self, ref: Ref, deadline: float, consumer: Hashable = None, size: int = 0, payer: Hashable = None
    ) -> Delivery[Ref]:
        """Track a delivery of ``size`` bytes charged to ``payer`` (``consumer`` if None); a ref already
        in flight is replaced (its old deadline no longer counts)."""
        self._note(ref)
        self._take(ref)
        self._tokens += 1
        payer = consumer if payer is None else payer
        entry = Delivery(ref, deadline, consumer, self._tokens, size, payer)
        self._entries[ref] = entry
        self._per_consumer[consumer] = self._per_consumer.get(consumer, 0) + 1
        if size:
            self._charge(payer, size)
        heapq.heappush(self._heap, (deadline, self._tokens, self._tokens, (ref,)))
        self._heaped += 1
        return entry

    def add_many(
        self,
        refs: list[Ref],
        deadline: float,
        consumer: Hashable = None,
        sizes: Sequence[int] | None = None,
        payer: Hashable = None,
        *,
        fresh: bool = False,
    ) -> None:
        """``add`` each of ``refs`` with one deadline, consumer and payer, ``sizes`` the bytes of each (a
        take's run: one call, not one each; the payer is charged the run's sum at once). ``fresh``: the
        caller knows that no ref is in flight nor named twice (a run read past what is in flight)."""
        if not refs:
            return
        entries, journal, per = self._entries, self._journal, self._per_consumer
        payer = consumer if payer is None else payer
        first = self._tokens + 1
        if fresh or entries.keys().isdisjoint(refs) and len(set(refs)) == len(refs):
            # The usual run (none of it in flight, no ref twice): every step in C, no Python per delivery
            n = len(refs)
            if journal:
                _drain(map(journal.setdefault, refs, itertools.repeat(None, n)))  # (each was not in flight)
            elif journal is not None:  # (the turn's first change: its journal at once)
                journal = self._journal = dict.fromkeys(refs)
            fields = zip(
                refs,
                itertools.repeat(deadline, n),
                itertools.repeat(consumer, n),
                range(first, first + n),
                itertools.repeat(0, n) if sizes is None else sizes,
                itertools.repeat(payer, n),
                strict=True,
            )
            entries.update(zip(refs, map(_new, itertools.repeat(Delivery, n), fields), strict=True))
            self._tokens += n
            per[consumer] = per.get(consumer, 0) + n
        else:
            added, token = 0, self._tokens
            for ref, size in zip(refs, itertools.repeat(0) if sizes is None else sizes, strict=False):
                if journal is not None and ref not in journal:
                    journal[ref] = entries.get(ref)
                if ref in entries:  # (replaced: counted so far first, so that _take finds its consumer's count)
                    per[consumer], added = per.get(consumer, 0) + added, 0
                    self._take(ref)  # (a rebuild here gives the run's refs so far twins: harmless, as in undo)
                token += 1
                entries[ref] = Delivery(ref, deadline, consumer, token, size, payer)
                added += 1
            self._tokens = token
            if added:
                per[consumer] = per.get(consumer, 0) + added
        heapq.heappush(self._heap, (deadline, first, first, tuple(refs)))  # (one item for the run)
        self._heaped += len(refs)
        if sizes is not None:
            run = sum(sizes)
            if run:
                self._charge(payer, run)

    def _charge(self, payer: Hashable, size: int) -> None:
        """``size`` bytes more (or fewer, if negative) charged to ``payer``."""
        left = self._bytes.get(payer, 0) + size
        if left:
            self._bytes[payer] = left
        else:
            del self._bytes[payer]
        self.bytes_total += size

    def remove(self, ref: Ref) -> Delivery[Ref] | None:
        """Stop tracking ``ref`` (acked, nacked, or its consumer left); None if it was not in flight."""
        self._note(ref)
        return self._take(ref)

    def remove_many(self, refs: list[Ref]) -> list[Delivery[Ref] | None]:
        """``remove`` each of ``refs`` in order (an ack run): what each was, None if not in flight."""
        journal, entries, per = self._journal, self._entries, self._per_consumer
        n = len(refs)
        if journal is not None:  # (the first change of a ref since mark() is the one kept)
            _drain(map(journal.setdefault, refs, map(entries.get, refs)))
        out = list(map(entries.pop, refs, itertools.repeat(None, n)))
        if None not in out and len(consumers := set(map(_consumer, out))) == 1:
            # The usual run (one consumer's acks, each in flight): its counts and bytes in C
            (consumer,) = consumers
            left = per[consumer] - n
            if left:
                per[consumer] = left
            else:
                del per[consumer]
            payers = set(map(_payer, out))
            if len(payers) == 1:
                size = sum(map(_size, out))
                if size:
                    self._charge(payers.pop(), -size)
            else:
                self._release(out)
        else:
            gone: dict[Hashable, int] = {}  # (per consumer: an ack run is usually one consumer's)
            for entry in out:
                if entry is not None:
                    gone[entry.consumer] = gone.get(entry.consumer, 0) + 1
            for consumer, count in gone.items():
                left = per[consumer] - count
                if left:
                    per[consumer] = left
                else:
                    del per[consumer]
            self._release(out)
        if self._heaped > 2 * len(entries) + 1024:  # (as _take: stale heap items bounded)
            self._rebuild()
        return out

    def _release(self, gone: list[Delivery[Ref] | None]) -> None:
        """Take the bytes of the deliveries ``gone`` off their payers (None: was not in flight)."""
        paid: dict[Hashable, int] = {}  # (bytes per payer)
        for entry in gone:
            if entry is not None and entry.size:
                paid[entry.payer] = paid.get(entry.payer, 0) + entry.size
        for payer, size in paid.items():
            self._charge(payer, -size)

    def _rebuild(self) -> None:
        """The heap again from the live entries alone, one item each."""
        self._heap = [(e.deadline, e.token, e.token, (e.ref,)) for e in self._entries.values()]
        heapq.heapify(self._heap)
        self._heaped = len(self._heap)

    def mark(self) -> None:
        """Begin a journal of changes (a turn begins): ``undo`` puts back every entry as it is now."""
        self._journal = {}

    def undo(self) -> None:
        """Put every entry changed since ``mark`` back as it was then (a rolled-back turn)."""
        journal, self._journal = self._journal or {}, {}
        for ref, entry in journal.items():
            self._take(ref)
            if entry is not None:
                self._entries[ref] = entry
                self._per_consumer[entry.consumer] = self._per_consumer.get(entry.consumer, 0) + 1
                if entry.size:
                    self._charge(entry.payer, entry.size)
                # (a twin of it may still be in the heap: popped once, the other is then stale)
                heapq.heappush(self._heap, (entry.deadline, entry.token, entry.token, (ref,)))
                self._heaped += 1

    def _note(self, ref: Ref) -> None:
        journal = self._journal
        if journal is not None and ref not in journal:
            journal[ref] = self._entries.get(ref)

    def _take(self, ref: Ref) -> Delivery[Ref] | None:
        entry = self._entries.pop(ref, None)
        if entry is None:
            return None
        left = self._per_consumer[entry.consumer] - 1
        if left:
            self._per_consumer[entry.consumer] = left
        else:
            del self._per_consumer[entry.consumer]
        if entry.size:
            self._charge(entry.payer, -entry.size)
        if self._heaped > 2 * len(self._entries) + 1024:
            self._rebuild()
        return entry

    def remove_consumer(self, consumer: Hashable) -> list[Delivery[Ref]]:
        """Stop tracking every delivery held by ``consumer``, oldest deadline first."""
        held = sorted(
            (e for e in self._entries.values() if e.consumer == consumer), key=lambda e: (e.deadline, e.token)
        )
        for entry in held:
            self.remove(entry.ref)
        return held

    def holders(self) -> Iterator[tuple[Ref, Hashable]]:
        """(ref, consumer) of every delivery in flight."""
        return ((e.ref, e.consumer) for e in self._entries.values())

    def remove_matching(self, predicate) -> list[Delivery[Ref]]:
        """Stop tracking every delivery whose ref satisfies ``predicate`` (a scan: for rare events)."""
        gone = [e for e in self._entries.values() if predicate(e.ref)]
        for entry in gone:
            self.remove(entry.ref)
        return gone

    def next_deadline(self) -> float | None:
        """The earliest live deadline, or None when nothing is in flight."""
        heap, entries = self._heap, self._entries
        while heap:
            deadline, token, first, run = heap[0]
            start = at = token - first
            end = len(run)
            while at < end:  # (past the run's stale refs: each is passed once)
                entry = entries.get(run[at])
                if entry is not None and entry.token == first + at:
                    break
                at += 1
            self._heaped -= at - start
            if at == start:
                return deadline
            if at == end:
                heapq.heappop(heap)
            else:  # (its key is now its first live ref's token: another item may come first)
                heapq.heapreplace(heap, (deadline, first + at, first, run))
        return None

    def pop_expired(self, now: float, limit: int | None = None) -> list[Delivery[Ref]]:
        """Remove and return the deliveries whose deadline is <= ``now``, earliest first."""
        out: list[Delivery[Ref]] = []
        while limit is None or len(out) < limit:
            deadline = self.next_deadline()
            if deadline is None or deadline > now:
                break
            heap = self._heap
            _, token, first, run = heap[0]
            if token - first + 1 < len(run):
                heapq.heapreplace(heap, (deadline, token + 1, first, run))
            else:
                heapq.heappop(heap)
            self._heaped -= 1
            delivery = self.remove(run[token - first])
            if delivery is not None:  # (next_deadline skipped stale refs: it is live)
                out.append(delivery)
        return out

    def approx_bytes(self) -> int:
        """A rough size of this tracking in memory, for the monitor's inflight_db_size."""
        return 200 * len(self._entries) + 60 * len(self._heap) + 8 * self._heaped
