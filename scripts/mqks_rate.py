#!/usr/bin/env python3
"""publish -> consume -> ack throughput through the MQKS gateway, manual ack, durable store.

    .venv/bin/python scripts/mqks_rate.py [--messages 10000] [--runs 3] [--size 100]

One publisher connection publishes N messages (pipelined, unconfirmed, as MQKS clients do) while one
consumer connection (--manual-ack) receives each and acks it. The clock runs from the first publish
to the last ack confirmed (`ack --confirm` of the last message, answered after its commit). Each run
uses a fresh server and store (fsync'd commits). The reference MQKS published about 15,500 msg/s for
this with manual ack, in memory, on unknown hardware.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pzq.clients.mqks import MqksClient, parse_delivery  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(n: int, size: int) -> float:
    workdir = tempfile.mkdtemp(prefix="pzq-mqks-rate-")
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            f"{workdir}/db",
            "--receive-dsn",
            f"ipc://{workdir}/r",
            "--send-dsn",
            f"ipc://{workdir}/s",
            "--monitor-dsn",
            f"ipc://{workdir}/m",
            "--mqks-dsn",
            endpoint,
            "--phpmq-dsn",
            "",
            "--emqp-frontend-dsn",
            "",
            "--emqp-backend-dsn",
            "",
            "--emqp-publish-dsn",
            "",
            "--api-dsn",
            "",
            "--ack-timeout",
            "60000000",
            "--log-level",
            "warning",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                consumer = MqksClient(endpoint, timeout_s=30)
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        publisher = MqksClient(endpoint, timeout_s=30, prefix="p")
        consumer_id = consumer.consume("rate", ["rate-event"], manual_ack=True)
        data = "x" * size

        def publish() -> None:
            lines = b"".join(f"m{i} publish rate-event {data}\n".encode() for i in range(n))
            publisher.sock.sendall(lines)

        t0 = time.perf_counter()
        threading.Thread(target=publish, daemon=True).start()
        got = 0
        acks = []
        while got < n:
            line = consumer.read_line()
            if line is None:
                raise SystemExit(f"stalled after {got} of {n}")
            delivery = parse_delivery(line)
            if delivery is None:
                continue
            got += 1
            acks.append(
                f"a{got} ack {consumer_id} {delivery.msg_id}\n"
                if got < n
                else f"last ack --confirm {consumer_id} {delivery.msg_id}\n"
            )
            if len(acks) >= 100 or got == n:
                consumer.sock.sendall("".join(acks).encode())
                acks.clear()
        consumer.wait_ok("last")
        elapsed = time.perf_counter() - t0
        publisher.close()
        consumer.close()
        return n / elapsed
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="data bytes")
    args = parser.parse_args()
    rates = []
    for run in range(1, args.runs + 1):
        rates.append(one_run(args.messages, args.size))
        print(
            f"run {run}: {rates[-1]:,.0f} msg/s (publish -> consume -> ack, manual ack, {args.messages:,} "
            f"messages of {args.size} B)"
        )
    print(f"median: {statistics.median(rates):,.0f} msg/s   (reference MQKS, in memory: about 15,500 msg/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
