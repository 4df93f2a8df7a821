"""The broker's part that holds messages by range for consumer groups (Spark's durable leases).

A group holds messages by range (``take_ranges``): one entry per run of consecutive seqs, not one
in-flight entry per message, so a lease of a million messages costs a few entries. The cursor jumps
over held ranges, and a released range rewinds it, so those messages are found again in order (rules
1-5 in state.py).
"""

from __future__ import annotations

from collections.abc import Hashable

from pzq.broker.state import BrokerState, Exclusive, Ready, Ref, continues
from pzq.held_ranges import HeldRanges
from pzq.store import QueueInfo


class _Lease:
    """The runs ``take_ranges`` leases, ``[first seq, count, deliveries]`` (this delivery included)."""

    def __init__(self, state: BrokerState, queue: str, now_us: int):
        self.s, self.queue, self.now_us = state, queue, now_us
        self.runs: list[list[int]] = []
        self.taken = 0

    def one(self, seq: int, expires_us: int, cap: int, deliveries: int) -> None:
        """Lease one message, or move it to the dead letters past its limits (rule 5)."""
        s = self.s
        reason = s.past_limits(expires_us, cap, deliveries, self.now_us)
        if reason:
            message = s.store.get(self.queue, seq)  # (rare: read whole to move it)
            if message is not None:
                s.to_dead_letters(message, reason, self.now_us)
            return
        deliveries += 1
        if deliveries > 1:
            s.counters.redelivered += 1
            s.count(self.queue, "redelivered")
        self.extend(seq, 1, deliveries)

    def extend(self, lo: int, count: int, deliveries: int) -> None:
        """Lease ``count`` messages from ``lo`` delivered ``deliveries`` times with this one."""
        runs = self.runs
        if runs and continues(runs[-1], lo, deliveries):
            runs[-1][1] += count
        else:
            runs.append([lo, count, deliveries])
        self.taken += count


