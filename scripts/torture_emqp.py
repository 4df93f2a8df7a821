"""The torture benchmark's eMQP cases of issue 39 (scripts/torture.py): peers that read nothing, on the
publish socket and on the backend, against the byte account of what pzq hands libzmq.

- emqp-deaf-subscriber: a subscriber that reads nothing, and ``size`` PUBLISHes of 1 MiB for it; then it
  closes. It held 722 MiB of the server, still held 3 s after it closed (0df7922).
- emqp-deaf-worker: a worker that sends 1,000 READYs, keeps heartbeating and never reads, and ``size``
  REQUESTs of 1 MiB for its queue, which an honest worker serves too. It held 724 MiB (0df7922).

A deaf peer here is a ZeroMQ socket with RCVHWM 1 and a 4 KiB receive buffer: its libzmq stops reading
the connection at once, so what it is sent stays on the server's side (a default socket would take 1,000
messages into its own process first). Nothing of pzq is imported: the figures come from STATS, and read
"?" from a tree that does not have them.
"""

from __future__ import annotations

import time

import zmq
from torture_cases import dealer
from torture_wire import Server, emqp, find, free_ports, monitor

MIB = 1 << 20
_PUBLISH: dict[str, str] = {}  # the publish endpoint the last publish_args gave the server


def publish_args(short: bool) -> tuple[str, ...]:
    """`pzq serve` arguments of the publish case: a publish socket on a free port (the harness has none)."""
    _PUBLISH["dsn"] = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    return ("--emqp-publish-dsn", _PUBLISH["dsn"])


def deaf(kind: int, endpoint: str | None = None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.linger = 0
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    if endpoint is not None:
        sock.connect(endpoint)
    return sock


def figure(srv: Server, name: str):
    """One STATS figure now (None when the tree has none, or no answer came)."""
    stats = monitor(srv.monitor)
    return None if stats is None else find(stats, name)


def mib(value) -> str:
    return "?" if value is None else f"{value / MIB:.0f}"


def emqp_deaf_subscriber(srv: Server, size: int, short: bool) -> str:
    """A subscriber that reads nothing; ``size`` PUBLISHes of 1 MiB; then it closes."""
    sub = deaf(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(_PUBLISH["dsn"])
    client = dealer(srv.emqp_frontend, sndhwm=0)
    deadline = time.monotonic() + 10
    while not sub.poll(50) and time.monotonic() < deadline:  # (its subscription is in place once it hears one)
        client.send_multipart(emqp("PUBLISH", "hello", "x"))
    sent0, refused0 = figure(srv, "publish_total") or 0, figure(srv, "publish_refused_total") or 0
    srv.begin()
    started = time.monotonic()
    body = b"x" * MIB
    for _ in range(size):
        client.send_multipart(emqp("PUBLISH", "news", body))
    # A window of the same length whatever the tree (so that trees compare): what it holds meanwhile, and
    # when it is cut off (short: a glance, not the wait for its cut-off, Limits.stuck_reader_s)
    held_peak, cut_at, until = None, None, started + (1 if short else 12)
    while time.monotonic() < until:
        held = figure(srv, "publish_held_bytes")
        held_peak = held if held_peak is None else max(held_peak, held or 0)
        if cut_at is None and figure(srv, "publish_subscribers_cut_total"):
            cut_at = time.monotonic() - started
        time.sleep(0.1)
    cuts = figure(srv, "publish_subscribers_cut_total")
    sent, refused = figure(srv, "publish_total"), figure(srv, "publish_refused_total")
    sent = None if sent is None else sent - sent0  # (the hellos before it were not its)
    refused = None if refused is None else refused - refused0
    sub.close(0)
    wait_s = 1 if short else 3
    time.sleep(wait_s)
    after, rss = figure(srv, "publish_held_bytes"), srv.rss_anon_kb() * 1024
    client.close(0)
    # (a ZeroMQ SUB connects again by itself, and reads no more on its new connection: cut off again)
    cut = "not cut off" if cut_at is None else f"cut off after {cut_at:.1f} s ({cuts} times in {until - started:.0f} s)"
    return (
        f"{size} PUBLISH of 1 MiB to a subscriber that reads nothing: {sent} sent, {refused} refused "
        f"(its publisher's share), held at most {mib(held_peak)} MiB, {cut}; {wait_s} s after it closed "
        f"{mib(after)} MiB held, server RssAnon {mib(rss)} MiB"
    )


def emqp_deaf_worker(srv: Server, size: int, short: bool) -> str:
    """A worker that sends 1,000 READYs, heartbeats and never reads; ``size`` REQUESTs of 1 MiB for its
    queue, which an honest worker serves too (started a moment later); until every one was replied to."""
    hostile = deaf(zmq.DEALER, srv.emqp_backend)
    hostile.send_multipart(emqp("INFORM", '[[10, "deafq"]]', "worker"))
    for _ in range(1000):
        hostile.send_multipart(emqp("READY"))
    client = dealer(srv.emqp_frontend, sndhwm=0)
    body = b'"' + b"x" * (MIB - 2) + b'"'
    srv.begin()
    started = time.monotonic()
    for _ in range(size):
        client.send_multipart(emqp("REQUEST", "deafq", "reply-requested", body))
    honest = None
    replied, jobs, peak, beat = set(), 0, 0, 0.0
    # (short: a glance; the jobs it holds wait for its cut-off, Limits.stuck_reader_s)
    deadline = time.monotonic() + (2 if short else 180)
    while len(replied) < size and time.monotonic() < deadline:
        now = time.monotonic()
        if now - beat > 1:  # (it keeps heartbeating: never silent, never dead by the liveness rule)
            beat = now
            hostile.send_multipart(emqp("HEARTBEAT", str(time.time())))
            peak = max(peak, figure(srv, "deliveries_bytes") or 0)
            if honest is None and now - started > 0.5:  # (the deaf one took what it could first)
                honest = dealer(srv.emqp_backend)
                honest.send_multipart(emqp("INFORM", '[[10, "deafq"]]', "worker"))
                for _ in range(4):
                    honest.send_multipart(emqp("READY"))
        if honest is not None:
            while honest.poll(0):
                job = honest.recv_multipart()
                if job[2:3] == [b"REQUEST"]:
                    jobs += 1
                    honest.send_multipart(emqp("REPLY", '{"value": 1}', job[3]))
                    honest.send_multipart(emqp("READY"))
        while client.poll(0):
            answer = client.recv_multipart()
            if answer[2:3] == [b"REPLY"]:
                replied.add(answer[-1])
        if honest is None or not (honest.poll(5) or client.poll(0)):
            time.sleep(0.001)
    seconds = time.monotonic() - started
    cut, closed = figure(srv, "workers_cut_total"), figure(srv, "worker_connections_closed_total")
    for sock in (hostile, client, honest):
        if sock is not None:
            sock.close(0)
    done = "all" if len(replied) == size else "not yet all" if short else "NOT all"
    return (
        f"{size} REQUESTs of 1 MiB, a worker with 1,000 READYs that reads nothing: deliveries held at most "
        f"{mib(peak)} MiB; it was cut off {cut} times ({closed} connections closed); {done} replied "
        f"({len(replied)}/{size}, {jobs} run by an honest worker) in {seconds:.1f} s"
    )
