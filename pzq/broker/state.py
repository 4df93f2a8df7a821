"""The broker's state and the rules its parts share: where each queue's next ready message is, who
holds what, the late-answer memory, the readiness count, and the dead-letter and limit checks.

Readiness without scans: a queue's never-delivered messages are found by a disk cursor (the next seq to
read, moving only forward), and messages that come back (nack, ack timeout, a consumer that left) wait
in a small heap of seqs that is served first, so a queue stays FIFO across redeliveries. Both are
bounded by what is in flight, not by what is stored.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
from collections.abc import Hashable, Sequence

from pzq.broker.accounts import DeliveryAccounts, Stale
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.held_ranges import HeldRanges
from pzq.inflight import InFlight
from pzq.logs import EventTally
from pzq.store import Message, Store

log = logging.getLogger("pzq.broker")

Ref = tuple[int, int]  # (queue id, seq): names a message across the store and the in-flight table


def continues(run: Sequence[int], seq: int, deliveries: int) -> bool:
    """True if a message (``seq``, ``deliveries``) extends a lease run ``[first seq, count, deliveries]``:
    the next seq, with the same delivery count."""
    return run[0] + run[1] == seq and run[2] == deliveries


@dataclasses.dataclass
class _Ready:
    """Where a queue's next ready message is."""

    cursor: int = 0
    requeued: list[int] = dataclasses.field(default_factory=list)
    inflight: int = 0


@dataclasses.dataclass(frozen=True)
class Exclusive:
    """A holder whose messages only it may settle (a consumer group's durable lease): acks, nacks,
    requeues and dead-letters naming them from anyone else are refused."""

    name: str


@dataclasses.dataclass
class Counters:
    """Figures since start, for the monitor."""

    produced: int = 0
    delivered: int = 0  # handed to a consumer or leased by a group (the console's delivery rate)
    acked: int = 0
    nacked: int = 0
    expired: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    refused_full: int = 0
    refused_not_held: int = 0  # settle requests naming a message the client did not hold


