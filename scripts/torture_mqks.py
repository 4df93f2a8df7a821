"""The torture benchmark's MQKS cases of issue 39 (scripts/torture.py): requests whose cost grows with
the data (notices to many consumers, fan-out, deleting a big queue, costly lines pipelined, one big
message, bindings left for the garbage collector), each from one hostile client beside the honest ones.

Nothing of pzq is imported (wire helpers only), so an older tree on PYTHONPATH is measured the same way.
"""

from __future__ import annotations

import socket
import time

import msgpack
from torture_cases import dealer
from torture_wire import Server, api_request, find, monitor

EVENTS = 10_000  # events bound to one queue: the most one queue may have (Limits.mqks_max_events)


class Lines:
    """A raw MQKS connection: lines written at once, answers counted as they come (without keeping every
    byte: a flood of notices is hundreds of MiB)."""

    def __init__(self, srv: Server, timeout_s: float = 60):
        self.sock = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=timeout_s)
        self.tail = b""
        self.read_bytes = 0

    def send(self, *lines: bytes) -> None:
        self.sock.sendall(b"".join(line + b"\n" for line in lines))

    def answers(self, want, timeout_s: float) -> list[bytes]:
        """Lines until ``want(lines)`` is true or ``timeout_s`` passed (only lines under 200 bytes are
        kept whole: replies; a longer one is kept as its first 200 bytes)."""
        kept: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        self.sock.settimeout(0.2)
        while not want(kept) and time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                break
            self.read_bytes += len(chunk)
            parts = (self.tail + chunk).split(b"\n")
            self.tail = parts.pop()[:200]
            kept += [part[:200] for part in parts]
        return kept

    def close(self) -> None:
        self.sock.close()


def _counted_peak(srv: Server) -> str:
    stats = monitor(srv.monitor, timeout_ms=10_000)
    peak = None if stats is None else find(stats.get("memory", {}), "counted_peak_bytes")
    return "?" if peak is None else f"{peak / (1 << 20):.0f} MiB"


def _events(tag: str, n: int) -> bytes:
    return b" ".join(b"%s-%015d" % (tag.encode(), i) for i in range(n))  # (~21 bytes each)


def updates(srv: Server, size: int, short: bool) -> str:
    """``size`` consumers of one queue bound to 9,997 events (997 when short), on one connection that
    does not read; then another connection's 3 lines of ``consume Q --add x``: each changes the queue's
    events, so that every consumer is told the whole list (``--update``)."""
    events = (EVENTS if not short else 1_000) - 3  # (room for the 3 added)
    hostile = Lines(srv)
    hostile.send(b"b0 consume --confirm upd " + _events("e", events))
    hostile.answers(lambda got: _oks(got) >= 1, 30)
    hostile.send(*(b"c%d consume --confirm upd" % i for i in range(size - 1)))  # (no events: kept, nothing sent)
    made = 1 + _oks(hostile.answers(lambda got: _oks(got) >= size - 1, 60))
    srv.begin()
    started = time.monotonic()
    adder = Lines(srv)
    adder.send(*(b"x%d consume --confirm upd --add x%d" % (i, i) for i in range(3)))
    confirmed = _oks(adder.answers(lambda got: _oks(got) >= 3, 60))
    took = time.monotonic() - started
    time.sleep(max(0.0, started + (2.0 if not short else 0.5) - time.monotonic()))
    counted = _counted_peak(srv)
    hostile.answers(lambda got: False, 3 if not short else 1)  # (then it reads: what it is sent comes)
    read_mib = hostile.read_bytes / (1 << 20)
    for conn in (hostile, adder):
        conn.close()
    return (
        f"{made} unread consumers x {events:,} events, 3 --add lines: {confirmed}/3 confirmed in {took:.1f} s; "
        f"memory counted peak {counted}; the consumers' connection then read {read_mib:.0f} MiB in 3 s"
    )


def fanout(srv: Server, size: int, short: bool) -> str:
    """``size`` queues bound to one event; 4 publish lines of 1 MiB (256 KiB when short) to it."""
    setup = Lines(srv)
    setup.send(*(b"r%d rebind --confirm fan%d fan.out" % (i, i) for i in range(size)))
    setup.answers(lambda got: len(got) >= size, 60)
    setup.close()
    srv.begin()
    hostile = Lines(srv)
    body = b"f" * ((256 << 10) if short else (1 << 20))
    started = time.monotonic()
    hostile.send(*(b"p%d publish --confirm fan.out %s" % (i, body) for i in range(4)))
    got = hostile.answers(lambda got: len(got) >= 4, 120)
    seconds = time.monotonic() - started
    hostile.close()
    stats = monitor(srv.monitor, timeout_ms=10_000) or {}
    stored = sum(int(q.get("depth", 0)) for name, q in stats.get("queues", {}).items() if name.startswith("fan"))
    confirmed = sum(1 for line in got if b" ok" in line)
    mib = len(body) * size * 4 / (1 << 20)
    what = f"4 x {len(body) >> 10} KiB to {size} queues ({mib:.0f} MiB)"
    return f"{what}: {confirmed}/4 confirmed in {seconds:.1f} s, {stored} stored"


