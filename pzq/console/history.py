"""The console's memory for its charts, over three ranges (5 minutes, 1 hour, 24 hours): samples of pzq's
STATS (one a poll for the last 5 minutes, one each 10 s for the hour, one each 5 minutes for the day;
the rates between two samples, the latest commit latency at its worst since the last sample kept), and
each queue's depth, in flight and dead letters (one each 5 s, 1 minute and 20 minutes). Pure: the poller
hands in the figures and their time (epoch seconds); nothing here reads a clock.

Bounded whatever pzq holds or how long the console runs: the totals 602 + 362 + 290 samples (about
0.3 MB); MAX_CHARTED_QUEUES queues with charts, 61 + 61 + 73 samples each (about 19 KB a queue: 19 MB
for 1,000 queues at the most, measured with tracemalloc over a day of samples)."""

from __future__ import annotations

import collections
import dataclasses

RANGES = {"5m": 5 * 60, "1h": 60 * 60, "24h": 24 * 60 * 60}  # what a chart may show, by its name in URLs
DEFAULT_RANGE = "5m"
RATES = ("produced_total", "delivered_total", "acked_total")
# (range, seconds between two samples kept (0: every poll), samples kept)
TOTALS = (("5m", 0.0, 2 * 300 + 2), ("1h", 10.0, 360 + 2), ("24h", 300.0, 288 + 2))  # (a poll of 0.5 s at least)
QUEUE_TIERS = (("5m", 5.0, 61), ("1h", 60.0, 61), ("24h", 1200.0, 73))
QUEUE_EVERY_S = QUEUE_TIERS[0][1]
QUEUE_FIGURES = ("depth", "inflight", "dead_letters")
MAX_CHARTED_QUEUES = 1000  # queues with charts (the first seen)
WINDOW_S = RANGES["24h"]  # the longest a chart shows

Series = dict[str, list[float]]  # {"t": epoch seconds, "v": values}, oldest first


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    at: float  # epoch seconds (pzq's clock when it says)
    counters: tuple[int, ...]  # RATES, in order
    messages: int
    commit_ms: float  # the worst last-commit figure seen since the sample before


class _Tier:
    """One range's samples of the totals, ``every`` seconds apart at least."""

    __slots__ = ("every", "samples", "worst")

    def __init__(self, every: float, most: int):
        self.every = every
        self.samples: collections.deque[Sample] = collections.deque(maxlen=most)
        self.worst = 0.0


def pick(name: str | None) -> str:
    """A range's name as asked (``?range=``), or the default for anything else."""
    return name if name in RANGES else DEFAULT_RANGE


class History:
    """Samples of the totals and of each queue, in three ranges."""

    def __init__(self) -> None:
        self._tiers = {name: _Tier(every, most) for name, every, most in TOTALS}
        self._queues: dict[str, dict[str, collections.deque[tuple[float, int, int, int]]]] = {}
        self._queues_at = {name: float("-inf") for name, _, _ in QUEUE_TIERS}
        self._last: Sample | None = None

    def add(self, at: float, stats: dict) -> None:
        """Keep one STATS answer's figures, taken at ``at``."""
        if self._last is not None and at <= self._last.at:
            return  # (the same snapshot twice, or a clock stepped back: keep the axis increasing)
        counters = tuple(_int(stats.get(name)) for name in RATES)
        commit_ms = stats.get("commit_ms_last", 0.0)
        commit_ms = float(commit_ms) if _is_number(commit_ms) else 0.0
        messages = _int(stats.get("messages"))
        self._last = Sample(at, counters, messages, commit_ms)
        for name, tier in self._tiers.items():
            tier.worst = max(tier.worst, commit_ms)
            if not tier.samples or at - tier.samples[-1].at >= tier.every:
                tier.samples.append(Sample(at, counters, messages, tier.worst))
                tier.worst = 0.0
            while tier.samples and tier.samples[0].at < at - RANGES[name]:
                tier.samples.popleft()
        queues = stats.get("queues") or {}
        for name, every, _ in QUEUE_TIERS:
            if at - self._queues_at[name] >= every:
                self._queues_at[name] = at
                self._add_queues(name, at, queues)

    def _add_queues(self, tier: str, at: float, queues: dict[str, dict]) -> None:
        if tier == QUEUE_TIERS[0][0]:
            for name in [q for q in self._queues if q not in queues]:  # (deleted queues)
                del self._queues[name]
        for name, figures in queues.items():
            tiers = self._queues.get(name)
            if tiers is None:
                if len(self._queues) >= MAX_CHARTED_QUEUES:
                    continue
                tiers = self._queues[name] = {t: collections.deque(maxlen=most) for t, _, most in QUEUE_TIERS}
            if isinstance(figures, dict):
                depth, inflight, dead = (_int(figures.get(k)) for k in QUEUE_FIGURES)
                tiers[tier].append((at, depth, inflight, dead))

    def _samples(self, range_name: str) -> list[Sample]:
        samples = list(self._tiers[pick(range_name)].samples)
        if self._last is not None and (not samples or samples[-1].at < self._last.at):
            samples.append(self._last)  # (a chart ends with the page's figures, whatever its range)
        return samples

    def series(self, range_name: str = DEFAULT_RANGE) -> dict[str, Series]:
        """The totals' charts over a range: per rate (msg/s between samples), messages stored, commit
        latency (ms)."""
        out: dict[str, Series] = {name: {"t": [], "v": []} for name in (*RATES, "messages", "commit_ms")}
        samples = self._samples(range_name)
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
        fine = self._tiers[DEFAULT_RANGE].samples
        if len(fine) < 2:
            return {name: 0.0 for name in RATES}
        before, after = fine[-2], fine[-1]
        seconds = after.at - before.at
        return {
            name: round(max(0.0, (after.counters[i] - before.counters[i]) / seconds), 1) for i, name in enumerate(RATES)
        }

    def queue_series(
        self, name: str, at: float, figures: dict | None, range_name: str = DEFAULT_RANGE
    ) -> dict[str, Series]:
        """A queue's depth, in flight and dead letters over a range, ending with ``figures`` taken at
        ``at`` (the snapshot the page's figures show, so its charts and figures agree)."""
        out: dict[str, Series] = {k: {"t": [], "v": []} for k in QUEUE_FIGURES}
        tiers = self._queues.get(name)
        for sample_at, *values in tiers[pick(range_name)] if tiers else ():
            if sample_at >= at:
                break
            if sample_at < at - RANGES[pick(range_name)]:
                continue
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
