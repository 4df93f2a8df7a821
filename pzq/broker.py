"""Queue semantics shared by every protocol: produce, hand out, acknowledge, requeue, expire.

The Broker sits between the protocol machines and the store. It owns what is in flight and where each
queue's next ready message is, and it never touches a socket: the server asks it for messages to send
and tells it what came back. Times are passed in (``now`` monotonic seconds, ``now_us`` wall-clock
microseconds), so every timing rule is testable without sleeping.

Readiness without scans: a queue's never-delivered messages are found by a disk cursor (the next seq to
read, moving only forward), and messages that come back (nack, ack timeout, a consumer that left) wait
in a small heap of seqs that is served first, so a queue stays FIFO across redeliveries. Both are
bounded by what is in flight, not by what is stored.

Consumer groups hold messages by range (``take_ranges``): one entry per run of consecutive seqs, not
one in-flight entry per message, so a lease of a million messages costs a few entries. The cursor
jumps over held ranges, and a released range rewinds it, so those messages are found again in order.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import math
from collections.abc import Hashable, Sequence

from pzq.errors import StoreFull
from pzq.held_ranges import HeldRanges
from pzq.inflight import InFlight
from pzq.store import Message, QueueInfo, Store

log = logging.getLogger("pzq.broker")
_NOBODY = object()

Ref = tuple[int, int]  # (queue id, seq): names a message across the store and the in-flight table


def continues(run: Sequence[int], seq: int, deliveries: int) -> bool:
    """True if a message (``seq``, ``deliveries``) extends a lease run ``[first seq, count, deliveries]``:
    the next seq, with the same delivery count."""
    return run[0] + run[1] == seq and run[2] == deliveries


# Deliveries that timed out (or whose consumer left) and whose holder may still settle them late: the
# last holder of each, for this many messages at most. Older ones are forgotten: that holder's late
# answer is then refused and the message is simply delivered again (at-least-once).
LATE_MEMORY = 50_000


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


class Broker:
    """The queue rules on top of a Store; single-threaded, driven by the server loop."""

    def __init__(self, store: Store, *, ack_timeout_s: float, max_deliveries: int = 0):
        self.store = store
        self.ack_timeout_s = ack_timeout_s
        self.max_deliveries = max_deliveries
        self.inflight: InFlight[Ref] = InFlight()
        self.counters = Counters()
        self.per_queue: dict[str, collections.Counter] = {}  # queue -> produced / acked / redelivered
        self._ready: dict[int, _Ready] = {}
        self._held: dict[int, HeldRanges] = {}  # qid -> ranges leased by consumer groups
        store.on_set_aside.append(self._set_aside)
        self._late: collections.OrderedDict[Ref, Hashable] = collections.OrderedDict()

    def _state(self, qid: int) -> _Ready:
        state = self._ready.get(qid)
        if state is None:
            state = self._ready[qid] = _Ready()
        return state

    def reset(self) -> None:
        """Forget every delivery, as a restart does: whatever was in flight is ready again."""
        self.inflight = InFlight()
        self._ready.clear()
        self._held.clear()
        self._late.clear()

    # -- producing --------------------------------------------------------------------------------

    def produce(
        self, queue: str, body: Sequence[bytes], *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Store a message (durable at the next commit). Raises StoreFull when there is no room."""
        try:
            message = self.store.put(queue, body, now_us=now_us, expires_us=expires_us, meta=meta)
        except StoreFull:
            self.counters.refused_full += 1
            raise
        self.counters.produced += 1
        self._count(queue, "produced")
        return message

    def produce_many(self, queue: str, bodies: Sequence[Sequence[bytes]], *, now_us: int) -> int:
        """Store messages in one go (see Store.put_many): how many, from the first, were stored; the
        rest were refused for room."""
        try:
            stored = self.store.put_many(queue, bodies, now_us=now_us)
        except StoreFull:
            stored = 0
        self.counters.refused_full += len(bodies) - stored
        if stored:
            self.counters.produced += stored
            self._count(queue, "produced", stored)
        return stored

    def produce_all(
        self, items: Sequence[tuple[str, Sequence[bytes]]], *, now_us: int, meta: dict | None = None
    ) -> list[Message]:
        """Store every ``(queue, body)`` or none: on StoreFull what this call stored is deleted again,
        so that a client's retry of a refused batch (or fan-out) stores no duplicates."""
        stored: list[Message] = []
        try:
            for queue, body in items:
                stored.append(self.produce(queue, body, now_us=now_us, meta=meta))
        except StoreFull:
            for message in stored:
                self.store.delete(message.queue, message.seq)
                self.per_queue[message.queue]["produced"] -= 1
            self.counters.produced -= len(stored)
            raise
        return stored

    # -- handing out ------------------------------------------------------------------------------

    def has_ready(self, queue: str) -> bool:
        return self.ready_count(queue) > 0

    def ready_count(self, queue: str) -> int:
        """Stored messages of ``queue`` not in flight (some may turn out expired when taken)."""
        info = self.store.queue(queue, create=False)
        if info is None:
            return 0
        return info.count - self._state(info.qid).inflight

    def take(
        self, queue: str, n: int, consumer: Hashable, *, now: float, now_us: int, timeout_s: float | None = None
    ) -> list[Message]:
        """Hand up to ``n`` ready messages of ``queue`` to ``consumer``, oldest first.

        Each is counted as delivered (durably, with the next commit) and tracked in flight until
        ``now + timeout_s``. Messages past their TTL or their delivery cap go to the dead letters.
        """
        info = self.store.queue(queue, create=False)
        if info is None or n <= 0:
            return []
        state = self._state(info.qid)
        deadline = now + (self.ack_timeout_s if timeout_s is None else timeout_s)
        out: list[Message] = []
        while len(out) < n:
            batch = self._next_ready(queue, info.qid, state, n - len(out))
            if not batch:
                break
            for message in batch:
                cap = (message.meta or {}).get("max_deliveries") or 0
                reason = self._past_limits(message.expires_us, cap, message.deliveries, now_us)
                if reason:
                    self._dead_letter(message, reason, now_us)
                    continue
                deliveries = self.store.mark_delivered(queue, message.seq, current=message.deliveries)
                if deliveries > 1:
                    self.counters.redelivered += 1
                    self._count(queue, "redelivered")
                self.inflight.add((message.qid, message.seq), deadline, consumer)
                state.inflight += 1
                message.deliveries = deliveries
                out.append(message)
        self.counters.delivered += len(out)
        return out

    def _past_limits(self, expires_us: int, cap: int, deliveries: int, now_us: int) -> str | None:
        """Why a message goes to the dead letters instead of a consumer: its TTL passed, or it was
        delivered as often as its own cap (or --max-deliveries) allows; None if it may go out."""
        if expires_us and expires_us <= now_us:
            return "expired"
        cap = cap or self.max_deliveries
        return "max-deliveries" if cap and deliveries >= cap else None

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

    def _next_ready(self, queue: str, qid: int, state: _Ready, n: int, cursor: bool = True) -> list[Message]:
        out: list[Message] = []
        held = self._held.get(qid) or None  # (None when it holds no range: the hot path stays as it was)
        while state.requeued and len(out) < n:
            seq = heapq.heappop(state.requeued)
            # At or past the cursor (held since start-up, not yet scanned), the cursor will find it.
            if (qid, seq) in self.inflight or seq >= state.cursor or (held and held.holder_of(seq) is not None):
                continue
            message = self.store.get(queue, seq)
            if message is not None:  # else acked late or dead-lettered while it waited
                out.append(message)
        # Scan on past messages that are all in flight, or a consumer would see "nothing ready" while
        # ready messages wait behind them; held ranges are jumped, not read.
        while cursor and len(out) < n:
            limit = self._cursor_limit(state, held, n - len(out))
            if limit is None:
                continue
            fresh = self.store.scan(queue, state.cursor, limit)
            if not fresh:
                break
            state.cursor = fresh[-1].seq + 1
            if held:
                out.extend(m for m in fresh if (qid, m.seq) not in self.inflight and held.holder_of(m.seq) is None)
            else:
                out.extend(m for m in fresh if (qid, m.seq) not in self.inflight)
        return out

    # -- ranges held by consumer groups -----------------------------------------------------------

    def take_ranges(self, queue: str, n: int, holder: Exclusive, *, now_us: int) -> list[tuple[int, int, int]]:
        """Hold up to ``n`` ready messages of ``queue`` for ``holder`` (a consumer group), oldest first,
        as runs ``(first seq, count, deliveries)``: consecutive seqs with the same delivery count,
        this delivery included. Nothing is written per message: the group records the runs, and the
        counts are raised in the store only if the messages come back (``release_range``). Messages
        past their TTL or their delivery cap go to the dead letters, as with ``take``."""
        info = self.store.queue(queue, create=False)
        if info is None or n <= 0:
            return []
        state = self._state(info.qid)
        runs: list[list[int]] = []
        taken = 0

        def lease(seq: int, expires_us: int, cap: int, deliveries: int) -> None:
            nonlocal taken
            reason = self._past_limits(expires_us, cap, deliveries, now_us)
            if reason:
                message = self.store.get(queue, seq)  # (rare: read whole to move it)
                if message is not None:
                    self._dead_letter(message, reason, now_us)
                return
            deliveries += 1
            if deliveries > 1:
                self.counters.redelivered += 1
                self._count(queue, "redelivered")
            if runs and continues(runs[-1], seq, deliveries):
                runs[-1][1] += 1
            else:
                runs.append([seq, 1, deliveries])
            taken += 1

        # Messages that came back first (few: read whole), then the cursor's, by their headers only.
        while state.requeued and taken < n:
            batch = self._next_ready(queue, info.qid, state, n - taken, cursor=False)
            if not batch:
                break
            for m in batch:
                cap = (m.meta or {}).get("max_deliveries") or 0
                lease(m.seq, m.expires_us, cap if type(cap) is int else 0, m.deliveries)
        held = self._held.get(info.qid) or None
        inflight = self.inflight
        while taken < n:
            limit = self._cursor_limit(state, held, n - taken)
            if limit is None:
                continue  # (the cursor jumped a held range)
            rows = self.store.headers(queue, state.cursor, limit)
            if not rows:
                break
            state.cursor = rows[-1][0] + 1
            for row in rows:
                if (info.qid, row[0]) in inflight or (held and held.holder_of(row[0]) is not None):
                    continue
                lease(*row)
        self.counters.delivered += taken
        # (A message is read once: the cursor has passed it, or it left the requeued heap.)
        for lo, count, _ in runs:
            self.hold_range(info.qid, lo, lo + count, holder)
        return [(lo, count, deliveries) for lo, count, deliveries in runs]

    def hold_range(self, qid: int, lo: int, hi: int, holder: Exclusive, stored: int | None = None) -> None:
        """Keep seqs ``lo .. hi-1`` of queue ``qid`` away from every other consumer (a group's lease,
        also when re-registered after a restart: then ``stored`` says how many of them are stored);
        the caller makes sure no other holder has them."""
        held = self._held.get(qid)
        if held is None:
            held = self._held[qid] = HeldRanges()
        held.add(lo, hi, holder)
        self._state(qid).inflight += hi - lo if stored is None else stored

    def release_range(self, qid: int, lo: int, hi: int, holder: Exclusive, *, deliveries: int | None = None) -> int:
        """Give ``holder``'s seqs ``lo .. hi-1`` back to their queue (only what ``holder`` holds, within
        one range): with ``deliveries``, their delivery count is written as that (durable with this
        turn); without, they were never handed out (a lease cut short). The cursor rewinds to find
        them in order. Returns how many stored messages went back."""
        held = self._held.get(qid)
        info = self.store.queue_by_id(qid)
        span = None if held is None else held.span_of(lo)
        if held is None or info is None or span is None or span[2] != holder:
            return 0
        hi = min(hi, span[1])
        seqs = self.store.seqs_in(info.name, lo, hi, hi - lo)
        if deliveries is not None:
            self.store.set_delivered(info.name, seqs, deliveries)
            self.counters.expired += len(seqs)
        held.remove(lo, hi, holder)
        state = self._state(qid)
        state.inflight -= len(seqs)
        state.cursor = min(state.cursor, lo)
        return len(seqs)

    def ack_range(self, qid: int, lo: int, hi: int, holder: Exclusive, limit: int) -> tuple[int, int]:
        """Delete (acknowledge) at most ``limit`` of the messages ``holder`` holds from ``lo`` to
        ``hi - 1`` and stop holding what was walked; returns (deleted, where the walk stopped: ``hi``
        once done). Seqs ``holder`` does not hold are never deleted: the walk skips them."""
        held = self._held.get(qid)
        info = self.store.queue_by_id(qid)
        span = None if held is None else held.span_of(lo)
        if held is None or info is None or span is None or span[2] != holder:
            return 0, hi
        deleted, at = self.store.delete_range(info.name, lo, min(hi, span[1]), limit)
        held.remove(lo, at, holder)
        self._state(qid).inflight -= deleted
        if deleted:
            self.counters.acked += deleted
            self._count(info.name, "acked", deleted)
        return deleted, at  # (at the range's end if it ends before hi: the rest is not holder's)

    def _set_aside(self, qid: int, seq: int) -> None:
        # A held message found unreadable is no longer stored: it no longer counts as held either, or
        # the queue would look empty of ready messages while one waits.
        held = self._held.get(qid)
        if held and held.holder_of(seq) is not None:
            self._state(qid).inflight -= 1

    def range_free(self, qid: int, lo: int, hi: int) -> bool:
        """True if no group holds any seq of ``lo .. hi-1`` of queue ``qid``."""
        held = self._held.get(qid)
        if not held:
            return True
        start = held.next_start(lo)
        return held.span_of(lo) is None and (start is None or start >= hi)

    def holder_of(self, ref: Ref) -> Hashable | None:
        """Who holds ``ref``: a group holding its range, or the consumer it is in flight to."""
        held = self._held.get(ref[0])
        if held:
            holder = held.holder_of(ref[1])
            if holder is not None:
                return holder
        delivery = self.inflight.get(ref)
        return None if delivery is None else delivery.consumer

    def held_ranges(self, qid: int) -> HeldRanges | None:
        return self._held.get(qid)

    def hold(self, ref: Ref, consumer: Hashable) -> None:
        """Keep a stored message away from every consumer until ``consumer`` settles it (a durable
        lease re-registered after a restart). It has no deadline here: its holder decides."""
        if ref not in self.inflight:
            self._state(ref[0]).inflight += 1
        self.inflight.add(ref, math.inf, consumer)

    def held_by_others(self, qid: int, ours) -> bool:
        """True if a message of queue ``qid`` is in flight to (or leased by) a holder for which
        ``ours(holder)`` is false (a scan of what is in flight: for rare requests)."""
        if self._held.get(qid):
            return True  # (a group's range: groups are nobody's but their own)
        return any(
            ref[0] == qid and not (isinstance(holder, tuple) and ours(holder))
            for ref, holder in self.inflight.holders()
        )

    def drop_queue(self, queue: str) -> int:
        """Delete a queue and everything in it, in flight included; returns how many messages went."""
        info = self.store.queue(queue, create=False)
        if info is None:
            return 0
        self.inflight.remove_matching(lambda ref: ref[0] == info.qid)
        self._held.pop(info.qid, None)
        for ref in [r for r in self._late if r[0] == info.qid]:
            del self._late[ref]
        self._ready.pop(info.qid, None)
        self.per_queue.pop(queue, None)
        return self.store.drop_queue(queue)

    def purge(self, queue: str, lo: int, hi: int, limit: int) -> tuple[int, int]:
        """Delete the ready messages of ``queue`` with seqs ``lo .. hi-1``, at most ``limit`` of the
        stored ones walked (the operator's purge, done a share per turn); what is in flight to a
        consumer or held by a group stays, to be settled by its holder. Returns (deleted, the seq to
        go on from: ``hi`` once done)."""
        info = self.store.queue(queue, create=False)
        if info is None:
            return 0, hi
        held = self._held.get(info.qid)
        seqs = self.store.seqs_in(queue, lo, hi, limit)
        deleted = 0
        for seq in seqs:
            if (info.qid, seq) in self.inflight or (held and held.holder_of(seq) is not None):
                continue
            deleted += self.store.delete(queue, seq)
        return deleted, hi if len(seqs) < limit else seqs[-1] + 1

    def _count(self, queue: str, what: str, n: int = 1) -> None:
        counts = self.per_queue.get(queue)
        if counts is None:
            counts = self.per_queue[queue] = collections.Counter()
        counts[what] += n

    def _dead_letter(self, message: Message, reason: str, now_us: int) -> None:
        if self.store.dead_letter(message, reason, now_us=now_us):
            self.counters.dead_lettered += 1
            log.info(
                "message %s of queue %r moved to the dead letters: %s (deliveries %d)",
                message.id,
                message.queue,
                reason,
                message.deliveries,
            )

    # -- answers from consumers -------------------------------------------------------------------

    # Ownership: a client settles only what was delivered to it. ``by`` is the holder a protocol gave
    # ``take`` (a connection, a consumer, a worker, the native send socket, a lease group). A request
    # naming a message ``by`` does not hold changes nothing and returns False (counted as refused).

    def holds(self, ref: Ref, by: Hashable) -> bool:
        """True if ``by`` may settle ``ref``: it holds the delivery, or its delivery timed out (or it
        left) and nobody has settled the message since (a late answer; see LATE_MEMORY)."""
        delivery = self.inflight.get(ref)
        if delivery is not None and delivery.consumer == by:
            return True
        if delivery is not None and isinstance(delivery.consumer, Exclusive):
            return False  # a durable lease: only its group may settle it, however late the answer
        held = self._held.get(ref[0])
        if held and held.holder_of(ref[1]) is not None:
            return False  # leased by a group, which settles by range (ack_range), never by message
        return self._late.get(ref, _NOBODY) == by

    def ack(self, ref: Ref, *, by: Hashable) -> bool:
        """Delete the message for good (a late ack from its last holder still counts). False if ``by``
        does not hold it or it is no longer stored."""
        if not self._may_settle(ref, by):
            return False
        self._settle(ref)
        info = self.store.queue_by_id(ref[0])
        if info is None or not self.store.delete(info.name, ref[1]):
            return False
        self.counters.acked += 1
        self._count(info.name, "acked")
        return True

    def nack(self, ref: Ref, *, by: Hashable) -> bool:
        """Requeue a message ``by`` holds in flight at once, ahead of newer ones. False otherwise."""
        delivery = self.inflight.get(ref)
        if delivery is None or delivery.consumer != by:
            self.counters.refused_not_held += 1
            return False
        self._settle(ref)
        self.counters.nacked += 1
        self._requeue(ref)
        return True

    def requeue_at_end(self, ref: Ref, *, by: Hashable, expires_us: int = 0) -> bool:
        """Move a message ``by`` holds to the end of its queue with a new expiry (0 = never)."""
        message = self.stored(ref) if self._may_settle(ref, by) else None
        if message is None:
            return False
        self._settle(ref)
        self.store.requeue_at_end(message, expires_us=expires_us)
        return True

    def dead_letter(self, ref: Ref, reason: str, *, by: Hashable, now_us: int) -> bool:
        """Move a message ``by`` holds to its queue's dead letters at that client's request."""
        message = self.stored(ref) if self._may_settle(ref, by) else None
        if message is None:
            return False
        self._settle(ref)
        self._dead_letter(message, reason, now_us)
        return True

    def _may_settle(self, ref: Ref, by: Hashable) -> bool:
        if self.holds(ref, by):
            return True
        self.counters.refused_not_held += 1
        return False

    def stored(self, ref: Ref) -> Message | None:
        """The stored message of ``ref``; None once it is gone."""
        info = self.store.queue_by_id(ref[0])
        return None if info is None else self.store.get(info.name, ref[1])

    def set_deadline(self, ref: Ref, deadline: float) -> None:
        """Give a delivery in flight its own deadline (eMQP's timeout:N) instead of the ack timeout."""
        delivery = self.inflight.get(ref)
        if delivery is not None:
            self.inflight.add(ref, deadline, delivery.consumer)

    def undeliver(self, ref: Ref) -> None:
        """A delivery that never left (the socket refused it): requeue it and take back its count."""
        if self._settle(ref) is None:
            return
        info = self.store.queue_by_id(ref[0])
        if info is not None:
            self.store.unmark_delivered(info.name, ref[1])
        self._requeue(ref)

    def expire(self, now: float) -> int:
        """Requeue every delivery whose ack timeout has passed; returns how many."""
        expired = self.inflight.pop_expired(now)
        for delivery in expired:
            self._state(delivery.ref[0]).inflight -= 1
            self._remember_late(delivery.ref, delivery.consumer)
            self._requeue(delivery.ref)
        self.counters.expired += len(expired)
        return len(expired)

    def consumer_gone(self, consumer: Hashable) -> int:
        """Requeue everything ``consumer`` held, at once; returns how many."""
        held = self.inflight.remove_consumer(consumer)
        for delivery in held:
            self._state(delivery.ref[0]).inflight -= 1
            self._remember_late(delivery.ref, consumer)
            self._requeue(delivery.ref)
        return len(held)

    def take_back(self, ref: Ref, *, by: Hashable) -> bool:
        """Requeue a delivery ``by`` holds before its deadline (consumers holding too much together);
        as after an ack timeout, a late ack from ``by`` still counts."""
        delivery = self.inflight.get(ref)
        if delivery is None or delivery.consumer != by:
            return False
        self._settle(ref)
        self._remember_late(ref, by)
        self._requeue(ref)
        self.counters.expired += 1
        return True

    def _remember_late(self, ref: Ref, holder: Hashable) -> None:
        late = self._late
        late[ref] = holder
        late.move_to_end(ref)
        if len(late) > LATE_MEMORY:
            late.popitem(last=False)

    def _settle(self, ref: Ref):
        self._late.pop(ref, None)
        delivery = self.inflight.remove(ref)
        if delivery is not None:
            self._state(ref[0]).inflight -= 1
        return delivery

    def _requeue(self, ref: Ref) -> None:
        heapq.heappush(self._state(ref[0]).requeued, ref[1])

    def held_count(self, holder: Hashable) -> int:
        """How many deliveries ``holder`` holds (a gateway's question; the in-flight table is the broker's)."""
        return self.inflight.count(holder)

    def next_deadline(self) -> float | None:
        return self.inflight.next_deadline()

    # -- figures ----------------------------------------------------------------------------------

    def queue_inflight(self, qid: int) -> int:
        state = self._ready.get(qid)
        return state.inflight if state else 0

    def queue_figures(self, info: QueueInfo) -> dict:
        """One queue's figures as STATS reports them."""
        return {
            "depth": info.count,
            "inflight": self.queue_inflight(info.qid),
            "dead_letters": info.dead_count,
            "bytes": info.bytes,
        }

    def stats(self) -> dict:
        """The figures of the six PZQ monitor lines (totals over all queues) and per queue."""
        queues = {info.name: self.queue_figures(info) for info in self.store.queues()}
        return {
            "messages": sum(q.count for q in self.store.queues()),
            "messages_inflight": len(self.inflight) + sum(held.count for held in self._held.values()),
            "db_size": self.store.disk_bytes(),
            "inflight_db_size": self.inflight.approx_bytes(),
            "syncs": self.store.syncs,
            "expired_messages": self.counters.expired,
            "queues": queues,
        }

    # -- questions the gateways ask (h-gateways): they never reach into the store or the in-flight table

    def queue_info(self, queue: str) -> QueueInfo | None:
        """The counters of ``queue``; None if there is no such queue (nothing is created)."""
        return self.store.queue(queue, create=False)

    def create_queue(self, queue: str) -> QueueInfo:
        """``queue``, made (durable with the next commit) if it did not exist; StoreFull when there is
        no room for it, StoreError for a bad name or one queue too many."""
        return self.store.queue(queue)

    def queue_name(self, qid: int) -> str | None:
        """The name of queue ``qid``; None once it is gone."""
        info = self.store.queue_by_id(qid)
        return None if info is None else info.name

    def check_room(self, size: int) -> None:
        """Raise StoreFull unless ``size`` more bytes fit (a gateway's side record, checked before
        anything changes)."""
        self.store.check_room(size)

    def peek(self, queue: str, from_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages of ``queue`` with seq >= ``from_seq``, in flight or not:
        a read-only look that changes nothing (the API's INFO and SNAPSHOT)."""
        return self.store.scan(queue, from_seq, limit)

    def ref_in(self, queue: str, message_id: str | bytes) -> Ref | None:
        """The ref a client's message id names in ``queue``; None if it names none of its messages."""
        return self.store.ref_in(queue, message_id)

    def in_flight_to(self, ref: Ref) -> Hashable | None:
        """The consumer ``ref`` is in flight to; None if it is not in flight (a range a group holds
        is not: see ``holder_of``)."""
        delivery = self.inflight.get(ref)
        return None if delivery is None else delivery.consumer
