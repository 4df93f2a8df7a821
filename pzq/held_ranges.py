"""Ranges of one queue's seqs held by exclusive holders (consumer groups' range leases). Pure: no I/O.

A group leases runs of consecutive queue seqs, so one entry stands for as many messages as a run has:
memory grows with the number of runs, not of leased messages. Ranges never overlap (a message has one
holder at most); lookups are a bisection over the ranges' starts.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable


class HeldRanges:
    """Disjoint ``[lo, hi)`` seq ranges, each with its holder."""

    def __init__(self) -> None:
        self._starts: list[int] = []  # sorted
        self._spans: dict[int, tuple[int, Hashable]] = {}  # lo -> (hi, holder)
        self.count = 0  # seqs held in all

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, lo: int, hi: int, holder: Hashable) -> None:
        """Hold ``lo .. hi-1`` for ``holder``; the caller makes sure none of it is held already."""
        if hi <= lo:
            return
        self.count += hi - lo
        # Adjacent ranges of one holder become one, so that a group's runs cost one entry however
        # they were leased (or re-registered at start-up, one lease record at a time).
        after = self._spans.get(hi)
        if after is not None and after[1] == holder:
            del self._spans[hi]
            del self._starts[bisect.bisect_left(self._starts, hi)]
            hi = after[0]
        i = bisect.bisect_left(self._starts, lo)
        if i > 0:
            before = self._starts[i - 1]
            end, other = self._spans[before]
            if end == lo and other == holder:
                self._spans[before] = (hi, holder)
                return
        self._starts.insert(i, lo)
        self._spans[lo] = (hi, holder)

    def span_of(self, seq: int) -> tuple[int, int, Hashable] | None:
        """``(lo, hi, holder)`` of the range holding ``seq``, or None."""
        i = bisect.bisect_right(self._starts, seq) - 1
        if i < 0:
            return None
        lo = self._starts[i]
        hi, holder = self._spans[lo]
        return (lo, hi, holder) if seq < hi else None

    def holder_of(self, seq: int) -> Hashable | None:
        span = self.span_of(seq)
        return None if span is None else span[2]

    def next_start(self, seq: int) -> int | None:
        """The start of the first range at or after ``seq``, or None."""
        i = bisect.bisect_left(self._starts, seq)
        return self._starts[i] if i < len(self._starts) else None

    def remove(self, lo: int, hi: int, holder: Hashable) -> int:
        """Stop holding ``lo .. hi-1`` for ``holder`` (within the range that holds ``lo``, and only if
        it is ``holder``'s: a damaged record of another group can never release this one's); returns
        how many seqs."""
        span = self.span_of(lo)
        if span is None or span[2] != holder:
            return 0
        start, end, holder = span
        hi = min(hi, end)
        lo = max(lo, start)
        i = bisect.bisect_left(self._starts, start)
        del self._starts[i]
        del self._spans[start]
        self.count -= end - start
        self.add(start, lo, holder)  # what is left before and after the removed part
        self.add(hi, end, holder)
        return max(0, hi - lo)

    def of_holder(self, holder: Hashable) -> list[tuple[int, int]]:
        """Every ``(lo, hi)`` ``holder`` holds, in seq order (a scan: for rare events)."""
        return [(lo, self._spans[lo][0]) for lo in self._starts if self._spans[lo][1] == holder]
