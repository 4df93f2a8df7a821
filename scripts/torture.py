#!/usr/bin/env python3
"""Torture benchmark: hostile or unlucky clients against a fresh pzq server each, with an honest
producer (window 1) running beside them. Prints per case: the server's peak RSS, the honest client's
longest wait for an ack (the stall) and its ack p99, and what the hostile client achieved.

    .venv/bin/python scripts/torture.py            # every case, full size
    .venv/bin/python scripts/torture.py --short    # smaller sizes (CI runs this as a smoke test)
    .venv/bin/python scripts/torture.py --case greedy-consumer
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time

import zmq

from pzq.bench.server import PzqServer, free_ports
from pzq.clients import native as client
from pzq.clients.sockets import tcp_address


class Server(PzqServer):
    """A fresh server with the MQKS and API gateways, started."""

    def __init__(self, *extra: str):
        super().__init__(
            gateways=("api", "mqks"), transport="ipc", args=("--disk-reserve", "0", *extra), prefix="pzq-torture-"
        )
        self.start(timeout_s=20)
        self.mqks_port, self.api_port = (tcp_address(dsn)[1] for dsn in (self.mqks, self.api))
        self.console_url = ""  # (set when the case runs the web console)

    def close(self, *, kill: bool = True) -> None:
        super().close(kill=kill)  # a tortured server owes no clean shutdown


class Honest(threading.Thread):
    """A window-1 producer measuring each ack's wait while a case runs."""

    def __init__(self, endpoint: str):
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.waits: list[float] = []
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        with client.Producer(self.endpoint, timeout_ms=60_000, ctx=zmq.Context()) as producer:
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
            f"honest ack p50 {statistics.median(waits) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
            f"longest {waits[-1] * 1000:.1f} ms"
        )


def deaf_producer(srv: Server, size: int) -> str:
    """A producer that pipelines messages and never reads its acks."""
    deaf = zmq.Context.instance().socket(zmq.DEALER)
    deaf.sndhwm = 0
    deaf.connect(srv.receive)
    for i in range(size):
        deaf.send_multipart([b"%d" % i, b"", b"d"])
    time.sleep(2)  # (let the server read what it will)
    deaf.close(0)
    return f"{size} sent unread: {client.stats(srv.monitor)['queues']['default']['bytes']} bytes stored in all"


def greedy_consumer(srv: Server, size: int) -> str:
    """A consumer that reads without acking, beside an honest one draining."""
    with client.Producer(srv.receive) as producer:
        producer.produce_many([[b"x" * 100] for _ in range(size)])
    ctx = zmq.Context.instance()
    greedy, honest = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    greedy.connect(srv.send)
    honest.connect(srv.send)
    got, started = 0, time.perf_counter()
    while got < size // 2 and time.perf_counter() - started < 10:
        if honest.poll(50):
            while True:
                try:
                    frames = honest.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                honest.send_multipart([frames[0], frames[1], b"1"])
                got += 1
        while greedy.poll(0):
            greedy.recv_multipart()
    elapsed = time.perf_counter() - started
    greedy.close(0)
    honest.close(0)
    return f"honest consumer drained {got} in {elapsed:.2f} s = {got / elapsed:,.0f} msg/s"


def mqks_rebind(srv: Server, size: int) -> str:
    """One MQKS rebind removing ``size`` masks from ``size`` bound events."""
    conn = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=120)
    events = " ".join(f"e{i}.x.y" for i in range(size))
    conn.sendall(f"c1 consume --confirm q1 {events}\n".encode())
    conn.recv(1000)
    started = time.perf_counter()
    conn.sendall(("r1 rebind --confirm q1 --remove-mask " + " ".join(f"e{i}.*.y" for i in range(size)) + "\n").encode())
    answer = b""
    while b"r1 " not in answer:
        answer += conn.recv(4096)
    conn.close()
    return f"rebind of {size} masks answered in {time.perf_counter() - started:.3f} s: {answer.split(b'r1 ')[1][:5]!r}"


def big_messages(srv: Server, size: int) -> str:
    """A burst of 16 MiB messages."""
    body = os.urandom(16 << 20)
    acks = _send_all_then_count(srv.receive, [[b"%d" % i, b"", body] for i in range(size)])
    return f"{size} x 16 MiB: {acks} acked"


