"""The broker's part that ends deliveries: answers from consumers (ack, nack, requeue, dead-letter,
take back) and deliveries that end without one (undeliver, ack timeouts, consumers gone).

Ownership: a client settles only what was delivered to it. ``by`` is the holder a protocol gave
``take`` (a connection, a consumer, a worker, the native send socket, a lease group). A request naming
a message ``by`` does not hold changes nothing and returns False (counted as refused). The ``_many``
calls take runs of refs in one call (a batch of a consumer's acks, the deliveries of a turn that could
not leave) and answer with what they refused, which is usually nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from operator import attrgetter, itemgetter

from pzq.broker.state import BrokerState, Exclusive, Ref
from pzq.store import Message

_LATE_NOBODY = (object(), None, 0)
_consumer, _payer, _qid, _seq = attrgetter("consumer"), attrgetter("payer"), itemgetter(0), itemgetter(1)


class Settling:
    """The Broker's settling of deliveries, by their holder or by time (rules 3, 6, 7, 8)."""

    def __init__(self, state: BrokerState):
        self._s = state
        # (what a reset only clears, never replaces: kept here, a lookup less on the hot paths)
        self._store, self._counters, self._accounts = state.store, state.counters, state.accounts
        self._late, self._settle, self._requeue = state.late, state.settle, state.requeue
        self._ready_of, self._count = state.ready_of, state.count

    def holds(self, ref: Ref, by: Hashable) -> bool:
        """True if ``by`` may settle ``ref``: it holds the delivery, or its delivery timed out (or it
        left) and nobody has settled the message since (a late answer; see ``Limits.late_memory``)."""
        delivery = self._s.inflight.get(ref)
        if delivery is not None and delivery.consumer == by:
            return True
        if delivery is not None and isinstance(delivery.consumer, Exclusive):
            return False  # a durable lease: only its group may settle it, however late the answer
        held = self._s.ranges.get(ref[0])
        if held and held.holder_of(ref[1]) is not None:
            return False  # leased by a group, which settles by range (ack_range), never by message
        return self._late.get(ref, _LATE_NOBODY)[0] == by

    def ack(self, ref: Ref, *, by: Hashable) -> bool:
        """Delete the message for good (a late ack from its last holder still counts). False if ``by``
        does not hold it or it is no longer stored."""
        if not self._may_settle(ref, by):
            return False
        self._settle(ref, by)
        info = self._store.queue_by_id(ref[0])
        if info is None or not self._store.delete(info.name, ref[1]):
            return False
        self._counters.acked += 1
        self._count(info.name, "acked")
        if by in self._s.keep_on_rollback:
            self._s.keep_unwritten((ref,))
        return True

    def ack_many(self, refs: Iterable[Ref], *, by: Hashable) -> list[Ref]:
        """``ack`` each of ``refs`` in order; returns those refused (not held by ``by``, or gone). The same
        as one ``ack`` after another, done as a run: settled in one loop, deleted a queue at a time."""
        refs = list(refs)
        if refs and (not_held := self._ack_held_run(refs, by)) is not None:
            return not_held
        get, holds, counters = self._s.inflight.table().get, self.holds, self._counters
        settled: dict[Ref, None] = {}  # in order; a repeat is refused, as a second ack would be
        for ref in refs:
            delivery = get(ref)
            if ref in settled or not (delivery is not None and delivery.consumer == by or holds(ref, by)):
                counters.refused_not_held += 1
                continue
            settled[ref] = None
        if not settled:
            return refs
        late = self._late
        if late:
            for ref in settled:
                entry = late.pop(ref, None)
                if entry is not None and entry[1] is not None and entry[0] == by:  # (see BrokerState.settle)
                    self._accounts.settled_late(entry[1], entry[2])
        per_queue: dict[int, list[int]] = {}
        gone: dict[int, int] = {}  # qid -> deliveries of it that were in flight (settled here)
        payer: Hashable = _LATE_NOBODY  # (the run's payer whose bytes were released: usually one)
        for ref, delivery in zip(settled, self._s.inflight.remove_many(list(settled)), strict=True):
            qid = ref[0]
            seqs = per_queue.get(qid)
            if seqs is None:
                seqs = per_queue[qid] = []
            seqs.append(ref[1])
            if delivery is not None:
                gone[qid] = gone.get(qid, 0) + 1
                if delivery.size and delivery.payer != payer:
                    payer = delivery.payer
                    if self._accounts.released(payer, self._s.inflight):
                        self._s.readiness += 1
        for qid, n in gone.items():
            self._ready_of(qid).inflight -= n
        failed: set[Ref] = set()  # settled but no longer stored
        for qid, seqs in per_queue.items():
            info = self._store.queue_by_id(qid)
            oks = [False] * len(seqs) if info is None else self._store.delete_many(info.name, seqs)
            done = sum(oks)
            if done < len(seqs):
                failed.update((qid, seq) for seq, ok in zip(seqs, oks, strict=True) if not ok)
            if done and info is not None:
                counters.acked += done
                self._count(info.name, "acked", done)
        if by in self._s.keep_on_rollback:
            self._s.keep_unwritten(ref for ref in settled if ref not in failed)
        if not failed and len(settled) == len(refs):
            return []
        acked = {ref for ref in settled if ref not in failed}
        refused: list[Ref] = []
        for ref in refs:  # (in order; a repeat of an acked ref is refused)
            if ref in acked:
                acked.discard(ref)
            else:
                refused.append(ref)
        return refused

    def _ack_held_run(self, refs: list[Ref], by: Hashable) -> list[Ref] | None:
        """``ack_many``'s usual run, every step over it in C: each ref named once, all of one queue, each
        in flight to ``by`` (no late answer among them). Returns what was refused (in flight, but no
        longer stored), or None, having changed nothing, for any other run (``ack_many`` then settles it
        ref by ref): the same effects as that."""
        found = list(map(self._s.inflight.table().get, refs))
        if None in found or set(map(_consumer, found)) != {by} or len(set(refs)) != len(refs):
            return None
        qids = set(map(_qid, refs))
        info = self._store.queue_by_id(next(iter(qids))) if len(qids) == 1 else None
        if info is None or self._late and not self._late.keys().isdisjoint(refs):
            return None
        self._s.inflight.remove_many(refs)
        self._ready_of(info.qid).inflight -= len(refs)
        for payer in set(map(_payer, found)):  # (their bytes released: usually one payer)
            if self._accounts.released(payer, self._s.inflight):
                self._s.readiness += 1
        oks = self._store.delete_many(info.name, list(map(_seq, refs)))
        done = oks.count(True)
        if done:
            self._counters.acked += done
            self._count(info.name, "acked", done)
        if by in self._s.keep_on_rollback:
            self._s.keep_unwritten(itertools.compress(refs, oks))
        return [] if done == len(refs) else [ref for ref, ok in zip(refs, oks, strict=True) if not ok]

    def nack(self, ref: Ref, *, by: Hashable) -> bool:
        """Requeue a message ``by`` holds in flight at once, ahead of newer ones. False otherwise."""
        delivery = self._s.inflight.get(ref)
        if delivery is None or delivery.consumer != by:
            self._counters.refused_not_held += 1
            return False
        self._settle(ref, by)
        self._counters.nacked += 1
        self._requeue(ref)
        return True

    def requeue_at_end(self, ref: Ref, *, by: Hashable, expires_us: int = 0) -> bool:
        """Move a message ``by`` holds to the end of its queue with a new expiry (0 = never)."""
        message = self.stored(ref) if self._may_settle(ref, by) else None
        if message is None:
            return False
        self._settle(ref, by)
        self._store.requeue_at_end(message, expires_us=expires_us)
        self._s.readiness += 1
        return True

    def requeue(self, ref: Ref, *, by: Hashable, at_end: bool = False, expires_us: int = 0) -> bool:
        """A message ``by`` holds goes back to its queue: ahead of newer ones (``nack``: only while in
        flight to ``by``), or ``at_end`` with a new expiry (``requeue_at_end``: a late answer counts)."""
        return self.requeue_at_end(ref, by=by, expires_us=expires_us) if at_end else self.nack(ref, by=by)

    def dead_letter(self, ref: Ref, reason: str, *, by: Hashable, now_us: int) -> bool:
        """Move a message ``by`` holds to its queue's dead letters at that client's request."""
        message = self.stored(ref) if self._may_settle(ref, by) else None
        if message is None:
            return False
        self._settle(ref, by)
        self._s.to_dead_letters(message, reason, now_us)
        return True

    def _may_settle(self, ref: Ref, by: Hashable) -> bool:
        if self.holds(ref, by):
            return True
        self._counters.refused_not_held += 1
        return False

    def stored(self, ref: Ref) -> Message | None:
        """The stored message of ``ref``; None once it is gone."""
        info = self._store.queue_by_id(ref[0])
        return None if info is None else self._store.get(info.name, ref[1])

    def deadline(self, ref: Ref, holder: Hashable) -> float | None:
        """When ``holder``'s delivery of ``ref`` times out; None if ``ref`` is not in flight to ``holder``
        (a gateway's question: when did it leave, is it still ours)."""
        delivery = self._s.inflight.get(ref)
        return delivery.deadline if delivery is not None and delivery.consumer == holder else None

    def undeliver(self, ref: Ref) -> bool:
        """A delivery that never left (the socket refused it): requeue it and take back its count. False
        if it was not in flight."""
        if self._settle(ref) is None:
            return False
        info = self._store.queue_by_id(ref[0])
        if info is not None:
            self._store.unmark_delivered(info.name, ref[1])
        self._requeue(ref)
        return True

    def undeliver_many(self, refs: Iterable[Ref]) -> None:
        """``undeliver`` a run of deliveries that never left."""
        for ref in refs:
            self.undeliver(ref)

    def expire(self, now: float, limit: int | None = None) -> int:
        """Requeue the deliveries whose ack timeout has passed, earliest first and at most ``limit`` (the
        rest the next time: ``next_deadline`` is then already due); returns how many."""
        expired = self._s.inflight.pop_expired(now, limit)
        for delivery in expired:
            self._ready_of(delivery.ref[0]).inflight -= 1
            self._s.timed_out(delivery)  # (its copy may still sit in a pipe that is not read)
            self._requeue(delivery.ref)
        self._counters.expired += len(expired)
        return len(expired)

    def consumer_gone(self, consumer: Hashable) -> int:
        """Requeue everything ``consumer`` held, at once; returns how many. Its copies go with it where
        it paid for them (its connection closed); where another payer did (an MQKS connection whose
        consumer was cancelled), they stay charged to that payer until its answer or its end."""
        held = self._s.inflight.remove_consumer(consumer)
        for delivery in held:
            self._ready_of(delivery.ref[0]).inflight -= 1
            if delivery.payer == consumer:
                self._s.remember_late(delivery.ref, consumer)
            else:
                self._s.timed_out(delivery)
            self._requeue(delivery.ref)
        self._s.payer_gone(consumer)
        return len(held)

    def take_back(self, ref: Ref, *, by: Hashable) -> bool:
        """Requeue a delivery ``by`` holds before its deadline (consumers holding too much together);
        as after an ack timeout, a late ack from ``by`` still counts."""
        delivery = self._s.inflight.get(ref)
        if delivery is None or delivery.consumer != by:
            return False
        self._settle(ref, by)
        self._s.timed_out(delivery)  # (taken back, not read: its copy may still be in the pipe)
        self._requeue(ref)
        self._counters.expired += 1
        return True

    def take_back_many(self, refs: Iterable[Ref], *, by: Hashable = None) -> int:
        """A run of deliveries goes back to their queues; returns how many. ``by`` took them (they may sit
        in its pipe: ``take_back``, its copies stay charged, its late ack counts); None: they never left
        (``undeliver``: uncounted, nothing charged)."""
        if by is None:
            return sum(map(self.undeliver, refs))
        return sum(self.take_back(ref, by=by) for ref in refs)

    def next_deadline(self) -> float | None:
        return self._s.inflight.next_deadline()
