#!/usr/bin/env python3
"""Send -> consume -> ack rate of N messages through pzq's PHPMQ gateway, on a fresh local server.

    .venv/bin/python scripts/phpmq_rate.py [--count 10000] [--size 100] [--window 100]

One raw-socket producer sends N current-dialect 001 messages (the protocol has no receipt, so the
send phase ends when MONITOR shows all N stored, i.e. committed); one consumer asks for a credit
window of --window and acks each dispatch as it reads it. Prints msg/s of each phase and overall.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from pzq.bench.native import _free_ports
from pzq.clients import native as client
from pzq.protocols.phpmq import ACK, CONSUME, SEND, encode


def read_message(sock: socket.socket, buf: bytearray) -> dict[int, bytes]:
    def need(n: int) -> bytes:
        while len(buf) < n:
            more = sock.recv(1 << 20)
            if not more:
                raise SystemExit("the server closed the connection")
            buf.extend(more)
        out = bytes(buf[:n])
        del buf[:n]
        return out

    head = need(8)
    packets = {}
    for _ in range(int(head[6:8])):
        ph = need(32)
        packets[int(ph[1:3])] = need(int(ph[3:]))
    return packets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=100)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="pzq-phpmq-rate-")
    port, monitor = _free_ports(1)[0], f"ipc://{workdir}/monitor"
    receive, send = (f"ipc://{workdir}/{n}" for n in ("receive", "send"))
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            os.path.join(workdir, "db"),
            "--receive-dsn",
            receive,
            "--send-dsn",
            send,
            "--monitor-dsn",
            monitor,
            "--phpmq-dsn",
            f"tcp://127.0.0.1:{port}",
            "--api-dsn",
            "",
            "--mqks-dsn",
            "",
            "--log-level",
            "warning",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.monitor_request(monitor, timeout_ms=200)
                break
            except client.ClientError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start") from None
        body = b"x" * args.size
        producer = socket.create_connection(("127.0.0.1", port))
        t0 = time.monotonic()
        batch = b"".join(encode(SEND, [(1, b"rate"), (2, body), (5, b"0")]) for _ in range(args.count))
        producer.sendall(batch)
        while client.stats(monitor)["queues"].get("rate", {}).get("depth", 0) < args.count:
            time.sleep(0.005)
        t1 = time.monotonic()
        consumer = socket.create_connection(("127.0.0.1", port))
        consumer.sendall(encode(CONSUME, [(1, b"rate"), (4, b"%d" % args.window)]))
        buf = bytearray()
        for _ in range(args.count):
            packets = read_message(consumer, buf)
            consumer.sendall(encode(ACK, [(1, b"rate"), (3, packets[3])]))
        while client.stats(monitor)["queues"]["rate"]["depth"] > 0:
            time.sleep(0.005)
        t2 = time.monotonic()
        print(f"PHPMQ, {args.count} messages of {args.size} bytes, credit window {args.window}:")
        print(f"  send (until all stored):   {args.count / (t1 - t0):>10,.0f} msg/s")
        print(f"  consume + ack (until 0):   {args.count / (t2 - t1):>10,.0f} msg/s")
        print(f"  send -> consume -> ack:    {args.count / (t2 - t0):>10,.0f} msg/s overall ({t2 - t0:.2f} s)")
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
