#!/usr/bin/env python3
"""`pzq backup` of a big store under load: how long it takes, how big the copy is, how much the store
grows meanwhile, and the longest wait of an honest monitor client before and during the copy.

    PYTHONPATH=. .venv/bin/python scripts/backup_figures.py --messages 1000000 --size 1000

A `pzq serve` (ipc, temp directory) is filled with ``--messages`` bodies of ``--size`` bytes; then a
producer and a consumer (batched, in threads) keep it busy while a pinger sends STATS to the monitor
every 10 ms and times each answer. `pzq backup` runs as its own process, as an operator would run it.
A monitor answer waits for the loop's current turn, so its longest wait bounds the loop's longest turn.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time

from pzq.bench.server import PzqServer
from pzq.clients import native as client


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=1000, help="bytes per body")
    args = parser.parse_args()
    srv = PzqServer(transport="ipc", args=("--disk-reserve", "0", "--max-store-size", "8G"), prefix="pzq-backup-")
    try:
        srv.start()
        t0 = time.monotonic()
        with client.Producer(srv.receive, timeout_s=60) as producer:
            body = b"x" * args.size
            for start in range(0, args.messages, 10_000):
                results = producer.send_many([[body] for _ in range(min(10_000, args.messages - start))])
                assert all(r.ok for r in results), "a produce was refused"
        print(f"filled: {args.messages} x {args.size} B in {time.monotonic() - t0:.1f} s")
        stop = threading.Event()
        waits: list[tuple[float, float]] = []  # (when, seconds)

        def ping() -> None:
            while not stop.is_set():
                began = time.monotonic()
                client.monitor_request(srv.monitor, "STATS", timeout_s=30)
                waits.append((began, time.monotonic() - began))
                stop.wait(0.01)

        def load_produce() -> None:
            with client.Producer(srv.receive, timeout_s=60) as p:
                while not stop.is_set():
                    p.send_many([[b"y" * args.size] for _ in range(100)])

        def load_consume() -> None:
            with client.BatchConsumer(srv.consume) as c:
                while not stop.is_set():
                    batch = c.receive(100, timeout_s=5)
                    c.ack([key for key, _ in batch])

        threads = [threading.Thread(target=f, daemon=True) for f in (ping, load_produce, load_consume)]
        for thread in threads:
            thread.start()
        time.sleep(3)  # (a baseline of the loaded server before the copy)
        data = os.path.join(srv.database, "data.mdb")
        before_size = os.path.getsize(data)
        dest = os.path.join(srv.workdir, "backups", "b1")
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pzq", "backup", "--database", srv.database, dest], check=False)
        ended = time.monotonic()
        time.sleep(1)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert done.returncode == 0, "pzq backup failed"
        before = [w for at, w in waits if at < began]
        during = [w for at, w in waits if began <= at <= ended]
        print(
            f"backup: {ended - began:.1f} s, copy {os.path.getsize(os.path.join(dest, 'data.mdb')) / 2**20:.0f} MiB, "
            f"store file {before_size / 2**20:.0f} MiB before and {os.path.getsize(data) / 2**20:.0f} MiB after"
        )
        for name, part in (("before the copy", before), ("during it", during)):
            part.sort()
            p50, p99 = (part[len(part) // 2], part[int(len(part) * 0.99)]) if part else (0.0, 0.0)
            print(
                f"monitor waits {name} (bound the loop's turn): p50 {p50 * 1000:.0f} ms, "
                f"p99 {p99 * 1000:.0f} ms, longest {max(part, default=0) * 1000:.0f} ms, n={len(part)}"
            )
        slow = [(at - began, w) for at, w in waits if began <= at <= ended and w > 0.1]
        print("waits over 100 ms during the copy (s into it, ms):", [(round(a, 1), round(w * 1000)) for a, w in slow])
    finally:
        srv.close()
        shutil.rmtree(srv.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
