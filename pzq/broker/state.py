"""The life of a delivery, stated once, and the state every part of the broker shares to keep it.

A stored message is in one of three live states, and leaves the queue in one of four ways:

    READY      stored, held by nobody: the next take may hand it out
    IN FLIGHT  handed to one holder (a connection, a consumer, a worker, the native send socket, a
               durable lease re-registered), with a deadline, its body's bytes charged to a payer
    HELD       in a range a consumer group holds (Spark's leases: by range, no entry per message)
    settled (acked: deleted) · dead-lettered (by its holder, or "expired" / "max-deliveries" when it
    was about to go out) · moved (to the end of its queue as a new message) · dropped (its queue
    deleted, or purged while ready)

A delivery that ends without an answer *returns*: the message is READY again and its last holder is
remembered for a late answer. ``produce`` makes a READY message; ``requeue_dead`` makes a dead letter
a new READY message at the end.

Rules (the code that keeps each is named; "parts" are this folder's modules):

 1. One holder at a time: a message is READY, IN FLIGHT to one holder or HELD in one range, never two.
    ``BrokerState.next_ready`` passes over what is in flight or held, ``Store.plain_run`` over what is
    in flight (``Handing.take_columns`` runs it only on a queue without held ranges);
    ``RangeHolds.take_ranges`` leases only the free parts (``_free_parts``); ``hold_range`` is called
    only for groups' leases read back from the disk, which pzq/leases checks do not overlap.
 2. Oldest first: READY messages go out in seq order, those that returned (a small heap of seqs)
    before the cursor's never-delivered ones, so a queue stays FIFO across redeliveries
    (``next_ready``); the cursor jumps held ranges and rewinds to a released one (``release_range``).
 3. Only the holder settles: ack, requeue at the end and dead-letter need ``Settling.holds``; nack
    and take-back only the holder of the delivery in flight. A delivery to an ``Exclusive`` holder (a
    group's lease re-registered) takes no late answer from anyone else; a HELD range is settled only by
    its group, by range (``ack_range``, ``release_range``), never by message. Anything else changes
    nothing and returns False (or is listed as refused); ack, nack, requeue and dead-letter count it
    (``refused_not_held``).
 4. Every hand-out counts a delivery, durable with the next commit (``Store.mark_delivered_run``,
    ``count_deliveries``); a delivery that never left its socket takes its count back
    (``Settling.undeliver``). A range lease writes nothing per message: the counts are written only if
    the range comes back (``release_range`` with ``deliveries``).
 5. Limits are checked when a message is about to go out, not while it is in flight: past its TTL or
    its delivery cap (its meta's ``max_deliveries``, else ``--max-deliveries``) it goes to the dead
    letters instead (``past_limits``, ``to_dead_letters``; in ``Handing.take`` and ``take_ranges``).
 6. Late answers: a delivery that timed out, was taken back or whose consumer left returns, and its
    holder is remembered (``remember_late``, at most ``Limits.late_memory`` messages): its ack,
    requeue or dead-letter still counts until someone settles the message. Forgotten, the late
    answer is refused and the message is simply delivered again (at-least-once).
 7. Ack timeouts: a delivery past its deadline (``--ack-timeout``, or its own: ``Deliveries.hold``)
    returns, earliest first, at most ``limit`` a call (``Settling.expire``).
 8. Bytes: each body handed out is charged to its payer while it is in flight (the in-flight table
    keeps the sums); released when known gone (acked, nacked, moved, dead-lettered by its holder,
    never sent, its payer gone). A returned copy that may still sit in the payer's pipe stays charged
    (``timed_out``: stale) until a late answer or the payer's end. A payer without room is handed
    nothing (accounts.py, ``DeliveryAccounts.room``).
 9. Readiness grows whenever messages may have become ready (produced, returned, released, moved,
    requeued from the dead letters, bytes released to a payer refused room, a take cut short, every
    delivery forgotten); a gateway that found nothing looks again only once it has changed.
10. Turns: what a turn changes in flight is undone by its rollback (``rolled_back``); deliveries of
    earlier turns to ``keep_on_rollback`` holders stay IN FLIGHT, others' are forgotten (READY); acks
    by those holders since the last commit are done again as the next turn begins (``turn_begins``,
    at most ``Limits.rollback_acks_kept``).
11. A restart (``reset``) makes everything in flight READY, and forgets late holders and stale copies.
12. Whole queues: ``drop_queue`` ends everything of a queue at once, in flight and held included;
    ``purge`` deletes only READY messages (what is in flight or held stays with its holder).

Transitions: from a state, an event (the Broker's verbs; a note in brackets), to a state, by the code
that makes it (a part's class and method; the rules it keeps). tests/test_broker_life.py drives every
row on a real store and checks the state it ends in.

    from           event                                     to              by
    (none)         produce, produce_many, produce_big        READY           Producing (9)
    READY          take, take_run, take_columns              IN FLIGHT       Handing (1, 2, 4, 8)
    READY          take [past its TTL or its cap]            dead-lettered   BrokerState.past_limits (5)
    READY          take_ranges, hold_range                   HELD            RangeHolds (1, 4)
    READY          hold [a lease re-registered]              IN FLIGHT       Deliveries.hold (1)
    READY          purge                                     dropped         Queues.purge (12)
    IN FLIGHT      ack, ack_many                             settled         Settling (3)
    IN FLIGHT      nack                                      READY           Settling.nack (2, 3)
    IN FLIGHT      expire [its deadline passed]              READY, late     Settling.expire (6, 7, 8)
    IN FLIGHT      take_back, take_back_many, consumer_gone  READY, late     Settling (3, 6, 8)
    IN FLIGHT      undeliver, undeliver_many [never left]    READY           Settling.undeliver (4)
    IN FLIGHT      requeue_at_end                            moved           Settling.requeue_at_end (3)
    IN FLIGHT      dead_letter                               dead-lettered   Settling.dead_letter (3)
    IN FLIGHT      rolled_back [taken this turn]             READY           BrokerState.rolled_back (10)
    IN FLIGHT      rolled_back [kept, an earlier turn's]     IN FLIGHT       BrokerState.rolled_back (10)
    IN FLIGHT      reset                                     READY           BrokerState.reset (11)
    IN FLIGHT      drop_queue                                dropped         Queues.drop_queue (12)
    READY, late    ack, requeue_at_end, dead_letter [late]   as IN FLIGHT    Settling.holds (6)
    READY, late    nack, take_back [late]                    READY, late     Settling.nack (3)
    HELD           ack_range                                 settled         RangeHolds.ack_range (3)
    HELD           release_range                             READY           RangeHolds.release_range (2, 4)
    HELD           ack, nack [by anyone]                     HELD            Settling.holds (3)
    HELD           drop_queue                                dropped         Queues.drop_queue (12)
    dead-lettered  requeue_dead                              READY           Queues.requeue_dead (9)

Readiness without scans: a queue's never-delivered messages are found by a disk cursor (the next seq
to read, moving only forward but for a released range), and returned ones wait in a heap of seqs
served first. Both are bounded by what is in flight, not by what is stored.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
from collections.abc import Hashable, Iterable, Sequence

from pzq.broker.accounts import DeliveryAccounts, Stale
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.held_ranges import HeldRanges
from pzq.inflight import Delivery, InFlight
from pzq.logs import EventTally
from pzq.store import Message, Store

log = logging.getLogger("pzq.broker")

Ref = tuple[int, int]  # (queue id, seq): names a message across the store and the in-flight table


def continues(run: Sequence[int], seq: int, deliveries: int) -> bool:
    """True if a message (``seq``, ``deliveries``) extends a lease run ``[first seq, count, deliveries]``:
    the next seq, with the same delivery count."""
    return run[0] + run[1] == seq and run[2] == deliveries


@dataclasses.dataclass
class Ready:
    """Where a queue's next ready message is (rule 2), and how many of its messages are held."""

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
    """What every part of the Broker reads and keeps, and the rules more than one part applies;
    single-threaded, driven by the server loop. Its tables are cleared, never replaced (parts keep
    references to them), but for ``inflight``, which a reset replaces: read it here each time."""

    def __init__(self, store: Store, *, ack_timeout_s: float, max_deliveries: int = 0, limits: Limits = DEFAULT_LIMITS):
        self.store = store
        self.ack_timeout_s = ack_timeout_s
        self.max_deliveries = max_deliveries
        self.late_memory = limits.late_memory  # (rule 6)
        self.rollback_acks_kept = limits.rollback_acks_kept
        self.take_skips = limits.take_skips
        self.cut_short = False  # the last next_ready stopped at take_skips stale seqs
        self.inflight: InFlight[Ref] = InFlight()
        self.counters = Counters()
        self.per_queue: dict[str, collections.Counter] = {}  # queue -> produced / acked / redelivered
        self.events = EventTally(log, limits.event_log_s, limits.event_log_queues)  # (dead letters)
        self.ready: dict[int, Ready] = {}
        self.ranges: dict[int, HeldRanges] = {}  # qid -> ranges leased by consumer groups
        # Late holders (rule 6): ref -> (holder, the record its stale copy's bytes are charged to, size)
        self.late: collections.OrderedDict[Ref, tuple[Hashable, Stale | None, int]] = collections.OrderedDict()
        self.accounts = DeliveryAccounts(limits)  # (rule 8)
        self.readiness = 0  # (rule 9)
        # While set (the server's memory alarm: pzq/endpoints/memory.py), every producer is refused with
        # this text ("queue full" in each protocol); consumers and acks go on, so that memory drains.
        self.refusing: str | None = None
        # Rule 10: holders whose gateway keeps no state a rollback would undo (the native send socket),
        # and their acks since the last commit, in order (done again if a rollback undid them)
        self.keep_on_rollback: set[Hashable] = set()
        self.unwritten: dict[Ref, None] = {}
        self.redo = False

    def ready_of(self, qid: int) -> Ready:
        state = self.ready.get(qid)
        if state is None:
            state = self.ready[qid] = Ready()
        return state

    # -- turns (rules 10, 11) -------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every delivery, as a restart does: whatever was in flight is ready again."""
        self.inflight = InFlight()
        self.accounts.reset()
        self.ready.clear()
        self.ranges.clear()
        self.late.clear()
        self.unwritten.clear()
        self.redo = False
        self.readiness += 1

    def turn_begins(self) -> None:
        """A turn begins: what it changes in flight can be undone (``rolled_back``). Acks that a rolled
        back turn took back are done again first (within this turn: a failing store fails it too)."""
        self.inflight.mark()
        if self.redo:
            self.redo = False
            for ref in self.unwritten:
                self.settle(ref)
                info = self.store.queue_by_id(ref[0])
                if info is not None:
                    self.store.delete(info.name, ref[1])

    def committed(self) -> None:
        """A commit made every ack so far durable."""
        self.unwritten.clear()

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
        self.ready.clear()
        for ref, _ in self.inflight.holders():
            self.ready_of(ref[0]).inflight += 1
        self.ranges.clear()  # (the leases are read again from the disk)
        self.redo = bool(self.unwritten)
        self.readiness += 1

    def redo_on_rollback(self, holder: Hashable) -> None:
        """``holder``'s gateway keeps no state a rollback would undo (the native send socket): its
        deliveries of earlier turns stay in flight through a rolled-back turn, and its acks since the
        last commit are done again (rule 10)."""
        self.keep_on_rollback.add(holder)

    def keep_unwritten(self, refs: Iterable[Ref]) -> None:
        """Acks by a ``keep_on_rollback`` holder, to be done again if this turn is rolled back (rule 10;
        the oldest forgotten past ``rollback_acks_kept``: a commit failing for long stays bounded)."""
        unwritten = self.unwritten
        unwritten.update(dict.fromkeys(refs))
        while len(unwritten) > self.rollback_acks_kept:
            del unwritten[next(iter(unwritten))]

    # -- the rules parts share ------------------------------------------------------------------

    def count(self, queue: str, what: str, n: int = 1) -> None:
        counts = self.per_queue.get(queue)
        if counts is None:
            counts = self.per_queue[queue] = collections.Counter()
        counts[what] += n

    def past_limits(self, expires_us: int, cap: int, deliveries: int, now_us: int) -> str | None:
        """Why a message goes to the dead letters instead of a consumer (rule 5): its TTL passed, or it
        was delivered as often as its own cap (or --max-deliveries) allows; None if it may go out."""
        if expires_us and expires_us <= now_us:
            return "expired"
        cap = cap or self.max_deliveries
        return "max-deliveries" if cap and deliveries >= cap else None

    def to_dead_letters(self, message: Message, reason: str, now_us: int) -> None:
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

    def cursor_limit(self, state: Ready, held: HeldRanges | None, n: int) -> int | None:
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

    def next_ready(
        self, queue: str, qid: int, state: Ready, n: int, cursor: bool = True, max_bytes: int | None = None
    ) -> list[Message]:
        """Up to ``n`` ready messages (rules 1, 2): those that returned first, then the cursor's.
        ``cut_short`` is set when it stopped after ``limits.take_skips`` stale seqs of the heap (the
        caller stops there: the rest is the next call's; readiness is raised so that nobody takes
        "nothing found" for "none"). With ``max_bytes``, it stops once their bodies reach it (Store.scan)."""
        out: list[Message] = []
        size, most = 0, (1 << 62) if max_bytes is None else max_bytes
        held = self.ranges.get(qid) or None  # (None when it holds no range: the hot path stays as it was)
        inflight = self.inflight
        self.cut_short = False
        skips = self.take_skips
        while state.requeued and len(out) < n and size < most:
            seq = heapq.heappop(state.requeued)
            # At or past the cursor (held since start-up, not yet scanned), the cursor will find it.
            if (qid, seq) in inflight or seq >= state.cursor or (held and held.holder_of(seq) is not None):
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
            limit = self.cursor_limit(state, held, n - len(out))
            if limit is None:
                continue
            fresh = self.store.scan(queue, state.cursor, limit, None if max_bytes is None else most - size)
            if not fresh:
                break
            state.cursor = fresh[-1].seq + 1
            if held:
                out.extend(m for m in fresh if (qid, m.seq) not in inflight and held.holder_of(m.seq) is None)
            else:
                out.extend(m for m in fresh if (qid, m.seq) not in inflight)
            if max_bytes is not None:
                size += sum(len(f) for m in fresh for f in m.frames)
        return out

    def remember_late(self, ref: Ref, holder: Hashable, stale: Stale | None = None, size: int = 0) -> None:
        """``holder``'s delivery of ``ref`` returned without an answer (rule 6): its late answer still
        counts, and settles the ``size`` bytes of the copy still charged in ``stale``. (Past
        ``late_memory`` the oldest is forgotten; its stale bytes stay charged until its payer goes.)"""
        late = self.late
        late[ref] = (holder, stale, size)
        late.move_to_end(ref)
        if len(late) > self.late_memory:
            late.popitem(last=False)

    def timed_out(self, delivery: Delivery[Ref]) -> None:
        """A delivery that may still sit unread in its payer's pipe returns: its copy stays charged
        until a late answer or the payer's end (rule 8), and its holder may still answer late."""
        stale = self.accounts.stale(delivery.payer, delivery.size)
        self.remember_late(delivery.ref, delivery.consumer, stale, delivery.size)

    def settle(self, ref: Ref, by: Hashable = None) -> Delivery[Ref] | None:
        """End ``ref``'s delivery (if in flight) and its late holder's memory; returns the delivery."""
        late = self.late.pop(ref, None)
        # (only its late holder's answer shows the stale copy read: settled by another holder of the
        # message, that copy may still sit in the late one's pipe, charged until its payer's end)
        if late is not None and late[1] is not None and late[0] == by:
            self.accounts.settled_late(late[1], late[2])
        delivery = self.inflight.remove(ref)
        if delivery is not None:
            self.ready_of(ref[0]).inflight -= 1
            if delivery.size:
                self.released(delivery.payer)
        return delivery

    def released(self, payer: Hashable) -> None:
        """Bytes of ``payer`` were released: readiness grows if someone refused room may have some now."""
        if self.accounts.released(payer, self.inflight):
            self.readiness += 1

    def requeue(self, ref: Ref) -> None:
        """``ref`` returns: ready again, ahead of the cursor's (rule 2)."""
        heapq.heappush(self.ready_of(ref[0]).requeued, ref[1])
        self.readiness += 1

    def payer_gone(self, payer: Hashable) -> None:
        """``payer``'s connection closed: whatever of its deliveries' copies was still charged is gone
        with it (its deliveries in flight return through ``consumer_gone``, their holder's end)."""
        self.accounts.gone(payer)
        self.released(payer)
