"""Messages held by range for consumer groups (Spark's durable leases).

A group holds messages by range (``take_ranges``): one entry per run of consecutive seqs, not one
in-flight entry per message, so a lease of a million messages costs a few entries. The cursor jumps
over held ranges, and a released range rewinds it, so those messages are found again in order.
"""

from __future__ import annotations

from collections.abc import Hashable

from pzq.broker.state import BrokerState, Exclusive, Ref, continues
from pzq.held_ranges import HeldRanges


class RangeHolds(BrokerState):
    """The Broker's range leases: take, hold, release and acknowledge runs of seqs for a group."""

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
        cut_short = False
        while state.requeued and taken < n:
            batch = self._next_ready(queue, info.qid, state, n - taken, cursor=False)
            if not batch:
                break
            for m in batch:
                cap = (m.meta or {}).get("max_deliveries") or 0
                lease(m.seq, m.expires_us, cap if type(cap) is int else 0, m.deliveries)
            if self.cut_short:  # (stale seqs passed over: the rest is the next call's, in order)
                cut_short = True
                break
        held = self._held.get(info.qid) or None
        inflight = self.inflight
        while taken < n and not cut_short:
            limit = self._cursor_limit(state, held, n - taken)
            if limit is None:
                continue  # (the cursor jumped a held range)
            entries = self.store.lease_headers(queue, state.cursor, limit)
            if not entries:
                break
            state.cursor = entries[-1][0] + entries[-1][1]
            for seq, count, expires_us, cap, deliveries in entries:
                if count == 1:
                    if (info.qid, seq) in inflight or (held and held.holder_of(seq) is not None):
                        continue
                    lease(seq, expires_us, cap, deliveries)
                    continue
                # A run of plain messages (no TTL, no cap of their own): what one may do, all may.
                for lo, hi in self._free_parts(info.qid, seq, seq + count, held):
                    if self._past_limits(0, 0, deliveries, now_us):
                        for one in range(lo, hi):  # (rare: --max-deliveries reached; each is moved whole)
                            lease(one, 0, 0, deliveries)
                        continue
                    if deliveries:
                        self.counters.redelivered += hi - lo
                        self._count(queue, "redelivered", hi - lo)
                    if runs and continues(runs[-1], lo, deliveries + 1):
                        runs[-1][1] += hi - lo
                    else:
                        runs.append([lo, hi - lo, deliveries + 1])
                    taken += hi - lo
        self.counters.delivered += taken
        # (A message is read once: the cursor has passed it, or it left the requeued heap.)
        for lo, count, _ in runs:
            self.hold_range(info.qid, lo, lo + count, holder)
        return [(lo, count, deliveries) for lo, count, deliveries in runs]

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
            if len(self.inflight):
                for seq in range(lo, end):
                    if (qid, seq) not in self.inflight:
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
        if seqs:
            self.readiness += 1
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

    def held_by_others(self, qid: int, ours) -> bool:
        """True if a message of queue ``qid`` is in flight to (or leased by) a holder for which
        ``ours(holder)`` is false (a scan of what is in flight: for rare requests)."""
        if self._held.get(qid):
            return True  # (a group's range: groups are nobody's but their own)
        return any(
            ref[0] == qid and not (isinstance(holder, tuple) and ours(holder))
            for ref, holder in self.inflight.holders()
        )
