"""The console's memory of the last 15 minutes: one sample of the loop's counters a second, and the
rates between samples. Pure: the loop hands in its figures and the time; nothing here reads a clock.
"""

from __future__ import annotations

import collections
import dataclasses

WINDOW_S = 15 * 60  # what the charts show
RATES = ("produced_total", "acked_total", "delivered_total")


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    counters: tuple[int, ...]  # RATES, in order
    commit_ms: float  # the last commit's duration


class History:
    """At most WINDOW_S + 1 samples (one a second): a fixed bound, whatever the server does."""

    def __init__(self) -> None:
        self._samples: collections.deque[Sample] = collections.deque(maxlen=WINDOW_S + 1)

    def add(self, at: float, stats: dict, commit_ms: float) -> None:
        """Keep the loop's totals at ``at`` (called once a second)."""
        self._samples.append(Sample(at, tuple(int(stats.get(name, 0)) for name in RATES), commit_ms))

    def series(self) -> dict[str, list[tuple[float, float]]]:
        """Per rate (msg/s between samples) and commit latency (ms): ``(seconds ago, value)`` points,
        oldest first."""
        out: dict[str, list[tuple[float, float]]] = {name: [] for name in (*RATES, "commit_ms")}
        samples = list(self._samples)
        if not samples:
            return out
        now = samples[-1].at
        for before, after in zip(samples, samples[1:], strict=False):
            seconds = after.at - before.at
            if seconds <= 0:
                continue
            ago = round(now - after.at, 1)
            for i, name in enumerate(RATES):
                out[name].append((ago, max(0.0, (after.counters[i] - before.counters[i]) / seconds)))
            out["commit_ms"].append((ago, after.commit_ms))
        return out
