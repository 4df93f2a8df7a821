#!/usr/bin/env python3
"""Deliveries a message while commits fail on a full disk: the figure of issue 26's "redelivery storm".

    sudo PYTHONPATH=. .venv/bin/python scripts/full_disk_drain.py      # needs root: mounts a 24 MiB tmpfs

A server on a small tmpfs (no --disk-reserve to give back) is filled until producers are refused;
something else then takes every byte left, and a native consumer drains (acking each delivery) for
``--seconds`` while every commit fails; then the space comes back and the rest is drained. Prints the
deliveries in each part and per message (1.0: each message delivered once).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from pzq.bench.server import PzqServer
from pzq.clients import native as client


def consume(srv: PzqServer, until) -> int:
    """Receive and ack until ``until()`` says stop (asked every 100 deliveries, or when none came in
    200 ms); how many deliveries came."""
    got = 0
    with client.Consumer(srv.send) as consumer:
        while not until():
            for _ in range(100):
                delivery = consumer.receive(timeout_s=0.2)
                if delivery is None:
                    break
                consumer.ack(delivery)
                got += 1
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the consumer drains a full disk")
    args = parser.parse_args()
    disk = Path(tempfile.mkdtemp(prefix="pzq-full-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(disk)], check=True)
    srv = PzqServer(transport="ipc", args=("--min-disk-free", "4M", "--disk-reserve", "0"), prefix="pzq-full-disk-")
    srv.argv[srv.argv.index("--database") + 1] = str(disk / "db")
    try:
        srv.start(timeout_s=20)
        stored = 0
        with client.Producer(srv.receive, timeout_s=10) as producer:
            while True:
                results = producer.produce_many([[os.urandom(4096)] for _ in range(50)], window=50)
                stored += sum(r.ok for r in results)
                if not all(r.ok for r in results):
                    break
        with open(disk / "filler", "wb") as filler:  # something else takes every byte left
            try:
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
            except OSError:
                pass
        end = time.monotonic() + args.seconds
        full = consume(srv, lambda: time.monotonic() > end)
        os.unlink(disk / "filler")
        end = time.monotonic() + 60
        rest = consume(srv, lambda: not client.stats(srv.monitor)["messages"] or time.monotonic() > end)
        left = client.stats(srv.monitor)["messages"]
        print(f"{stored} messages stored; {full} deliveries in {args.seconds:g} s of failing commits, {rest} after")
        print(f"{(full + rest) / stored:.2f} deliveries a message; {left} left undrained after 60 s")
    finally:
        srv.close(kill=True)
        subprocess.run(["umount", "-l", str(disk)])
        os.rmdir(disk)


if __name__ == "__main__":
    main()
