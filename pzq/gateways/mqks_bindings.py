"""MQKS bindings: which events each queue is bound to, in memory and in the store's ``mqks`` table.

The gateway (gateways/mqks.py) routes every publish through ``queues_for``; this index keeps the
events of every queue together under ``Limits.mqks_max_bindings`` and each queue's under
``Limits.mqks_max_events``, so that a publish's match stays cheap whoever bound what.

A change of many events is indexed a slice at a time (``INDEX_STEP`` events: ``index``, driven by the
request's job in gateways/mqks_requests.py, its answer after the last): replacing 10,000 events of a
queue among 300,000 bound cost 8-20 ms of dict operations in one request. Meanwhile the queue's binding
(``get``) is already the new one, and each event routes to it as the old binding or the new one says,
whichever its slice made it (a publish meanwhile is as if made before or after the change, event by
event); a change of the same queue meanwhile finishes the earlier one's slices first.

A million bindings stay in memory, so they are kept in what CPython's garbage collector does not walk:
strings, tuples of strings and dicts holding only those (a set per event made 880,000 containers, and
the collector's whole walk a turn of 200-260 ms). An event bound to one queue maps to that queue's name,
to several to a tuple of their names; each queue's events are a sorted tuple.
"""

from __future__ import annotations

import bisect
import builtins
import itertools
from collections.abc import Iterable

from pzq.config import ClientShares, Limits
from pzq.errors import ProtocolError
from pzq.store.bindings import Binding, Bindings

SMALL_CHANGE = 64  # events added or removed that are put in place in the sorted list, not sorted again
INDEX_STEP = 2_000  # events indexed or unindexed in one slice (a change of 10,000 events: ten slices)