def _send_all_then_count(endpoint: str, messages: list[list[bytes]]) -> int:
    """Send every message on one DEALER without waiting, then count the answers (a minute at most)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    for frames in messages:
        sock.send_multipart(frames)
    answered = 0
    while answered < len(messages) and sock.poll(60_000):
        sock.recv_multipart()
        answered += 1
    sock.close(0)
    return answered


def api_pipeline(srv: Server, size: int) -> str:
    """``size`` PRODUCE requests of 5,000 messages each (the most one may carry), sent at once."""
    import msgpack

    body = msgpack.packb({"messages": [["bulk", b"x" * 100]] * 5_000}, use_bin_type=True)
    started = time.perf_counter()
    answered = _send_all_then_count(
        f"tcp://127.0.0.1:{srv.api_port}", [[b"", b"%d" % i, b"PRODUCE", body] for i in range(size)]
    )
    return f"{size} x PRODUCE of 5,000: {answered} answered in {time.perf_counter() - started:.2f} s"


def idle_connections(srv: Server, size: int) -> str:
    """``size`` idle TCP connections to a ZeroMQ endpoint (the API) and the raw-TCP MQKS one, half each."""
    held = []
    for i in range(size):
        try:
            held.append(socket.create_connection(("127.0.0.1", srv.api_port if i % 2 else srv.mqks_port), timeout=5))
        except OSError as exc:  # (this client's own descriptors)
            return f"client stopped at {i}: {exc}"
    time.sleep(2)  # (let the server cut off what it will)
    stats = client.stats(srv.monitor, timeout_ms=10_000)
    alive = sum(1 for raw in held if _open(raw))
    for raw in held:
        raw.close()
    return f"{size} opened: {alive} still open, {stats['connections']['refused_total']} ZeroMQ ones cut off"


def _open(raw: socket.socket) -> bool:
    raw.setblocking(False)
    try:
        while raw.recv(65536):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def partial_input(srv: Server, size: int) -> str:
    """``size`` MQKS connections, each sending 15 MiB of a line it never ends."""
    chunk, held = b"p1 publish e " + b"x" * (15 << 20), []
    for _ in range(size):
        raw = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=30)
        try:
            raw.sendall(chunk)
        except OSError:
            pass  # closed by the server: over --max-partial-input
        held.append(raw)
    time.sleep(1)
    alive = sum(1 for raw in held if _open(raw))
    for raw in held:
        raw.close()
    return f"{size} x 15 MiB unfinished lines: {alive} connections kept"


def big_lease(srv: Server, size: int) -> str:
    """One LEASE of a million messages over ``size`` stored ones."""
    from pzq.clients.api import ApiClient

    with ApiClient(f"tcp://127.0.0.1:{srv.api_port}", timeout_s=120) as api:
        for start in range(0, size, 5_000):
            api.produce([("big", b"x" * 100)] * min(5_000, size - start))
        started = time.perf_counter()
        base, end = api.lease("big", "g", 0, 1_000_000)
        return f"LEASE of 1,000,000 over {size}: got {end - base} in {time.perf_counter() - started:.3f} s"


def stream_read(srv: Server, size: int) -> str:
    """What a Spark query does to ``size`` stored messages in one batch, as fast as one client can:
    lease them all, fetch them all, acknowledge them all."""
    from pzq.clients.api import ApiClient

    with ApiClient(f"tcp://127.0.0.1:{srv.api_port}", timeout_s=120) as api:
        for start in range(0, size, 5_000):
            api.produce([("stream", b"x" * 100)] * min(5_000, size - start))
        started = time.perf_counter()
        end, calls = 0, 0
        while end < size:
            _, end = api.lease("stream", "g", end, size - end)
            calls += 1
        leased = time.perf_counter() - started
        for lo in range(0, size, 10_000):
            messages, gone = api.fetch("stream", "g", lo, min(size, lo + 10_000))
            if len(messages) + gone != min(size, lo + 10_000) - lo:
                return f"FETCH of {lo}.. answered {len(messages)} + {gone} gone"
        fetched = time.perf_counter() - started - leased
        api.ack_upto("stream", "g", size)
        deadline = time.monotonic() + 120
        while api.info("stream")["depth"] and time.monotonic() < deadline:
            time.sleep(0.01)
        acked = time.perf_counter() - started - leased - fetched
        return (
            f"{size:,} leased in {calls} calls ({leased:.2f} s), fetched ({fetched:.2f} s), "
            f"acknowledged and deleted ({acked:.2f} s)"
        )


def mqks_consumers(srv: Server, size: int) -> str:
    """``size`` MQKS consumers on one connection."""
    conn = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=60)
    conn.sendall(b"".join(b"c%d consume --confirm q%d e%d\n" % (i, i, i) for i in range(size)))
    answers, data = 0, b""
    while answers < size:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
        answers = data.count(b"\n")
    conn.close()
    refused = data.count(b" error ")
    return f"{size} consumers asked for: {size - refused} made, {refused} refused"


def many_frames(srv: Server, size: int) -> str:
    """Messages of a million empty frames each: nothing against --max-message-size."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(srv.receive)
    started = time.perf_counter()
    for i in range(size):
        sock.send_multipart([b"%d" % i, b""] + [b""] * 1_000_000)
    sock.send_multipart([b"last", b"", b"after them"])  # (its ack: the server has read past them)
    answered = sock.poll(120_000) and sock.recv_multipart()
    sock.close(0)
    return f"{size} x 1,000,000 frames: read past in {time.perf_counter() - started:.1f} s, then {answered[-1]!r}"


