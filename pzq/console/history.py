"""The console's memory of the last 15 minutes, for its charts: one sample of pzq's STATS a poll, the
rates between samples, and every few seconds each queue's depth, in flight and dead letters. Pure:
the poller hands in the figures and their time (epoch seconds); nothing here reads a clock. Bounded
whatever pzq holds: WINDOW_S of samples, MAX_CHARTED_QUEUES queues with charts."""

from __future__ import annotations

import collections
import dataclasses

WINDOW_S = 15 * 60  # what the charts show
RATES = ("produced_total", "delivered_total", "acked_total")
MAX_SAMPLES = 2 * WINDOW_S + 1  # (a poll interval of 0.5 s at the least)
QUEUE_EVERY_S = 5.0  # a queue's charts: one sample each 5 s, 181 of them
QUEUE_FIGURES = ("depth", "inflight", "dead_letters")
MAX_CHARTED_QUEUES = 1000  # queues with charts (the first seen); 181 samples each, a few tens of MB at most

Series = dict[str, list[float]]  # {"t": epoch seconds, "v": values}, oldest first


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds (pzq's clock when it says)
    counters: tuple[int, ...]  # RATES, in order
    messages: int
    commit_ms: float


class History:
    """Samples of the totals (one a poll) and of each queue (one each QUEUE_EVERY_S)."""

    def __init__(self) -> None:
        self._samples: collections.deque[Sample] = collections.deque(maxlen=MAX_SAMPLES)
        self._queues: dict[str, collections.deque[tuple[float, int, int, int]]] = {}
        self._queues_at = float("-inf")

    def add(self, at: float, stats: dict) -> None:
        """Keep one STATS answer's figures, taken at ``at``."""
        if self._samples and at <= self._samples[-1].at:
            return  # (the same snapshot twice, or a clock stepped back: keep the axis increasing)
        counters = tuple(_int(stats.get(name)) for name in RATES)
        commit_ms = stats.get("commit_ms_last", 0.0)
        self._samples.append(
            Sample(at, counters, _int(stats.get("messages")), float(commit_ms) if _is_number(commit_ms) else 0.0)
        )
        while self._samples and self._samples[0].at < at - WINDOW_S:
            self._samples.popleft()
        if at - self._queues_at >= QUEUE_EVERY_S:
            self._queues_at = at
            self._add_queues(at, stats.get("queues") or {})

    def _add_queues(self, at: float, queues: dict[str, dict]) -> None:
        for name in [q for q in self._queues if q not in queues]:  # (deleted queues)
            del self._queues[name]
        for name, figures in queues.items():
            samples = self._queues.get(name)
            if samples is None:
                if len(self._queues) >= MAX_CHARTED_QUEUES:
                    continue
                samples = self._queues[name] = collections.deque(maxlen=int(WINDOW_S / QUEUE_EVERY_S) + 1)
            if isinstance(figures, dict):
                depth, inflight, dead = (_int(figures.get(k)) for k in QUEUE_FIGURES)
                samples.append((at, depth, inflight, dead))

    def series(self) -> dict[str, Series]:
        """The totals' charts: per rate (msg/s between samples), messages stored, commit latency (ms)."""
        out: dict[str, Series] = {name: {"t": [], "v": []} for name in (*RATES, "messages", "commit_ms")}
        samples = list(self._samples)
        for before, after in zip(samples, samples[1:], strict=False):
            seconds = after.at - before.at
            for i, name in enumerate(RATES):
                out[name]["t"].append(after.at)
                out[name]["v"].append(round(max(0.0, (after.counters[i] - before.counters[i]) / seconds), 1))
        for sample in samples:
            for name, value in (("messages", float(sample.messages)), ("commit_ms", sample.commit_ms)):
                out[name]["t"].append(sample.at)
                out[name]["v"].append(value)
        return out

    def latest_rates(self) -> dict[str, float]:
        """The rates between the last two samples (msg/s); 0 before there are two."""
        if len(self._samples) < 2:
            return {name: 0.0 for name in RATES}
        before, after = self._samples[-2], self._samples[-1]
        seconds = after.at - before.at
        return {
            name: round(max(0.0, (after.counters[i] - before.counters[i]) / seconds), 1) for i, name in enumerate(RATES)
        }

    def queue_series(self, name: str, at: float, figures: dict | None) -> dict[str, Series]:
        """A queue's depth, in flight and dead letters over the window, ending with ``figures`` taken
        at ``at`` (the snapshot the page's figures show, so its charts and figures agree)."""
        out: dict[str, Series] = {k: {"t": [], "v": []} for k in QUEUE_FIGURES}
        for sample_at, *values in self._queues.get(name, ()):
            if sample_at >= at:
                break
            for key, value in zip(QUEUE_FIGURES, values, strict=True):
                out[key]["t"].append(sample_at)
                out[key]["v"].append(float(value))
        if figures is not None:
            for key in QUEUE_FIGURES:
                out[key]["t"].append(at)
                out[key]["v"].append(float(_int(figures.get(key))))
        return out


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