class BindingIndex:
    """Every MQKS queue's binding, by queue and by event; written through to its store table."""

    def __init__(self, table: Bindings, limits: Limits):
        self.table = table
        self.limits = limits
        # Each connection's share of mqks_max_bindings: the events it added (less those it removed)
        self.shares = ClientShares(limits.mqks_max_bindings, limits)
        self.load()

    def load(self) -> None:
        """Read the bindings: at start-up and after a rolled-back turn (which forgets who added what)."""
        self.shares.held.clear()
        self.bindings: dict[str, Binding] = {}
        # event -> the one queue bound to it, or a tuple of the queues (see the module's docstring)
        self.by_event: dict[str, str | tuple[str, ...]] = {}
        self.bound_total = 0  # events of every binding together
        # queue -> its events not unindexed or indexed yet, INDEX_STEP of them a string (joined by spaces,
        # which no event has): strings, not lists of thousands, for the garbage collector to pass over
        self._pending: dict[str, tuple[list[str], list[str]]] = {}
        for queue, binding in self.table.items():
            self.set(queue, binding, save=False)

    def __contains__(self, queue: str) -> bool:
        return queue in self.bindings

    def __len__(self) -> int:
        return len(self.bindings)

    def get(self, queue: str) -> Binding | None:
        return self.bindings.get(queue)

    def queues_for(self, event: str) -> tuple[str, ...]:
        """The queues a publish of ``event`` goes to (empty when none is bound to it)."""
        queues = self.by_event.get(event, ())
        return (queues,) if isinstance(queues, str) else queues

    def unused(self) -> list[str]:
        """Queues that are deleted after a while without a consumer (--delete-queue-when-unused)."""
        return [q for q, b in self.bindings.items() if b.unused is not None]

    def set(self, queue: str, binding: Binding, *, save: bool) -> bool:
        """Make ``binding`` the queue's; True if its set of events changed. A change of a few events
        edits the sorted list in place: sorting 10,000 events again costs milliseconds, a rebind that
        adds or removes one should not."""
        after = set(binding.events)
        most = self.limits.mqks_max_events
        if save and len(after) > most:
            raise ProtocolError("too-many-events", f"queue {queue!r} would have {len(after)} events; at most {most}")
        old = self.bindings.get(queue)
        before = set(old.events) if old is not None else set()
        added, gone = after - before, before - after
        changed = bool(added or gone)
        if old is not None and len(added) + len(gone) <= SMALL_CHANGE:
            events = list(old.events)
            for event in gone:
                del events[bisect.bisect_left(events, event)]
            for event in added:
                bisect.insort(events, event)
            binding.events = tuple(events)
        else:  # (in the order given, each once: a list sent sorted is sorted again in linear time)
            binding.events = tuple(sorted(dict.fromkeys(binding.events)))
        if changed:  # only the difference touches the index: a rebind to the same events costs no more
            self.finish(queue)  # (an earlier change of it still being indexed: its slices first)
            if not save or len(added) + len(gone) <= INDEX_STEP:  # (loading: at once)
                self._unbind(queue, gone)
                self._bind(queue, added)
            else:
                self._pending[queue] = (_slices(gone), _slices(added))
            self.bound_total += len(added) - len(gone)
        self.bindings[queue] = binding
        if save and (old is None or changed or old.unused != binding.unused):
            self.table.put(queue, binding)
        return changed

    def indexing(self, queue: str) -> bool:
        """True while a change of ``queue``'s events is not all in the index yet."""
        return queue in self._pending

    def index(self, queue: str, most: int = INDEX_STEP) -> bool:
        """Index about ``most`` more events of ``queue``'s change (a slice at least; those it lost first);
        True once all are."""
        pending = self._pending.get(queue)
        while pending is not None and most > 0:
            gone, added = pending
            if gone:
                events = gone.pop().split(" ")
                self._unbind(queue, events)
            else:
                events = added.pop().split(" ")
                self._bind(queue, set(events))
            most -= len(events)
            if not gone and not added:
                del self._pending[queue]
                pending = None
        return queue not in self._pending

    def finish(self, queue: str) -> None:
        """Index what is left of ``queue``'s change at once."""
        while not self.index(queue, 1 << 30):
            pass

    def remove(self, queue: str) -> None:
        """Forget the queue's binding, in memory and on disk."""
        self.finish(queue)
        binding = self.bindings.pop(queue, None)
        if binding is not None:
            self._unbind(queue, binding.events)
            self.bound_total -= len(binding.events)
        self.table.delete(queue)

    def _bind(self, queue: str, events: frozenset[str] | builtins.set[str]) -> None:
        """Index ``events`` (none of them bound to ``queue`` yet) under ``queue``: those no queue has at
        C speed, the others each as a tuple one name longer (a copy of the event's, never a container)."""
        by_event = self.by_event
        shared = events & by_event.keys()
        for event in shared:
            queues = by_event[event]
            by_event[event] = (queues, queue) if isinstance(queues, str) else (*queues, queue)
        by_event.update(dict.fromkeys(events - shared if shared else events, queue))

    def _unbind(self, queue: str, events: Iterable[str]) -> None:
        by_event = self.by_event
        get = by_event.get
        for event in events:
            queues = get(event)
            if queues == queue:  # (bound to this queue alone: the usual case)
                del by_event[event]
            elif queues is not None and not isinstance(queues, str):
                left = tuple(q for q in queues if q != queue)
                by_event[event] = left[0] if len(left) == 1 else left

    def room_for_events(self, queue: str, events: list[str], conn: bytes | None = None) -> int:
        """Bindings of every queue together stay under the limit (each is matched on every publish), and
        what connection ``conn`` added under its share (``ClientShares``). Returns the growth, which the
        caller adds to the connection's share once the binding is set (``took``)."""
        old = self.bindings.get(queue)
        growth = len(set(events)) - (len(old.events) if old else 0)
        total = self.bound_total + growth
        most = self.limits.mqks_max_bindings
        if total > most:
            raise ProtocolError("too-many-bindings", f"{total} bindings of all queues together; at most {most}")
        if growth > 0 and conn is not None:
            reason = self.shares.refusal(conn, self.bound_total, growth)
            if reason is not None:
                raise ProtocolError("too-many-bindings", f"no more bindings for this connection: {reason}")
        return growth

    def took(self, conn: bytes, growth: int) -> None:
        """``conn`` added ``growth`` bindings (or removed, if negative)."""
        self.shares.add(conn, growth)

    def check_sizes(self, a: dict) -> None:
        """Refuse an oversized consume or rebind before any work is done for it."""
        most = self.limits.mqks_max_events
        for name in ("events", "remove", "add"):
            if len(a.get(name) or ()) > most:
                raise ProtocolError("too-many-events", f"{len(a[name])} events in one request; at most {most}")
        masks = self.limits.mqks_max_masks
        if len(a.get("remove_mask") or ()) > masks:
            raise ProtocolError("too-many-masks", f"{len(a['remove_mask'])} masks in one request; at most {masks}")


def _slices(events: builtins.set[str]) -> list[str]:
    """``events`` as strings of ``INDEX_STEP`` of them each, joined by spaces (see ``_pending``)."""
    it = iter(events)
    return [" ".join(chunk) for chunk in iter(lambda: list(itertools.islice(it, INDEX_STEP)), [])]


def with_added(events: list[str], added: list[str]) -> list[str]:
    """``events`` then each of ``added`` not among them, in order."""
    if not added:
        return events
    present = set(events)
    out = list(events)
    for event in added:
        if event not in present:
            present.add(event)
            out.append(event)
    return out


def check_bind_line(line: bytes, limits: Limits) -> None:
    """A consume or rebind line over ``Limits.mqks_bind_line_bytes`` is refused before it is parsed:
    parsing and checking its events costs about 10 ms a MiB, which no turn can give one request.
    (Its action is read from the line's head: an id is at most 255 bytes.)"""
    most = limits.mqks_bind_line_bytes
    if len(line) > most and line[:300].split(b" ", 2)[1:2] in ([b"consume"], [b"rebind"]):
        raise ProtocolError(
            "line-too-long",
            f"a consume or rebind line of {len(line)} bytes is over {most}: bind more events with --add "
            "in several requests",
        )
