#!/usr/bin/env python3
"""Pipelined MQKS rebinds beside an honest producer (issue 26, item 1): a `pzq serve` subprocess, a
window-1 native producer measuring each ack's wait, and ``--rebinds`` short rebinds of a queue bound to
thousands of events, written at once on one connection, then spread over two. Prints the honest
producer's ack p50/p99/longest while the rebinds are served, and how long they took.

    PYTHONPATH=$PWD .venv/bin/python scripts/rebind_probe.py
    cd /tmp && PYTHONPATH=/path/to/an/older/tree .venv/bin/python /path/to/scripts/rebind_probe.py  # before

(`python -m pzq` puts the current directory first on the server's path: run the older tree's from elsewhere.)

The figures are the loop's stall for every other client: on a busy machine they are noisy.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

import zmq

from pzq.bench.server import PzqServer
from pzq.clients import native as client
from pzq.clients.sockets import tcp_address

# Each case: the events bound first, and the pipelined line (short: many fit in one read). Masks without
# a literal segment make a rebind look at every bound event: the costliest kind a request may carry.
CASES = {
    "10,000 events, 4 masks *.*.z*": (10_000, "--remove-mask *.*.zz* *.*.zy* *.*.zx* *.*.zw*"),
    "2,000 events, 1 mask *.*.z* (accepted: under the cap)": (2_000, "--remove-mask *.*.zz*"),
    "10,000 events, --remove one --add one": (10_000, "--remove e1.s1.t1 --add x.y.z"),
}


def events(count: int) -> str:
    return " ".join(f"e{i}.s{i % 97}.t{i % 13}" for i in range(count))


class Honest(threading.Thread):
    """A window-1 producer timing each ack."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.endpoint, self.waits, self.stop = endpoint, [], threading.Event()
        self.start()

    def run(self) -> None:
        with client.Producer(self.endpoint, timeout_s=60, ctx=zmq.Context()) as producer:
            while not self.stop.is_set():
                started = time.perf_counter()
                producer.produce([b"honest"])
                self.waits.append(time.perf_counter() - started)
                time.sleep(0.002)

    def report(self) -> str:
        self.stop.set()
        self.join(70)
        waits = sorted(self.waits) or [0.0]
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        return (
            f"honest ack p50 {statistics.median(waits) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
            f"longest {waits[-1] * 1000:.1f} ms ({len(waits)} acks)"
        )


def pipelined(port: int, queue: str, request: str, rebinds: int, connections: int) -> tuple[float, str]:
    """``rebinds`` rebinds of ``queue`` written at once, split over ``connections``: seconds until all
    are answered, and the first answer."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in range(connections)]
    started = time.perf_counter()
    for n, conn in enumerate(conns):
        lines = (f"r{i} rebind --confirm {queue} {request}\n" for i in range(n, rebinds, connections))
        conn.sendall("".join(lines).encode())
    first = ""
    for n, conn in enumerate(conns):
        data = b""
        while data.count(b"\n") < len(range(n, rebinds, connections)):
            data += conn.recv(65536)
        first = first or data.split(b"\n")[0].decode()
        conn.close()
    return time.perf_counter() - started, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebinds", type=int, default=20)
    args = parser.parse_args()
    for label, (bound, request) in CASES.items():
        for connections in (1, 2):
            srv = PzqServer(gateways=("mqks",), transport="ipc", args=("--disk-reserve", "0"), prefix="pzq-rebind-")
            srv.start(timeout_s=20)
            try:
                port = tcp_address(srv.mqks)[1]
                with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
                    conn.sendall(f"b rebind --confirm q {events(bound)}\n".encode())
                    conn.recv(100)
                honest = Honest(srv.receive)
                time.sleep(0.3)
                took, first = pipelined(port, "q", request, args.rebinds, connections)
                print(
                    f"{label}: {args.rebinds} on {connections} connection(s) answered in {took:.2f} s "
                    f"({first.split()[1]}); {honest.report()}",
                    flush=True,
                )
            finally:
                srv.close(kill=True)


if __name__ == "__main__":
    main()