def console_flood(srv: Server, seconds: int) -> str:
    """Page views as fast as 16 connections go, of a queue of 50 messages of 4 MiB, and of the
    clients page, without a login."""
    import urllib.error
    import urllib.request

    from pzq.clients.api import ApiClient

    with ApiClient(f"tcp://127.0.0.1:{srv.api_port}") as api:
        for i in range(50):
            api.produce([("big", os.urandom(4 << 20))], key=f"big-{i}")
    url = srv.console_url
    served, busy, stop = [0], [0], threading.Event()

    def view() -> None:
        while not stop.is_set():
            for path in ("/queue?name=big", "/clients", "/queue?name=big"):
                try:
                    with urllib.request.urlopen(url + path, timeout=10) as page:
                        page.read()
                    served[0] += 1
                except (urllib.error.URLError, OSError):
                    busy[0] += 1

    viewers = [threading.Thread(target=view, daemon=True) for _ in range(16)]
    for viewer in viewers:
        viewer.start()
    time.sleep(seconds)
    stop.set()
    for viewer in viewers:
        viewer.join(15)
    depth = client.stats(srv.monitor)["queues"].get("big", {}).get("depth")
    return f"{served[0]} pages served, {busy[0]} refused or busy in {seconds} s (queue depth {depth})"


CASES = {
    "deaf-producer": (deaf_producer, 40_000, 5_000),
    "greedy-consumer": (greedy_consumer, 40_000, 5_000),
    "mqks-rebind": (mqks_rebind, 3_000, 500),
    "big-messages": (big_messages, 60, 4),
    "api-pipeline": (api_pipeline, 60, 3),
    "idle-connections": (idle_connections, 18_000, 300),
    "partial-input": (partial_input, 40, 4),
    "big-lease": (big_lease, 200_000, 20_000),
    "stream-read": (stream_read, 1_000_000, 20_000),
    "mqks-consumers": (mqks_consumers, 2_000, 200),
    "console-flood": (console_flood, 20, 3),
    "many-frames": (many_frames, 5, 1),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--case", choices=sorted(CASES), action="append", help="run only these cases")
    args = parser.parse_args()
    for name in args.case or CASES:
        func, full, short = CASES[name]
        console = f"http://127.0.0.1:{free_ports(1)[0]}"
        srv = Server(*(("--http-dsn", console) if name == "console-flood" else ()))
        srv.console_url = console
        try:
            honest = Honest(srv.receive)
            time.sleep(0.3)
            outcome = func(srv, short if args.short else full)
            print(f"{name:16} {outcome}; {honest.report()}; server peak RSS {srv.peak_rss_mb():.0f} MB", flush=True)
        finally:
            srv.close()


if __name__ == "__main__":
    main()
