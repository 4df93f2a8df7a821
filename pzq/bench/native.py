"""`pzq bench` (--protocol pzq): how fast is pzq on this machine, next to what Python + ZeroMQ can do
without storage.

The orchestrator (this process) starts a real `pzq serve` subprocess on a fresh store, then runs each
phase with producer and consumer *processes* (multiprocessing, spawn), collects their raw latencies,
and reads the server's CPU time from /proc. The same producer code drives a no-storage ROUTER echo
server for the ceiling. See scripts/README.md for how each published figure was made.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from pzq.bench.batched import run_batched_consumer, run_batched_producer
from pzq.bench.phases import BenchOptions, Progress, mp, run_phase
from pzq.bench.phpmq import phases as phpmq_phases
from pzq.bench.report import machine, medians
from pzq.bench.server import PzqServer, free_ports
from pzq.bench.workers import TAG_SHIFT, run_echo_server, run_forwarder
from pzq.clients import native as client
from pzq.errors import ClientError

__all__ = ["BenchOptions", "bench"]


def server_for(options: BenchOptions, code: str | None = None) -> PzqServer:
    """The server under test, not started yet; ``code``: another pzq tree's server (legacy clients only:
    it may not have the batched consume endpoint)."""
    return PzqServer(
        code=code,
        consume=code is None,
        gateways=("phpmq",) if options.protocol == "phpmq" else (),
        transport=options.transport,
        args=(
            *("--ack-timeout", "30000000"),
            "--hard-sync" if options.hard_sync else "--no-hard-sync",
            *options.server_args,
        ),
    )


def preload(endpoint: str, count: int, size: int) -> None:
    """Store ``count`` messages through the running server's native producer endpoint, 10,000 per
    window of acks (the bench is a client: it writes no store itself); ClientError if one is refused."""
    body = b"\xff" * 8 + ((1 << TAG_SHIFT) - 1).to_bytes(8, "big") + b"p" * max(0, size - 16)
    with client.Producer(endpoint, timeout_s=60) as producer:
        for start in range(0, count, 10_000):
            refused = [r for r in producer.produce_many([[body]] * min(10_000, count - start), window=1000) if not r.ok]
            if refused:
                raise ClientError(f"the preload was refused at message {start}: {refused[0].error}")


def one_run(options: BenchOptions, progress: Progress, code: str | None = None) -> tuple[dict, dict]:
    """One full run on a fresh server (of the pzq tree ``code``, if given): its figures and samples."""
    server = server_for(options, code)
    result: dict = {}
    samples: dict = {}
    try:
        server.start()
        if options.preload:  # stored before the restart that is measured
            preload(server.receive, options.preload, options.size)
            server.stop()
            result["restart_s"] = round(server.start(), 3)
        kw: dict[str, Any] = dict(progress=progress, server=server)
        if options.protocol == "phpmq":
            return phpmq_phases(options, server, kw, result), samples
        legacy, batched = options.client in ("legacy", "both"), options.client in ("batched", "both")
        if legacy:
            samples.update(legacy_phases(options, server, kw, result, e2e=False))
        if batched:
            samples.update(batched_phases(options, server, kw, result, e2e=False))
        if legacy and not options.preload:  # a backlog would be consumed first: end-to-end needs an empty queue
            samples.update(legacy_phases(options, server, kw, result, e2e=True))
        if batched and not options.preload:
            samples.update(batched_phases(options, server, kw, result, e2e=True))
        result["server_rss_mb"] = round(server.rss_mb(), 1)
        if options.ceiling and legacy:  # (the ceiling runs the legacy producer's frames)
            result.update(ceiling(options, server.workdir, progress))
    finally:
        server.close()
    return result, samples


def legacy_phases(options: BenchOptions, server: PzqServer, kw: dict, result: dict, *, e2e: bool) -> dict:
    """The legacy client's phases (one message a frame list, a window of acks): producers at window 1 and
    at ``options.window`` then the drain, or (``e2e``) end to end, at full speed and paced. Their figures
    go into ``result``; the latency samples are returned."""
    samples: dict = {}
    if not e2e:
        for key, label, window, count, producers in (
            ("producer_w1", "producer w1", 1, options.latency_count, 1),
            ("producer_w100", f"producer w{options.window}", options.window, options.count, options.producers),
        ):
            result[key], s = run_phase(
                label, options, server.receive, None, count=count, window=window, producers=producers, consumers=0, **kw
            )
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
        return samples
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
    return samples


def batched_phases(options: BenchOptions, server: PzqServer, kw: dict, result: dict, *, e2e: bool) -> dict:
    """PZQ-BATCH/1 phases with the same messages in flight as the legacy ones (``options.window``): the
    producer alone and a draining consumer (``e2e`` False), or end to end on an empty queue (True)."""
    samples: dict = {}
    batch: dict[str, Any] = dict(
        batch=options.batch_size, producer_fn=run_batched_producer, consumer_fn=run_batched_consumer
    )
    if not e2e:
        result["producer_batched"], s = run_phase(
            f"batched producer {options.window}",
            options,
            server.receive,
            None,
            count=options.count,
            window=options.window,
            producers=options.producers,
            consumers=0,
            **batch,
            **kw,
        )
        samples.update(s)
        result["consumer_batched"], _ = run_phase(
            "batched consumer drain",
            options,
            None,
            server.consume,
            count=options.count,
            window=options.window,
            producers=0,
            consumers=options.consumers,
            **batch,
            **kw,
        )
        return samples
    result["e2e_batched"], s = run_phase(
        "batched end to end",
        options,
        server.receive,
        server.consume,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=options.consumers,
        **batch,
        **kw,
    )
    samples.update(s)
    return samples


def ceiling(options: BenchOptions, workdir: str, progress: Progress) -> dict:
    """The same producer code against a ROUTER that acks at once and stores nothing."""
    endpoint = f"ipc://{workdir}/echo" if options.transport == "ipc" else f"tcp://127.0.0.1:{free_ports(1)[0]}"
    ready = mp.Event()
    echo = mp.Process(target=run_echo_server, args=(endpoint, ready), daemon=True)
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
        for n, p in zip(("receive", "send"), free_ports(2), strict=True)
    )
    ready = mp.Event()
    forwarder = mp.Process(target=run_forwarder, args=(receive, send, ready), daemon=True)
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
    progress = Progress(options.progress)
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