def delete_queue(srv: Server, size: int, short: bool) -> str:
    """``delete_queue`` of an MQKS queue holding ``size`` messages (stored through the API, 2,000 a PRODUCE)."""
    setup = Lines(srv)
    setup.send(b"r1 rebind --confirm doomed doomed.event")
    setup.answers(lambda got: len(got) >= 1, 30)
    sock = dealer(srv.api, sndhwm=0)
    batch = msgpack.packb({"messages": [["doomed", b"x" * 100]] * 2_000}, use_bin_type=True)
    for _ in range(size // 2_000):
        sock.send_multipart(api_request("PRODUCE", batch))
        sock.poll(60_000) and sock.recv_multipart()
    sock.close(0)
    srv.begin()
    started = time.monotonic()
    setup.send(b"d1 delete_queue --confirm doomed", b"r2 rebind --confirm doomed doomed.event")
    got = setup.answers(lambda got: len(got) >= 2, 120)
    answered = time.monotonic() - started
    deadline = time.monotonic() + 120  # (its records go over the next turns)
    left = None
    while time.monotonic() < deadline:
        left = find((monitor(srv.monitor, timeout_ms=10_000) or {}).get("mqks", {}), "deleting_messages")
        if not left:
            break
        time.sleep(0.1)
    gone = f"its records gone in {time.monotonic() - started:.1f} s" if left == 0 else f"{left} records left"
    setup.close()
    replies = b", ".join(line.split(b" ")[1] for line in got)
    what = f"delete_queue of {size:,}, then the name bound again"
    return f"{what}: answered {replies.decode()} in {answered * 1000:.0f} ms; {gone}"


def costly_lines(srv: Server, size: int, short: bool) -> str:
    """``size`` connections each pipeline 8 consume lines, each replacing its queue's 10,000 events (1,000 when
    short) with 10,000 others; the honest MQKS client's publishes wait among them."""
    events = EVENTS if not short else 1_000
    conns = [Lines(srv, timeout_s=120) for _ in range(size)]
    started = time.monotonic()
    for n, conn in enumerate(conns):
        conn.send(*(b"c%d consume --confirm costly%d %s" % (k, n, _events(f"k{n}.{k}", events)) for k in range(8)))
    answered = _wait_all(conns, [8] * size, 120)
    seconds = time.monotonic() - started
    for conn in conns:
        conn.close()
    ok = sum(map(_oks, answered))
    return f"{size} x 8 consume lines of {events:,} events: {ok}/{size * 8} confirmed in {seconds:.1f} s"


def _wait_all(conns: list[Lines], wants: list[int], timeout_s: float) -> list[list[bytes]]:
    """``wants[i]`` confirms (lines ending " ok ") from ``conns[i]``, or what came within ``timeout_s``;
    every line kept (notices too)."""
    got: list[list[bytes]] = [[] for _ in conns]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_oks(lines) < want for lines, want in zip(got, wants, strict=True)):
        for lines, conn, want in zip(got, conns, wants, strict=True):
            if _oks(lines) < want:
                lines += conn.answers(lambda new: bool(new), 0.01)
    return got


def _oks(lines: list[bytes]) -> int:
    return sum(1 for line in lines if line.endswith(b" ok "))


def big_publish(srv: Server, size: int, short: bool) -> str:
    """``size`` publish lines of 15 MiB (2 MiB when short) to a bound queue, one after another."""
    setup = Lines(srv)
    setup.send(b"r1 rebind --confirm bigq big.event")
    setup.answers(lambda got: len(got) >= 1, 30)
    setup.close()
    srv.begin()
    hostile = Lines(srv, timeout_s=120)
    body = b"b" * ((2 if short else 15) << 20)
    started = time.monotonic()
    confirmed = 0
    for i in range(size):
        hostile.send(b"p%d publish --confirm big.event %s" % (i, body))
        confirmed += sum(1 for line in hostile.answers(lambda got: bool(got), 60) if b" ok" in line)
    seconds = time.monotonic() - started
    hostile.close()
    return f"{size} x {len(body) >> 20} MiB published: {confirmed} confirmed in {seconds:.1f} s"


def bindings_gc(srv: Server, size: int, short: bool) -> str:
    """``size`` bindings of distinct events made by 9 connections that then close (the bindings stay);
    then the garbage collector's whole walk, forced every 2 s by the case's setting, while the honest
    clients run."""
    per_queue = EVENTS if not short else 1_000
    queues = -(-size // per_queue)
    conns = [Lines(srv, timeout_s=120) for _ in range(9)]
    for q in range(queues):
        events = _events(f"g{q}", min(per_queue, size - q * per_queue))
        conns[q % 9].send(b"b%d rebind --confirm gcq%d %s" % (q, q, events))
    answered = _wait_all(conns, [len(range(i, queues, 9)) for i in range(9)], 120)
    bound = sum(map(_oks, answered))
    for conn in conns:
        conn.close()
    srv.begin()
    time.sleep(6 if not short else 2.5)  # (the honest clients run through a few whole walks)
    stats = monitor(srv.monitor, timeout_ms=10_000) or {}
    bindings = find(stats.get("mqks", {}), "bindings")
    walks = stats.get("gc", {})
    return (
        f"{bound} rebinds by 9 closed connections left {bindings} bindings; whole walks every 2 s: "
        f"{walks.get('whole_total', '?')} run (the last {walks.get('whole_last_ms', '?')} ms over "
        f"{walks.get('frozen_objects', '?')} objects), {walks.get('whole_put_off_total', '?')} put off"
    )
