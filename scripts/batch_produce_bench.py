"""Batched (PZQ-BATCH/1) against legacy native producers, alternating in one run on one fresh server.

    PYTHONPATH=. .venv/bin/python scripts/batch_produce_bench.py [--messages 50000] [--rounds 3]

One producer process (this one), 100-byte bodies, fsync'd commits (the server's default), the server a
subprocess on a temporary store. Each round sends the same number of messages the legacy way (one per
ZeroMQ message, --window in flight) and then in batches (--batch messages each, --batches in flight),
and prints msg/s and the server's CPU µs per message (from /proc); the medians and their ratio last.
On a busy machine the figures are noisy: run it alone for numbers to quote.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from pzq.clients import native as client


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=400, help="legacy messages in flight")
    parser.add_argument("--batch", type=int, default=100, help="messages per batch")
    parser.add_argument("--batches", type=int, default=4, help="batches in flight")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ep = f"ipc://{tmp}/"
        argv = [sys.executable, "-m", "pzq", "serve", "--database", f"{tmp}/db", "--receive-dsn", ep + "r"]
        argv += ["--send-dsn", ep + "s", "--monitor-dsn", ep + "m", "--disk-reserve", "0"]
        for off in ("phpmq", "emqp-frontend", "emqp-backend", "emqp-publish", "mqks", "api"):
            argv += [f"--{off}-dsn", ""]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    client.monitor_request(ep + "m", timeout_s=0.2)
                    break
                except client.ClientError:
                    if time.monotonic() > deadline:
                        raise
            bodies = [[b"%0100d" % i] for i in range(args.messages)]
            figures: dict[str, list[tuple[float, float]]] = {"legacy": [], "batched": []}
            with client.Producer(ep + "r", timeout_s=30) as producer:
                if producer.batch_caps() is None:
                    sys.exit("this server does not speak PZQ-BATCH/1")
                for round_ in range(args.rounds):
                    for name in ("legacy", "batched"):
                        cpu0, t0 = cpu_s(server.pid), time.perf_counter()
                        if name == "legacy":
                            results = producer.produce_many(bodies, window=args.window)
                        else:
                            results = producer.send_many(bodies, batch=args.batch, window=args.batches)
                        elapsed, cpu = time.perf_counter() - t0, cpu_s(server.pid) - cpu0
                        if not all(r.ok for r in results):
                            sys.exit(f"{name}: some messages were refused")
                        rate, us = args.messages / elapsed, cpu / args.messages * 1e6
                        figures[name].append((rate, us))
                        print(f"round {round_ + 1} {name:8} {rate:10,.0f} msg/s  server {us:6.1f} µs/msg", flush=True)
        finally:
            server.terminate()
            server.wait(30)
    legacy = statistics.median(r for r, _ in figures["legacy"])
    batched = statistics.median(r for r, _ in figures["batched"])
    legacy_us = statistics.median(u for _, u in figures["legacy"])
    batched_us = statistics.median(u for _, u in figures["batched"])
    print(
        f"median: legacy {legacy:,.0f} msg/s ({legacy_us:.1f} µs/msg), batched {batched:,.0f} msg/s "
        f"({batched_us:.1f} µs/msg): {batched / legacy:.1f}x"
    )


if __name__ == "__main__":
    main()
