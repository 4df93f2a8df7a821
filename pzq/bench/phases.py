"""One benchmark phase: producer and consumer processes started together, released at once by a
barrier, and their raw results turned into figures (counts, seconds, rates, latency percentiles).

The figures of a phase always carry what its rate was computed from (``acked`` or ``received``, and
``seconds``), so that a reader of the JSON can check each rate against its count and time.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pzq.bench.report import latency_ms
from pzq.bench.workers import ConsumerJob, ProducerJob, run_consumer, run_producer
from pzq.errors import PzqError

mp = multiprocessing.get_context("spawn")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """`pzq bench`'s knobs for the native and PHPMQ protocols (the CLI's options of the same names)."""

    count: int = 100_000
    latency_count: int = 10_000
    size: int = 100
    window: int = 100
    producers: int = 1
    consumers: int = 1
    rate: float = 5000.0
    paced_seconds: float = 5.0
    runs: int = 3
    preload: int = 0
    transport: str = "tcp"
    hard_sync: bool = True
    ceiling: bool = True
    server_args: tuple[str, ...] = ()
    progress: bool = True
    protocol: str = "native"
    client: str = "legacy"  # legacy, batched or both (pzq only: PZQ-BATCH/1 producers and consumers)
    batch_size: int = 50  # batched producer: messages per batch; window // batch_size batches in flight


class Measured(Protocol):
    """What a phase reads of the system under test: pzq here, Redis or RabbitMQ in compare_peers."""

    def cpu_seconds(self) -> float: ...

    def commits(self) -> int | None: ...


class Progress:
    """A one-line progress bar on stderr while a phase runs (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()

    def run(self, label: str, counter, total: int, stop: threading.Event) -> threading.Thread:
        def show():
            while not stop.wait(0.2):
                self._draw(label, counter.value, total)
            self._draw(label, counter.value, total)
            sys.stderr.write("\n")

        thread = threading.Thread(target=show, daemon=True)
        if self.enabled:
            thread.start()
        return thread

    @staticmethod
    def _draw(label: str, done: int, total: int) -> None:
        width = 30
        filled = min(width, int(width * done / max(total, 1)))
        sys.stderr.write(f"\r{label:<24} [{'#' * filled}{'.' * (width - filled)}] {done:>9,}/{total:,}")
        sys.stderr.flush()


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_phase(
    label: str,
    options: BenchOptions,
    receive: str | None,
    send: str | None,
    *,
    count: int,
    window: int,
    producers: int,
    consumers: int,
    rate: float = 0.0,
    batch: int = 0,
    progress: Progress,
    server: Measured | None = None,
    producer_fn: Callable[..., None] = run_producer,
    consumer_fn: Callable[..., None] = run_consumer,
) -> tuple[dict, dict[str, list[int]]]:
    """Run producers (if ``receive``) and consumers (if ``send``) together; return figures and samples.

    ``producer_fn``/``consumer_fn`` are the process bodies: pzq's native clients by default; PHPMQ's, the
    batched ones (pzq.bench.batched: ``batch`` messages per batch, ``window`` messages in flight, a credit of
    ``window``), and the peer comparison's Redis and RabbitMQ clients (scripts/compare_peers.py) keep the
    same contract.
    """
    done = mp.Event()
    produced, consumed = mp.Value("q", 0), mp.Value("q", 0)
    p_results, c_results = mp.Queue(), mp.Queue()
    per_producer = split(count, producers) if receive else [count]
    workers = len(per_producer) * bool(receive) + consumers * bool(send)
    start = mp.Barrier(workers + 1)  # every worker has connected before the clock starts
    procs = []
    if receive:
        for i, n in enumerate(per_producer):
            pjob = ProducerJob(receive, i, n, window, options.size, rate / producers if rate else 0.0, batch=batch)
            procs.append(mp.Process(target=producer_fn, args=(pjob, start, produced, p_results), daemon=True))
    if send:
        for i in range(consumers):
            cjob = ConsumerJob(send, i, len(per_producer), max(per_producer), credit=window or options.window)
            procs.append(mp.Process(target=consumer_fn, args=(cjob, start, consumed, done, c_results), daemon=True))
    for p in procs:
        p.start()
    marks = _ServerMarks.take(server)
    start.wait(timeout=120)
    t0 = time.monotonic()
    stop_bar = threading.Event()
    bar = progress.run(label, consumed if send else produced, count, stop_bar)
    p_out: list = []
    c_out: list = []
    try:
        p_out = [_result(p_results, procs) for _ in range(producers)] if receive else []
        if send:
            while consumed.value < count and any(p.is_alive() for p in procs):
                time.sleep(0.01)  # the progress counter has no wait primitive; this is its poll
            done.set()
            c_out = [_result(c_results, procs) for _ in range(consumers)]
        wall = time.monotonic() - t0
    finally:
        done.set()
        stop_bar.set()
        if bar.is_alive():
            bar.join(2)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    figures: dict[str, Any] = {"messages": count, **marks.figures(server, wall, count)}
    samples: dict[str, list[int]] = {}
    phase = _Outcome(label, bool(receive), p_out, c_out if send else None, per_producer, consumed.value, wall)
    errors = phase.figures(figures, samples)
    if errors:
        figures["errors"] = len(errors)
        print(f"pzq bench: {label}: {errors[0]}", file=sys.stderr)
    return figures, samples


@dataclasses.dataclass(frozen=True)
class _ServerMarks:
    """The server's counters when a phase begins, for what it spent in the phase (none without a server)."""

    cpu: float = 0.0
    syncs: int | None = None
    # (a pzq server's meta pages synced on their own: one sync a commit where the next commit carried it)
    meta: int | None = None

    @classmethod
    def take(cls, server: Measured | None) -> _ServerMarks:
        if not server:
            return cls()
        meta_syncs = getattr(server, "meta_syncs", None)
        return cls(server.cpu_seconds(), server.commits(), meta_syncs() if meta_syncs else None)

    def figures(self, server: Measured | None, wall: float, count: int) -> dict[str, Any]:
        if not server:
            return {}
        cpu = server.cpu_seconds() - self.cpu
        figures: dict[str, Any] = {"server_cpu_pct": round(100 * cpu / wall, 1)}
        # What the server spends per message, whatever the clients' pace: the figure to compare.
        figures["server_cpu_s"] = round(cpu, 4)
        figures["server_cpu_us"] = round(cpu / count * 1e6, 2)
        syncs = server.commits()
        if self.syncs is not None and syncs is not None:
            figures["commits"] = syncs - self.syncs
        meta_syncs = getattr(server, "meta_syncs", None)
        if meta_syncs and self.meta is not None:
            figures["meta_syncs"] = meta_syncs() - self.meta
        return figures


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What a phase's producers (``p_out``) and consumers (``c_out``, None without consumers) reported."""

    label: str
    receive: bool
    p_out: list
    c_out: list | None
    per_producer: list[int]
    consumed: int
    wall: float

    def figures(self, figures: dict[str, Any], samples: dict[str, list[int]]) -> list[str]:
        """Add the clients' figures and latency samples; return the errors they met."""
        label, receive, p_out, c_out, per_producer = self.label, self.receive, self.p_out, self.c_out, self.per_producer
        count = figures["messages"]
        errors = [r.error for r in p_out if r.error]
        if receive:
            figures["acked"] = sum(r.acked for r in p_out)
            figures["refused"] = sum(r.refused for r in p_out)
        if receive and c_out is None:
            seconds = max(max(r.seconds for r in p_out), 1e-9)
            lat = [x for r in p_out for x in r.latencies_ns]
            figures.update({"seconds": round(seconds, 6), "msg_s": round(figures["acked"] / seconds)})
            figures.update(latency_ms(lat, "ack"))
            samples[f"{label}: send to ack"] = lat
        if c_out is not None:
            errors += [r.error for r in c_out if r.error and self.consumed < count]
            first = min(r.first_ns for r in c_out if r.first_ns) if any(r.first_ns for r in c_out) else 0
            last = max(r.last_ns for r in c_out)
            received = sum(r.received for r in c_out)
            # Consumers alone: from the release to the last message; with producers: first to last consumed.
            seconds = max(self.wall if not receive else (last - first) / 1e9, 1e-9)
            figures.update({"received": received, "seconds": round(seconds, 6), "msg_s": round(received / seconds)})
            if receive:
                unique = sum(
                    1
                    for i in range(len(per_producer))
                    for j in range(per_producer[i])
                    if any(r.seen[i][j] for r in c_out)
                )
                figures.update({"lost": count - unique, "duplicated": received - unique})
                lat = [x for r in c_out for x in r.latencies_ns]
                figures.update(latency_ms(lat, "lat"))
                samples[f"{label}: send to consume"] = lat
        return errors


def _result(results, procs, limit_s: float = 600):
    """The next worker result; fails fast when every worker died without sending one (a crash)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                try:
                    return results.get(timeout=2)
                except queue.Empty:
                    raise PzqError("a benchmark process died without a result (see its traceback above)") from None
    raise PzqError(f"no benchmark result within {limit_s} s")
