"""`pzq bench`: how fast is pzq on this machine, next to what Python + ZeroMQ can do without storage.

The orchestrator (this process) starts a real `pzq serve` subprocess on a fresh store, then runs each
phase with producer and consumer *processes* (multiprocessing, spawn), collects their raw latencies,
and reads the server's CPU time from /proc. The same producer code drives a no-storage ROUTER echo
server for the ceiling. See scripts/README.md for how each published figure was made.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from pzq.bench.report import latency_ms, machine, medians
from pzq.bench.workers import (
    TAG_SHIFT,
    ConsumerJob,
    ProducerJob,
    run_consumer,
    run_echo_server,
    run_forwarder,
    run_phpmq_consumer,
    run_phpmq_producer,
    run_producer,
)
from pzq.clients import native as client
from pzq.errors import PzqError

_mp = multiprocessing.get_context("spawn")


@dataclasses.dataclass(frozen=True)
class BenchOptions:
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


class BenchServer:
    """A `pzq serve` subprocess on a temp store; knows its pid for CPU and RSS readings."""

    def __init__(self, options: BenchOptions, workdir: str):
        self.workdir = workdir
        self.database = os.path.join(workdir, "db")
        if options.transport == "ipc":
            self.receive, self.send, self.monitor = (f"ipc://{workdir}/{n}" for n in ("receive", "send", "monitor"))
        else:
            ports = _free_ports(3)
            self.receive, self.send, self.monitor = (f"tcp://127.0.0.1:{p}" for p in ports)
        self.phpmq = f"tcp://127.0.0.1:{_free_ports(1)[0]}" if options.protocol == "phpmq" else ""
        self.argv = [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            self.database,
            "--receive-dsn",
            self.receive,
            "--send-dsn",
            self.send,
            "--monitor-dsn",
            self.monitor,
            "--log-level",
            "warning",
            "--ack-timeout",
            "30000000",
            "--phpmq-dsn",
            self.phpmq,
            "--emqp-frontend-dsn",
            "",
            "--emqp-backend-dsn",
            "",
            "--emqp-publish-dsn",
            "",
            "--api-dsn",
            "",
            "--mqks-dsn",
            "",
            "--hard-sync" if options.hard_sync else "--no-hard-sync",
            *options.server_args,
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Start and return the seconds until MONITOR answered (the store is open, sockets bound)."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, "server.log"), "ab")
        )
        while time.monotonic() - t0 < 60:
            if self.proc.poll() is not None:
                raise PzqError(f"pzq serve exited with {self.proc.returncode}; see {self.workdir}/server.log")
            try:
                client.monitor_request(self.monitor, timeout_ms=100)
                return time.monotonic() - t0
            except client.ClientError:
                continue
        raise PzqError("pzq serve did not answer MONITOR within 60 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    def rss_mb(self) -> float:
        if self.proc is None:
            return 0.0
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def commits(self) -> int:
        return int(client.stats(self.monitor)["syncs"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 once it is gone), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class _Progress:
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


def _split(total: int, parts: int) -> list[int]:
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
    progress: _Progress,
    server: BenchServer | None = None,
    producer_fn=run_producer,
    consumer_fn=run_consumer,
) -> tuple[dict, dict[str, list[int]]]:
    """Run producers (if ``receive``) and consumers (if ``send``) together; return figures and samples.

    ``producer_fn``/``consumer_fn`` are the process bodies: pzq's native clients by default; the peer
    comparison (scripts/compare_peers.py) passes its Redis and RabbitMQ clients with the same contract.
    """
    done = _mp.Event()
    produced, consumed = _mp.Value("q", 0), _mp.Value("q", 0)
    p_results, c_results = _mp.Queue(), _mp.Queue()
    per_producer = _split(count, producers) if receive else [count]
    workers = len(per_producer) * bool(receive) + consumers * bool(send)
    start = _mp.Barrier(workers + 1)  # every worker has connected before the clock starts
    procs = []
    if receive:
        for i, n in enumerate(per_producer):
            pjob = ProducerJob(receive, i, n, window, options.size, rate / producers if rate else 0.0)
            procs.append(_mp.Process(target=producer_fn, args=(pjob, start, produced, p_results), daemon=True))
    if send:
        for i in range(consumers):
            cjob = ConsumerJob(send, i, len(per_producer), max(per_producer))
            procs.append(_mp.Process(target=consumer_fn, args=(cjob, start, consumed, done, c_results), daemon=True))
    for p in procs:
        p.start()
    cpu0 = server.cpu_seconds() if server else 0.0
    syncs0 = server.commits() if server else None
    start.wait(timeout=120)
    t0 = time.monotonic()
    stop_bar = threading.Event()
    bar = progress.run(label, consumed if send else produced, count, stop_bar)
    figures: dict = {}
    samples: dict[str, list[int]] = {}
    try:
        p_out = [_result(p_results, procs) for _ in range(producers)] if receive else []
        if send:
            while consumed.value < count and any(p.is_alive() for p in procs):
                time.sleep(0.01)
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
    if server:
        figures["server_cpu_pct"] = round(100 * (server.cpu_seconds() - cpu0) / wall, 1)
        if syncs0 is not None:
            figures["commits"] = server.commits() - syncs0
    errors = [r.error for r in p_out if r.error]
    if receive and not send:
        seconds = max(r.seconds for r in p_out)
        lat = [x for r in p_out for x in r.latencies_ns]
        figures.update(
            {
                "msg_s": round(sum(r.acked for r in p_out) / seconds),
                "refused": sum(r.refused for r in p_out),
                **latency_ms(lat, "ack"),
            }
        )
        samples[f"{label}: send to ack"] = lat
    if send:
        errors += [r.error for r in c_out if r.error and consumed.value < count]
        first = min(r.first_ns for r in c_out if r.first_ns) if any(r.first_ns for r in c_out) else 0
        last = max(r.last_ns for r in c_out)
        received = sum(r.received for r in c_out)
        seconds = wall if not receive else max((last - first) / 1e9, 1e-9)
        figures["msg_s"] = round(received / max(seconds, 1e-9))
        if receive:
            unique = sum(
                1 for i in range(len(per_producer)) for j in range(per_producer[i]) if any(r.seen[i][j] for r in c_out)
            )
            figures.update({"lost": count - unique, "duplicated": received - unique})
            lat = [x for r in c_out for x in r.latencies_ns]
            figures.update(latency_ms(lat, "lat"))
            samples[f"{label}: send to consume"] = lat
    if errors:
        figures["errors"] = len(errors)
        print(f"pzq bench: {label}: {errors[0]}", file=sys.stderr)
    return figures, samples


def _result(results, procs, limit_s: float = 600):
    """The next worker result; fails fast when every worker died without sending one (a crash)."""
    import queue

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


def preload(database: str, count: int, size: int) -> None:
    """Fill the store directly (the server is not running yet), 10,000 messages per commit."""
    from pzq.store import Store

    store = Store(database, max_size=max(4 << 30, count * (size + 200)))
    body = b"\xff" * 8 + ((1 << TAG_SHIFT) - 1).to_bytes(8, "big") + b"p" * max(0, size - 16)
    now = time.time_ns() // 1000
    for i in range(count):
        store.put("default", [body], now_us=now)
        if i % 10_000 == 9_999:
            store.commit()
    store.commit()
    store.close()


def one_run(options: BenchOptions, progress: _Progress) -> tuple[dict, dict]:
    workdir = tempfile.mkdtemp(prefix="pzq-bench-")
    server = BenchServer(options, workdir)
    result: dict = {}
    samples: dict = {}
    try:
        if options.preload:
            preload(server.database, options.preload, options.size)
        server.start()
        if options.preload:
            server.stop()
            result["restart_s"] = round(server.start(), 3)
        kw: dict[str, Any] = dict(progress=progress, server=server)
        if options.protocol == "phpmq":
            return _phpmq_run(options, server, kw, result), samples
        w1, s = run_phase(
            "producer w1",
            options,
            server.receive,
            None,
            count=options.latency_count,
            window=1,
            producers=1,
            consumers=0,
            **kw,
        )
        result["producer_w1"] = w1
        samples.update(s)
        wn, s = run_phase(
            f"producer w{options.window}",
            options,
            server.receive,
            None,
            count=options.count,
            window=options.window,
            producers=options.producers,
            consumers=0,
            **kw,
        )
        result["producer_w100"] = wn
        samples.update(s)
        drain = options.count + options.latency_count
        result["consumer"], _ = run_phase(
            "consumer drain",
            options,
            None,
            server.send,
            count=drain,
            window=0,
            producers=0,
            consumers=options.consumers,
            **kw,
        )
        if not options.preload:  # a backlog would be consumed first: end-to-end needs an empty queue
            result["e2e"], s = run_phase(
                "end to end",
                options,
                server.receive,
                server.send,
                count=options.count,
                window=options.window,
                producers=options.producers,
                consumers=options.consumers,
                **kw,
            )
            samples.update(s)
            paced = int(options.rate * options.paced_seconds)
            result["e2e_paced"], s = run_phase(
                f"paced {options.rate:g}/s",
                options,
                server.receive,
                server.send,
                count=paced,
                window=max(options.window, 1000),
                producers=options.producers,
                consumers=options.consumers,
                rate=options.rate,
                **kw,
            )
            samples.update(s)
        result["server_rss_mb"] = round(server.rss_mb(), 1)
        if options.ceiling:
            result.update(ceiling(options, workdir, progress))
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return result, samples


def _phpmq_run(options: BenchOptions, server: BenchServer, kw: dict, result: dict) -> dict:
    """The phases that mean something for PHPMQ, which has no receipt for a send: send rate (until
    written), consumer drain, end to end and paced (both prove every message was stored and delivered)."""
    kw = {**kw, "producer_fn": run_phpmq_producer, "consumer_fn": run_phpmq_consumer}
    result["send"], _ = run_phase(
        "phpmq send",
        options,
        server.phpmq,
        None,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=0,
        **kw,
    )
    result["consumer"], _ = run_phase(
        "phpmq consumer drain",
        options,
        None,
        server.phpmq,
        count=options.count,
        window=0,
        producers=0,
        consumers=options.consumers,
        **kw,
    )
    result["e2e"], _ = run_phase(
        "phpmq end to end",
        options,
        server.phpmq,
        server.phpmq,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=options.consumers,
        **kw,
    )
    result["e2e_paced"], _ = run_phase(
        f"phpmq paced {options.rate:g}/s",
        options,
        server.phpmq,
        server.phpmq,
        count=int(options.rate * options.paced_seconds),
        window=1,
        producers=options.producers,
        consumers=options.consumers,
        rate=options.rate,
        **kw,
    )
    result["server_rss_mb"] = round(server.rss_mb(), 1)
    return result


def ceiling(options: BenchOptions, workdir: str, progress: _Progress) -> dict:
    """The same producer code against a ROUTER that acks at once and stores nothing."""
    endpoint = f"ipc://{workdir}/echo" if options.transport == "ipc" else f"tcp://127.0.0.1:{_free_ports(1)[0]}"
    ready = _mp.Event()
    echo = _mp.Process(target=run_echo_server, args=(endpoint, ready), daemon=True)
    echo.start()
    try:
        ready.wait(30)
        w1, _ = run_phase(
            "ceiling w1",
            options,
            endpoint,
            None,
            count=options.latency_count,
            window=1,
            producers=1,
            consumers=0,
            progress=progress,
        )
        wn, _ = run_phase(
            f"ceiling w{options.window}",
            options,
            endpoint,
            None,
            count=options.count,
            window=options.window,
            producers=options.producers,
            consumers=0,
            progress=progress,
        )
    finally:
        echo.kill()
        echo.join(5)
    receive, send = (
        f"ipc://{workdir}/fwd-{n}" if options.transport == "ipc" else f"tcp://127.0.0.1:{p}"
        for n, p in zip(("receive", "send"), _free_ports(2), strict=True)
    )
    ready = _mp.Event()
    forwarder = _mp.Process(target=run_forwarder, args=(receive, send, ready), daemon=True)
    forwarder.start()
    try:
        ready.wait(30)
        e2e, _ = run_phase(
            "ceiling end to end",
            options,
            receive,
            send,
            count=options.count,
            window=options.window,
            producers=options.producers,
            consumers=options.consumers,
            progress=progress,
        )
        paced, _ = run_phase(
            f"ceiling paced {options.rate:g}/s",
            options,
            receive,
            send,
            count=int(options.rate * options.paced_seconds),
            window=max(options.window, 1000),
            producers=options.producers,
            consumers=options.consumers,
            rate=options.rate,
            progress=progress,
        )
    finally:
        forwarder.kill()
        forwarder.join(5)
    return {"ceiling_w1": w1, "ceiling_w100": wn, "ceiling_e2e": e2e, "ceiling_paced": paced}


def bench(options: BenchOptions) -> dict:
    """Run ``options.runs`` full runs and return every run, the medians and the last run's samples."""
    progress = _Progress(options.progress)
    runs: list[dict] = []
    samples: dict[str, list[int]] = {}
    for i in range(options.runs):
        if progress.enabled:
            print(f"run {i + 1} of {options.runs}", file=sys.stderr)
        result, samples = one_run(options, progress)
        runs.append(result)
    return {
        "machine": machine(),
        "options": dataclasses.asdict(options),
        "runs": runs,
        "median": medians(runs),
        "samples": samples,
    }
