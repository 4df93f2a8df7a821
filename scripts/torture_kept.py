"""The torture benchmark's round 2 cases, kept (scripts/torture.py): hostile clients that round 2
bounded, re-measured beside the honest clients so that a change never brings them back."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq
from torture_cases import collect, dealer, drain, read_answers
from torture_wire import Server, api_call, api_request, monitor


def deaf_producer(srv: Server, size: int, short: bool) -> str:
    """A producer that pipelines messages and never reads its acks."""
    sock = dealer(srv.receive, sndhwm=0)
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", b"d"])
    time.sleep(1 if short else 2)
    sock.close(0)
    return f"{size} sent unread"


def greedy_consumer(srv: Server, size: int, short: bool) -> str:
    """A consumer that reads without acking, beside an honest one draining."""
    sock = dealer(srv.receive, sndhwm=0)
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", b"x" * 100])
    collect(sock, size, 120)
    sock.close(0)
    srv.begin()
    ctx = zmq.Context.instance()
    greedy, honest = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    greedy.connect(srv.send)
    honest.connect(srv.send)
    started, got = time.monotonic(), 0
    while got < size // 2 and time.monotonic() - started < (2 if short else 10):
        got += drain(honest, size, 0.05)[0]
        while greedy.poll(0):
            greedy.recv_multipart()
    elapsed = time.monotonic() - started
    greedy.close(0)
    honest.close(0)
    return f"honest consumer drained {got} in {elapsed:.2f} s"


API_BATCH = 2_000  # messages in one PRODUCE: the most the server takes (Limits.api_max_produce)


def api_pipeline(srv: Server, size: int, short: bool) -> str:
    """``size`` PRODUCE requests of API_BATCH messages each, sent at once."""
    body = msgpack.packb({"messages": [["bulk", b"x" * 100]] * API_BATCH}, use_bin_type=True)
    sock = dealer(srv.api, sndhwm=0)
    started = time.monotonic()
    for _ in range(size):
        sock.send_multipart(api_request("PRODUCE", body))
    answers = collect(sock, size, 120)
    sock.close(0)
    busy = sum(1 for a in answers if a[2:3] == [b"ERR"])
    seconds = time.monotonic() - started
    return f"{size} x PRODUCE of {API_BATCH:,}: {len(answers)} answered ({busy} refused) in {seconds:.2f} s"


def many_frames(srv: Server, size: int, short: bool) -> str:
    """Messages of a million empty frames each."""
    sock = dealer(srv.receive, sndhwm=0)
    started = time.monotonic()
    for i in range(size):
        sock.send_multipart([b"%d" % i, b""] + [b""] * 1_000_000)
    sock.send_multipart([b"last", b"", b"after them"])
    answers, deadline = [], time.monotonic() + 120
    while not any(a[0] == b"last" for a in answers) and sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        answers.append(sock.recv_multipart())
    sock.close(0)
    acked = sum(1 for a in answers if a[0] != b"last" and a[1] == b"1")
    last = "answered" if any(a[0] == b"last" for a in answers) else "NOT answered"
    seconds = time.monotonic() - started
    return f"{size} x 1,000,000 frames: {acked} acked, a message after them {last} in {seconds:.1f} s"


def big_lease(srv: Server, size: int, short: bool) -> str:
    """One LEASE of a million messages over ``size`` stored ones."""
    for start in range(0, size, API_BATCH):
        batch = [["big", b"x" * 100]] * min(API_BATCH, size - start)
        api_call(srv.api, "PRODUCE", {"messages": batch, "key": f"b{start}"})
    srv.begin()
    started = time.monotonic()
    ok, answer = api_call(srv.api, "LEASE", {"queue": "big", "group": "g", "after": 0, "max": 1_000_000})
    got = answer.get("end", 0) - answer.get("base", 0) if ok else answer.get("code")
    return f"LEASE of 1,000,000 over {size}: got {got} in {time.monotonic() - started:.3f} s"


def mqks_consumers(srv: Server, size: int, short: bool) -> str:
    """``size`` MQKS consumers on one connection."""
    conn = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=60)
    conn.sendall(b"".join(b"c%d consume --confirm q%d e%d\n" % (i, i, i) for i in range(size)))
    lines = read_answers(conn, size, 60)
    conn.close()
    refused = sum(1 for line in lines if b" error " in line)
    return f"{size} consumers asked for: {len(lines) - refused} made, {refused} refused"


def console_flood(srv: Server, seconds: int, short: bool) -> str:
    """Page views as fast as 16 connections go, of a queue of 50 messages of 4 MiB (10 when short), without a login."""
    for i in range(10 if short else 50):
        api_call(srv.api, "PRODUCE", {"messages": [["big", os.urandom(4 << 20)]], "key": f"big-{i}"})
    srv.begin()
    served, busy, stop = [0], [0], threading.Event()

    def view() -> None:
        while not stop.is_set():
            for path in ("/queue?name=big", "/clients"):
                try:
                    with urllib.request.urlopen(srv.http + path, timeout=10) as page:
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
    return f"{served[0]} pages served, {busy[0]} refused or busy in {seconds} s"


def stream_read(srv: Server, size: int, short: bool) -> str:
    """What a Spark query does to ``size`` stored messages in one batch, as fast as one client can:
    lease them all, fetch them all, acknowledge them all."""
    for start in range(0, size, API_BATCH):
        batch = [["stream", b"x" * 100]] * min(API_BATCH, size - start)
        api_call(srv.api, "PRODUCE", {"messages": batch, "key": f"st{start}"})
    srv.begin()
    started = time.monotonic()
    end, calls, base = 0, 0, None
    while end < size:
        ok, answer = api_call(srv.api, "LEASE", {"queue": "stream", "group": "g", "after": end, "max": size - end})
        if not ok:
            return f"LEASE after {end} refused: {answer.get('code')}"
        end, calls = answer["end"], calls + 1
        base = answer["base"] if base is None else base
    leased = time.monotonic() - started
    lo = base or 0
    while lo < end:  # (in pieces of 10,000, as the Spark connector asks)
        hi = min(end, lo + 10_000)
        ok, answer = api_call(srv.api, "FETCH", {"queue": "stream", "group": "g", "lo": lo, "hi": hi})
        if not ok:
            return f"FETCH of {lo}..{hi} refused: {answer.get('code')} {answer.get('detail')}"
        lo = answer["next"]
    fetched = time.monotonic() - started - leased
    api_call(srv.api, "ACK_UPTO", {"queue": "stream", "group": "g", "upto": end})
    deadline = time.monotonic() + 120
    while api_call(srv.api, "INFO", {"queue": "stream"})[1].get("depth") and time.monotonic() < deadline:
        time.sleep(0.01)
    acked = time.monotonic() - started - leased - fetched
    return (
        f"{size:,} leased in {calls} calls ({leased:.2f} s), fetched ({fetched:.2f} s), "
        f"acknowledged and deleted ({acked:.2f} s)"
    )


def monitor_peek_flood(srv: Server, size: int, short: bool) -> str:
    """``size`` monitor DEALERs each send 40 PEEKs of 1,000 rows (about 1.5 MB a page) and read nothing;
    an operator's STATS meanwhile (round 8: the waiting list grew without bound, STATS waited minutes)."""
    api_call(srv.api, "PRODUCE", {"messages": [["peekq", os.urandom(4096)] for _ in range(1000)]})
    srv.begin()
    socks = [dealer(srv.monitor, rcvhwm=1, rcvbuf=4096) for _ in range(size)]
    for sock in socks:
        for _ in range(40):
            sock.send_multipart([b"", b"PEEK peekq 1000"])
    time.sleep(0.5)
    started = time.monotonic()
    answered = monitor(srv.monitor, "STATS", timeout_ms=5_000) is not None
    took_ms = (time.monotonic() - started) * 1000
    time.sleep(1 if short else 4)
    for sock in socks:
        sock.close(0)
    said = f"STATS in {took_ms:.0f} ms" if answered else "STATS NOT answered in 5 s"
    return f"{size} x 40 PEEKs of 1,000 rows unread; {said}"
