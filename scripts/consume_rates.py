#!/usr/bin/env python3
"""Drain rate of a batched native consumer (PZQ-BATCH/1: credit, batches, one ACK per batch) against the
legacy send-socket consumer (one delivery and one ack per message), on one server in the same run.

    PYTHONPATH=. .venv/bin/python scripts/consume_rates.py                    # 20,000 messages, 3 rounds
    PYTHONPATH=. .venv/bin/python scripts/consume_rates.py --messages 50000 --batch 100 --rounds 5

Each round fills the queue, drains it with the legacy consumer, fills it again and drains it with the
batched one (the order alternates between rounds, so neither always runs on a warmer server). Printed:
each drain's msg/s, the medians and their ratio, and the server's CPU µs per message for each. The
figures are as noisy as the machine: on a shared one, run it alone and read the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

from pzq.bench.server import PzqServer
from pzq.clients import native as client


def fill(srv: PzqServer, count: int, size: int) -> None:
    body = [b"x" * size]
    with client.Producer(srv.receive, timeout_s=60) as producer:
        results = producer.produce_many((body for _ in range(count)), window=500)
    if not all(r.ok for r in results):
        raise SystemExit("the store refused messages: use fewer or smaller ones")


def drain_legacy(srv: PzqServer, count: int) -> float:
    """Seconds to receive and ack ``count`` messages, one ack per delivery."""
    with client.Consumer(srv.send) as consumer:
        start, got = time.perf_counter(), 0
        while got < count:
            delivery = consumer.receive(timeout_s=10)
            if delivery is None:
                raise SystemExit(f"legacy consumer: nothing within 10 s after {got}")
            consumer.ack(delivery)
            got += 1
        took = time.perf_counter() - start
        consumer.sock.setsockopt(client.zmq.LINGER, 2000)
    return took


def drain_batched(srv: PzqServer, count: int, batch: int) -> float:
    """Seconds to receive and ack ``count`` messages, ``batch`` at a time, one ACK per batch (each
    answered after the server's commit)."""
    with client.BatchConsumer(srv.consume) as consumer:
        start, got = time.perf_counter(), 0
        while got < count:
            messages = consumer.receive(min(batch, count - got), timeout_s=10)
            if not messages:
                raise SystemExit(f"batched consumer: nothing within 10 s after {got}")
            consumer.ack([key for key, _ in messages])
            got += len(messages)
        return time.perf_counter() - start


def server_cpu_s(srv: PzqServer) -> float:
    assert srv.proc is not None
    with open(f"/proc/{srv.proc.pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--batch", type=int, default=100, help="the batched consumer's credit and receive size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    srv = PzqServer(transport="tcp")
    srv.start()
    rates: dict[str, list[float]] = {"legacy": [], "batched": []}
    cpu: dict[str, list[float]] = {"legacy": [], "batched": []}
    try:
        for round_ in range(args.rounds):
            order = ["legacy", "batched"] if round_ % 2 == 0 else ["batched", "legacy"]
            for kind in order:
                fill(srv, args.messages, args.size)
                before = server_cpu_s(srv)
                took = (
                    drain_legacy(srv, args.messages)
                    if kind == "legacy"
                    else drain_batched(srv, args.messages, args.batch)
                )
                used = server_cpu_s(srv) - before
                rates[kind].append(args.messages / took)
                cpu[kind].append(used * 1e6 / args.messages)
                rate = args.messages / took
                print(f"round {round_ + 1} {kind:8} {rate:10,.0f} msg/s  server {cpu[kind][-1]:6.1f} µs/msg")
    finally:
        srv.stop()
    legacy, batched = statistics.median(rates["legacy"]), statistics.median(rates["batched"])
    print(
        f"median: legacy {legacy:,.0f} msg/s ({statistics.median(cpu['legacy']):.1f} µs/msg), batched "
        f"{batched:,.0f} msg/s ({statistics.median(cpu['batched']):.1f} µs/msg): {batched / legacy:.2f}x"
    )


if __name__ == "__main__":
    main()