class RangeHolds:
    """The Broker's range leases: take, hold, release and acknowledge runs of seqs for a group."""

    def __init__(self, state: BrokerState):
        self._s = state
        self._store, self._ranges, self._ready_of = state.store, state.ranges, state.ready_of

    def take_ranges(self, queue: str, n: int, holder: Exclusive, *, now_us: int) -> list[tuple[int, int, int]]:
        """Hold up to ``n`` ready messages of ``queue`` for ``holder`` (a consumer group), oldest first,
        as runs ``(first seq, count, deliveries)``: consecutive seqs with the same delivery count,
        this delivery included. Nothing is written per message: the group records the runs, and the
        counts are raised in the store only if the messages come back (``release_range``). Messages
        past their TTL or their delivery cap go to the dead letters, as with ``take``."""
        info = self._store.queue(queue, create=False)
        if info is None or n <= 0:
            return []
        state = self._ready_of(info.qid)
        lease = _Lease(self._s, queue, now_us)
        # Messages that came back first (few: read whole), then the cursor's, by their headers only.
        if not self._lease_returned(info, state, n, lease):
            self._lease_cursor(info, state, n, lease)
        self._s.counters.delivered += lease.taken
        # (A message is read once: the cursor has passed it, or it left the requeued heap.)
        for lo, count, _ in lease.runs:
            self.hold_range(info.qid, lo, lo + count, holder)
        return [(lo, count, deliveries) for lo, count, deliveries in lease.runs]

    def _lease_returned(self, info: QueueInfo, state: Ready, n: int, lease: _Lease) -> bool:
        """Lease the messages that came back; True if it stopped at stale seqs (the rest is the next call's)."""
        while state.requeued and lease.taken < n:
            batch = self._s.next_ready(info.name, info.qid, state, n - lease.taken, cursor=False)
            if not batch:
                break
            for m in batch:
                cap = (m.meta or {}).get("max_deliveries") or 0
                lease.one(m.seq, m.expires_us, cap if type(cap) is int else 0, m.deliveries)
            if self._s.cut_short:  # (stale seqs passed over: the rest is the next call's, in order)
                return True
        return False

    def _lease_cursor(self, info: QueueInfo, state: Ready, n: int, lease: _Lease) -> None:
        """Lease from the cursor on, by the records' headers only."""
        queue, qid, s = info.name, info.qid, self._s
        held = self._ranges.get(qid) or None
        inflight = s.inflight
        while lease.taken < n:
            limit = s.cursor_limit(state, held, n - lease.taken)
            if limit is None:
                continue  # (the cursor jumped a held range)
            entries = self._store.lease_headers(queue, state.cursor, limit)
            if not entries:
                break
            state.cursor = entries[-1][0] + entries[-1][1]
            for seq, count, expires_us, cap, deliveries in entries:
                if count == 1:
                    if (qid, seq) in inflight or (held and held.holder_of(seq) is not None):
                        continue
                    lease.one(seq, expires_us, cap, deliveries)
                    continue
                # A run of plain messages (no TTL, no cap of their own): what one may do, all may.
                for lo, hi in self._free_parts(qid, seq, seq + count, held):
                    if s.past_limits(0, 0, deliveries, lease.now_us):
                        for one in range(lo, hi):  # (rare: --max-deliveries reached; each is moved whole)
                            lease.one(one, 0, 0, deliveries)
                        continue
                    if deliveries:
                        s.counters.redelivered += hi - lo
                        s.count(queue, "redelivered", hi - lo)
                    lease.extend(lo, hi - lo, deliveries + 1)

    def _free_parts(self, qid: int, lo: int, hi: int, held: HeldRanges | None) -> list[tuple[int, int]]:
        """``lo .. hi-1`` less the seqs some holder has (a held range, a native consumer's delivery), as
        ranges in order: a run is checked per range, or per seq only while deliveries are in flight."""
        parts: list[tuple[int, int]] = []
        while lo < hi:
            span = held.span_of(lo) if held else None
            if span is not None:
                lo = span[1]
                continue
            start = held.next_start(lo) if held else None
            end = hi if start is None else min(hi, start)
            if len(self._s.inflight):
                for seq in range(lo, end):
                    if (qid, seq) not in self._s.inflight:
                        if parts and parts[-1][1] == seq:
                            parts[-1] = (parts[-1][0], seq + 1)
                        else:
                            parts.append((seq, seq + 1))
            else:
                parts.append((lo, end))
            lo = end
        return parts

    def hold_range(self, qid: int, lo: int, hi: int, holder: Exclusive, stored: int | None = None) -> None:
        """Keep seqs ``lo .. hi-1`` of queue ``qid`` away from every other consumer (a group's lease,
        also when re-registered after a restart: then ``stored`` says how many of them are stored);
        the caller makes sure no other holder has them."""
        held = self._ranges.get(qid)
        if held is None:
            held = self._ranges[qid] = HeldRanges()
        held.add(lo, hi, holder)
        self._ready_of(qid).inflight += hi - lo if stored is None else stored

    def release_range(self, qid: int, lo: int, hi: int, holder: Exclusive, *, deliveries: int | None = None) -> int:
        """Give ``holder``'s seqs ``lo .. hi-1`` back to their queue (only what ``holder`` holds, within
        one range): with ``deliveries``, their delivery count is written as that (durable with this
        turn); without, they were never handed out (a lease cut short). The cursor rewinds to find
        them in order. Returns how many stored messages went back."""
        held = self._ranges.get(qid)
        info = self._store.queue_by_id(qid)
        span = None if held is None else held.span_of(lo)
        if held is None or info is None or span is None or span[2] != holder:
            return 0
        hi = min(hi, span[1])
        seqs = self._store.seqs_in(info.name, lo, hi, hi - lo)
        if deliveries is not None:
            self._store.set_delivered(info.name, seqs, deliveries)
            self._s.counters.expired += len(seqs)
        held.remove(lo, hi, holder)
        state = self._ready_of(qid)
        state.inflight -= len(seqs)
        state.cursor = min(state.cursor, lo)
        if seqs:
            self._s.readiness += 1
        return len(seqs)

    def ack_range(self, qid: int, lo: int, hi: int, holder: Exclusive, limit: int) -> tuple[int, int]:
        """Delete (acknowledge) at most ``limit`` of the messages ``holder`` holds from ``lo`` to
        ``hi - 1`` and stop holding what was walked; returns (deleted, where the walk stopped: ``hi``
        once done). Seqs ``holder`` does not hold are never deleted: the walk skips them."""
        held = self._ranges.get(qid)
        info = self._store.queue_by_id(qid)
        span = None if held is None else held.span_of(lo)
        if held is None or info is None or span is None or span[2] != holder:
            return 0, hi
        deleted, at = self._store.delete_range(info.name, lo, min(hi, span[1]), limit)
        held.remove(lo, at, holder)
        self._ready_of(qid).inflight -= deleted
        if deleted:
            self._s.counters.acked += deleted
            self._s.count(info.name, "acked", deleted)
        return deleted, at  # (at the range's end if it ends before hi: the rest is not holder's)

    def set_aside(self, qid: int, seq: int) -> None:
        # A held message found unreadable is no longer stored: it no longer counts as held either, or
        # the queue would look empty of ready messages while one waits.
        held = self._ranges.get(qid)
        if held and held.holder_of(seq) is not None:
            self._ready_of(qid).inflight -= 1

    def holder_of(self, ref: Ref) -> Hashable | None:
        """Who holds ``ref``: a group holding its range, or the consumer it is in flight to."""
        held = self._ranges.get(ref[0])
        if held:
            holder = held.holder_of(ref[1])
            if holder is not None:
                return holder
        delivery = self._s.inflight.get(ref)
        return None if delivery is None else delivery.consumer

    def held_ranges(self, qid: int) -> HeldRanges | None:
        return self._ranges.get(qid)

    def held_by_others(self, qid: int, ours) -> bool:
        """True if a message of queue ``qid`` is in flight to (or leased by) a holder for which
        ``ours(holder)`` is false (a scan of what is in flight: for rare requests)."""
        if self._ranges.get(qid):
            return True  # (a group's range: groups are nobody's but their own)
        return any(
            ref[0] == qid and not (isinstance(holder, tuple) and ours(holder))
            for ref, holder in self._s.inflight.holders()
        )
