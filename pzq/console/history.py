"""The console's memory of the last 15 minutes: one sample of the loop's counters a second, and the
rates between samples. Pure: the loop hands in its figures and the time; nothing here reads a clock.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

WINDOW_S = 15 * 60  # what the charts show
RATES = ("produced_total", "acked_total", "delivered_total")
QUEUE_EVERY_S = 10.0  # a queue's charts: one sample each 10 s, 91 of them
MAX_CHARTED_QUEUES = 1000  # queues with charts (the first seen); with 91 samples each, about 10 MB


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # monotonic seconds
    counters: tuple[int, ...]  # RATES, in order
    commit_ms: float  # the last commit's duration


class History:
    """At most WINDOW_S + 1 samples (one a second): a fixed bound, whatever the server does."""

    def __init__(self) -> None:
        self._samples: collections.deque[Sample] = collections.deque(maxlen=WINDOW_S + 1)
        self._queues: dict[str, collections.deque[tuple[float, int, int, int]]] = {}
        self._queues_at = -QUEUE_EVERY_S
        self._lock = threading.Lock()  # (the loop adds; a page's thread reads a queue's samples)

    def add(self, at: float, stats: dict, commit_ms: float, per_queue: dict[str, dict] | None = None) -> None:
        """Keep the loop's totals at ``at`` (called once a second), and every QUEUE_EVERY_S each
        queue's produced and acked counts (``per_queue``) and depth."""
        self._samples.append(Sample(at, tuple(int(stats.get(name, 0)) for name in RATES), commit_ms))
        if per_queue is None or at - self._queues_at < QUEUE_EVERY_S:
            return
        self._queues_at = at
        depths = stats.get("queues", {})
        with self._lock:
            self._add_queues(at, depths, per_queue)

    def _add_queues(self, at: float, depths: dict[str, dict], per_queue: dict[str, dict]) -> None:
        for name in [q for q in self._queues if q not in depths]:  # (deleted queues)
            del self._queues[name]
        for name, figures in depths.items():
            samples = self._queues.get(name)
            if samples is None:
                if len(self._queues) >= MAX_CHARTED_QUEUES:
                    continue
                samples = self._queues[name] = collections.deque(maxlen=int(WINDOW_S / QUEUE_EVERY_S) + 1)
            counts = per_queue.get(name, {})
            samples.append((at, counts.get("produced", 0), counts.get("acked", 0), figures.get("depth", 0)))

    def queue_rates(self) -> dict[str, tuple[float, float]]:
        """Each charted queue's produce and ack rates (msg/s) over its last 10 s."""
        with self._lock:
            last = {name: list(samples)[-2:] for name, samples in self._queues.items() if len(samples) > 1}
        return {
            name: (max(0.0, (b[1] - a[1]) / (b[0] - a[0])), max(0.0, (b[2] - a[2]) / (b[0] - a[0])))
            for name, (a, b) in last.items()
            if b[0] > a[0]
        }

    def queue_series(self, name: str) -> dict[str, list[tuple[float, float]]]:
        """A queue's produce and ack rates (msg/s over each 10 s) and depth: ``(seconds ago, value)``."""
        out: dict[str, list[tuple[float, float]]] = {"produced": [], "acked": [], "depth": []}
        with self._lock:
            samples = list(self._queues.get(name, ()))
        if not samples:
            return out
        now = samples[-1][0]
        for before, after in zip(samples, samples[1:], strict=False):
            seconds = after[0] - before[0]
            if seconds <= 0:
                continue
            ago = round(now - after[0], 1)
            out["produced"].append((ago, max(0.0, (after[1] - before[1]) / seconds)))
            out["acked"].append((ago, max(0.0, (after[2] - before[2]) / seconds)))
            out["depth"].append((ago, float(after[3])))
        return out

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