class BrokerState:
    """What every part of the Broker reads and keeps; single-threaded, driven by the server loop."""

    def __init__(self, store: Store, *, ack_timeout_s: float, max_deliveries: int = 0, limits: Limits = DEFAULT_LIMITS):
        self.store = store
        self.ack_timeout_s = ack_timeout_s
        self.max_deliveries = max_deliveries
        # Deliveries that timed out (or whose consumer left) and whose holder may still settle them
        # late: the last holder of each, for ``limits.late_memory`` messages at most. Older ones are
        # forgotten: that holder's late answer is then refused and the message is simply delivered
        # again (at-least-once).
        self.late_memory = limits.late_memory
        self.rollback_acks_kept = limits.rollback_acks_kept
        self.take_skips = limits.take_skips
        self.cut_short = False  # the last _next_ready stopped at take_skips stale seqs
        self.inflight: InFlight[Ref] = InFlight()
        self.counters = Counters()
        self.per_queue: dict[str, collections.Counter] = {}  # queue -> produced / acked / redelivered
        self.events = EventTally(log, limits.event_log_s, limits.event_log_queues)  # (dead letters)
        self._ready: dict[int, _Ready] = {}
        self._held: dict[int, HeldRanges] = {}  # qid -> ranges leased by consumer groups
        # (each with the record its stale copy's bytes are charged to, and their size: accounts.py)
        self._late: collections.OrderedDict[Ref, tuple[Hashable, Stale | None, int]] = collections.OrderedDict()
        # The byte account of deliveries: every body handed out is charged to its payer until it is known
        # to be gone, and a payer past its share is handed nothing more (pzq/broker/accounts.py)
        self.accounts = DeliveryAccounts(limits)
        # Grows whenever messages may have become ready (produced, requeued by a nack, an ack timeout, a
        # consumer gone, a take-back or a delivery that never left, released by a lease, moved to the
        # end, dead letters requeued, every delivery forgotten). A gateway that found nothing to take
        # remembers it and looks again only once it has changed: nobody has to be told by name.
        self.readiness = 0
        # Holders whose deliveries outlive a rolled-back turn (their gateway keeps no state of its own
        # that the rollback would undo: the native send socket). Their deliveries of earlier turns left
        # and stay in flight; their acks since the last commit are done again (``_unwritten``), since
        # their consumer was told nothing and will not ack again.
        self.keep_on_rollback: set[Hashable] = set()
        self._unwritten: dict[Ref, None] = {}  # acks by those holders since the last commit, in order
        self._redo = False  # a rollback undid them: done again as the next turn begins

    def _state(self, qid: int) -> _Ready:
        state = self._ready.get(qid)
        if state is None:
            state = self._ready[qid] = _Ready()
        return state

    def reset(self) -> None:
        """Forget every delivery, as a restart does: whatever was in flight is ready again."""
        self.inflight = InFlight()
        self.accounts.reset()
        self._ready.clear()
        self._held.clear()
        self._late.clear()
        self._unwritten.clear()
        self._redo = False
        self.readiness += 1

    def turn_begins(self) -> None:
        """A turn begins: what it changes in flight can be undone (``rolled_back``). Acks that a rolled
        back turn took back are done again first (within this turn: a failing store fails it too)."""
        self.inflight.mark()
        if self._redo:
            self._redo = False
            for ref in self._unwritten:
                self._settle(ref)
                info = self.store.queue_by_id(ref[0])
                if info is not None:
                    self.store.delete(info.name, ref[1])

    def committed(self) -> None:
        """A commit made every ack so far durable."""
        self._unwritten.clear()

    def rolled_back(self) -> None:
        """The store dropped what was written since its last commit: undo only this turn's work. Every
        delivery of an earlier turn to a ``keep_on_rollback`` holder left, and stays in flight (else a
        failing commit would deliver everything in flight again each turn: 41 deliveries a message,
        measured on a full disk); other holders' deliveries are forgotten, as on a restart, since their
        gateways forget theirs. Readiness is found again from the store and what is in flight."""
        self.inflight.undo()
        keep = self.keep_on_rollback
        for ref in [ref for ref, holder in self.inflight.holders() if holder not in keep]:
            self.inflight.remove(ref)
        self._ready.clear()
        for ref, _ in self.inflight.holders():
            self._state(ref[0]).inflight += 1
        self._held.clear()  # (the leases are read again from the disk)
        self._redo = bool(self._unwritten)
        self.readiness += 1

    def _count(self, queue: str, what: str, n: int = 1) -> None:
        counts = self.per_queue.get(queue)
        if counts is None:
            counts = self.per_queue[queue] = collections.Counter()
        counts[what] += n

    def _past_limits(self, expires_us: int, cap: int, deliveries: int, now_us: int) -> str | None:
        """Why a message goes to the dead letters instead of a consumer: its TTL passed, or it was
        delivered as often as its own cap (or --max-deliveries) allows; None if it may go out."""
        if expires_us and expires_us <= now_us:
            return "expired"
        cap = cap or self.max_deliveries
        return "max-deliveries" if cap and deliveries >= cap else None

    def _dead_letter(self, message: Message, reason: str, now_us: int) -> None:
        if self.store.dead_letters.add(message, reason, now_us=now_us):
            self.counters.dead_lettered += 1
            # one INFO line per queue per interval (the server's tick flushes it), each message at DEBUG
            self.events.add(message.queue, f"dead-lettered ({reason})")
            log.debug(
                "message %s of queue %r moved to the dead letters: %s (deliveries %d)",
                message.id,
                message.queue,
                reason,
                message.deliveries,
            )

    def _cursor_limit(self, state: _Ready, held: HeldRanges | None, n: int) -> int | None:
        """How many records to read from the cursor (never into a held range); None if the cursor
        stood in one and jumped past it."""
        if held:
            span = held.span_of(state.cursor)
            if span is not None:
                state.cursor = span[1]
                return None
            start = held.next_start(state.cursor)
            if start is not None:  # (a bound: seqs are never reused, so no more records lie before it)
                return min(n, start - state.cursor)
        return n

    def _next_ready(
        self, queue: str, qid: int, state: _Ready, n: int, cursor: bool = True, max_bytes: int | None = None
    ) -> list[Message]:
        """Up to ``n`` ready messages: those that came back first, then the cursor's. ``cut_short`` is set
        when it stopped after ``limits.take_skips`` stale seqs of the heap (the caller stops there: the
        rest is the next call's; readiness is raised so that nobody takes "nothing found" for "none").
        With ``max_bytes``, it stops once their bodies reach it (see Store.scan)."""
        out: list[Message] = []
        size, most = 0, (1 << 62) if max_bytes is None else max_bytes
        held = self._held.get(qid) or None  # (None when it holds no range: the hot path stays as it was)
        self.cut_short = False
        skips = self.take_skips
        while state.requeued and len(out) < n and size < most:
            seq = heapq.heappop(state.requeued)
            # At or past the cursor (held since start-up, not yet scanned), the cursor will find it.
            if (qid, seq) in self.inflight or seq >= state.cursor or (held and held.holder_of(seq) is not None):
                message = None
            else:
                message = self.store.get(queue, seq)
            if message is not None:  # else acked late or dead-lettered while it waited
                out.append(message)
                if max_bytes is not None:
                    size += sum(map(len, message.frames))
                continue
            # A consumer that acks every delivery late leaves thousands of stale seqs here (taken back,
            # then acked): a take passes over a bounded number of them, 17 ms for 97 deliveries before
            skips -= 1
            if skips <= 0 and state.requeued:
                self.cut_short = True
                self.readiness += 1
                return out
        # Scan on past messages that are all in flight, or a consumer would see "nothing ready" while
        # ready messages wait behind them; held ranges are jumped, not read.
        while cursor and len(out) < n and size < most:
            limit = self._cursor_limit(state, held, n - len(out))
            if limit is None:
                continue
            fresh = self.store.scan(queue, state.cursor, limit, None if max_bytes is None else most - size)
            if not fresh:
                break
            state.cursor = fresh[-1].seq + 1
            if held:
                out.extend(m for m in fresh if (qid, m.seq) not in self.inflight and held.holder_of(m.seq) is None)
            else:
                out.extend(m for m in fresh if (qid, m.seq) not in self.inflight)
            if max_bytes is not None:
                size += sum(len(f) for m in fresh for f in m.frames)
        return out

    def _remember_late(self, ref: Ref, holder: Hashable, stale: Stale | None = None, size: int = 0) -> None:
        """``holder``'s delivery of ``ref`` ended without an answer (a timeout, a take-back, it left): its
        late answer still counts, and settles the ``size`` bytes of the copy still charged in ``stale``.
        (Past ``late_memory`` the oldest is forgotten; its stale bytes stay charged until its payer goes.)"""
        late = self._late
        late[ref] = (holder, stale, size)
        late.move_to_end(ref)
        if len(late) > self.late_memory:
            late.popitem(last=False)

    def _timed_out(self, delivery) -> None:
        """A delivery that may still sit unread in its payer's pipe goes back: its copy stays charged
        until a late answer or the payer's end, and its holder may still answer late."""
        stale = self.accounts.stale(delivery.payer, delivery.size)
        self._remember_late(delivery.ref, delivery.consumer, stale, delivery.size)

    def _settle(self, ref: Ref, by: Hashable = None):
        late = self._late.pop(ref, None)
        # (only its late holder's answer shows the stale copy read: settled by another holder of the
        # message, that copy may still sit in the late one's pipe, charged until its payer's end)
        if late is not None and late[1] is not None and late[0] == by:
            self.accounts.settled_late(late[1], late[2])
        delivery = self.inflight.remove(ref)
        if delivery is not None:
            self._state(ref[0]).inflight -= 1
            if delivery.size and self.accounts.released(delivery.payer, self.inflight):
                self.readiness += 1
        return delivery

    def payer_gone(self, payer: Hashable) -> None:
        """``payer``'s connection closed: whatever of its deliveries' copies was still charged is gone
        with it (its deliveries in flight go back through ``consumer_gone``, their holder's end)."""
        self.accounts.gone(payer)
        if self.accounts.released(payer, self.inflight):
            self.readiness += 1

    def discharged(self, payer: Hashable, record: Stale, size: int) -> None:
        """libzmq freed ``size`` bytes charged to ``payer`` outside the deliveries (``accounts.charge``)."""
        if self.accounts.discharge(payer, record, size, self.inflight):
            self.readiness += 1

    def piped(self, payer: Hashable, size: int) -> None:
        """``size`` bytes other than a delivery's body (replies, notices, an auto-ack delivery gone from
        the store) were handed to libzmq for ``payer``: charged until its peer has them (accounts.py)."""
        self.accounts.hold(payer, size)

    def unpiped(self, payer: Hashable, size: int) -> None:
        """``payer``'s peer's TCP acknowledged ``size`` of its piped bytes."""
        if self.accounts.let_go(payer, size, self.inflight):
            self.readiness += 1

    def _requeue(self, ref: Ref) -> None:
        heapq.heappush(self._state(ref[0]).requeued, ref[1])
        self.readiness += 1
