"""The torture benchmark's cases for the raw-TCP and request doors (scripts/torture.py; issue 39): a
PHPMQ consumer that never reads, one big message on each door but native and MQKS, and an API PRODUCE
bigger than a turn. They speak the wire themselves (nothing of pzq is imported)."""

from __future__ import annotations

import os
import socket
import time

import msgpack
from torture_cases import collect, dealer
from torture_wire import Server, api_request, depth, emqp, find, monitor, phpmq, phpmq_take

MIB = 1 << 20


def _stats(srv: Server, name: str, default: int = 0) -> int:
    figures = monitor(srv.monitor) or {}
    value = find(figures, name)
    return int(value) if isinstance(value, int) else default


def _wait_depth(srv: Server, queue: str, want: int, timeout_s: float) -> int:
    """The depth of ``queue`` once it reaches ``want``, or as it stands after ``timeout_s``."""
    deadline, got = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        got = depth(srv.monitor, queue) or 0
        if got >= want:
            break
        time.sleep(0.05)
    return got


def phpmq_deaf_consumer(srv: Server, size: int, short: bool) -> str:
    """``size`` messages of 1 MiB are stored (before the measured part), then a PHPMQ connection asks
    for 1,000 of them and never reads, past an ack timeout (its deliveries go back and stay charged to
    it: they may still sit in its pipe); then a reader takes 20 beside it. What the deaf one was handed
    must stay within its share, and every message stored."""
    port = srv.phpmq_port
    producer = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = os.urandom(MIB)
    for i in range(size):
        producer.sendall(phpmq(1, [(1, b"deaf"), (2, b"%08d" % i + body[8:])]))
    stored = _wait_depth(srv, "deaf", size, 120)
    producer.close()
    srv.begin()
    deaf = socket.create_connection(("127.0.0.1", port), timeout=10)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (a reader that never reads: little kernel room)
    deaf.sendall(phpmq(2, [(1, b"deaf"), (4, b"1000")]))
    peak, until = 0, time.monotonic() + (1.0 if short else 6.0)  # (past --ack-timeout, 5 s)
    while time.monotonic() < until:
        peak = max(peak, _stats(srv, "delivery_bytes"))
        time.sleep(0.1)
    reader = socket.create_connection(("127.0.0.1", port), timeout=10)
    reader.sendall(phpmq(2, [(1, b"deaf"), (4, b"20")]))
    began, buf, got = time.monotonic(), bytearray(), 0
    while got < 20 and time.monotonic() - began < 30:
        chunk = reader.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
        while (packets := phpmq_take(buf)) is not None:
            got += 1
            reader.sendall(phpmq(4, [(1, b"deaf"), (3, packets.get(3, b""))]))
    took = time.monotonic() - began
    counted = _stats(srv, "counted_peak_bytes")
    deadline, left = time.monotonic() + 5, depth(srv.monitor, "deaf")
    while left != size - got and time.monotonic() < deadline:  # (the last acks wait for their commit)
        time.sleep(0.05)
        left = depth(srv.monitor, "deaf")
    reader.close()
    deaf.close()
    lost = "" if stored == size and left == size - got else f" (NOT all kept: {stored} stored, {left} left)"
    return (
        f"{size} x 1 MiB stored{lost}; handed to the deaf reader at most {peak / MIB:.0f} MiB; a reader beside it "
        f"got {got} in {took:.2f} s; memory bound peak {counted / MIB:.0f} MiB"
    )


def _big_body(short: bool) -> bytes:
    """15 MiB of JSON-safe text (eMQP peers decode every frame as UTF-8); 4 MiB when short."""
    return (b"0123456789abcdef" * ((4 if short else 15) * MIB // 16))[: (4 if short else 15) * MIB]


def phpmq_big(srv: Server, size: int, short: bool) -> str:
    """``size`` messages of 15 MiB (4 when short) sent on one PHPMQ connection, one after another's
    storing (PHPMQ has no receipt: the queue's depth tells)."""
    body = _big_body(short)
    conn = socket.create_connection(("127.0.0.1", srv.phpmq_port), timeout=60)
    started, stored = time.monotonic(), 0
    for i in range(size):
        conn.sendall(phpmq(1, [(1, b"phpmq-big"), (2, body)]))
        stored = _wait_depth(srv, "phpmq-big", i + 1, 60)
    seconds = time.monotonic() - started
    conn.close()
    lost = "" if stored == size else " (NOT all stored)"
    return f"{size} x {len(body) // MIB} MiB: {stored} stored{lost} in {seconds:.1f} s"


def emqp_big(srv: Server, size: int, short: bool) -> str:
    """``size`` REQUESTs of 15 MiB (4 when short) from one eMQP client, each sent after the last's ACK."""
    body = _big_body(short)
    sock = dealer(srv.emqp_frontend, sndhwm=0)
    started, acked, other = time.monotonic(), 0, ""
    for _ in range(size):
        frames = emqp("REQUEST", "emqp-big", "", body)
        sock.send_multipart(frames)
        for answer in collect(sock, 1, 60):
            if answer[2:3] == [b"ACK"] and answer[-1] == frames[3]:
                acked += 1
            else:
                other = f" (NOT acked: {answer[2:3]} {answer[-2][:60]!r})"
    seconds = time.monotonic() - started
    sock.close(0)
    stored = depth(srv.monitor, "emqp-big")
    return f"{size} x {len(body) // MIB} MiB: {acked} acked, {stored} stored{other} in {seconds:.1f} s"


def api_big(srv: Server, size: int, short: bool) -> str:
    """``size`` API PRODUCEs of one 15 MiB message (4 when short), each sent after the last's answer."""
    body = _big_body(short)
    sock = dealer(srv.api, sndhwm=0)
    started, ok, other, rounds = time.monotonic(), 0, "", []
    for i in range(size):
        frames = api_request("PRODUCE", {"messages": [["api-big", body]], "key": f"big-{i}"})
        began = time.monotonic()
        sock.send_multipart(frames)
        for answer in collect(sock, 1, 60):
            rounds.append(time.monotonic() - began)
            if answer[2:3] == [b"OK"]:
                ok += 1
            else:
                other = f" (NOT stored: {msgpack.unpackb(answer[-1], raw=False)})"[:120]
    seconds = time.monotonic() - started
    sock.close(0)
    slowest = max(rounds, default=0.0) * 1000
    return f"{size} x {len(body) // MIB} MiB: {ok} stored{other} in {seconds:.1f} s, longest answer {slowest:.0f} ms"


def api_produce_big(srv: Server, size: int, short: bool) -> str:
    """One API PRODUCE of ``size`` messages of 11 KiB (22 MiB at full size): carried out in pieces that
    fit the turn, or refused from its size before it starts."""
    args = {"messages": [["api-produce-big", os.urandom(11 << 10)]] * size, "key": "produce-big"}
    sock = dealer(srv.api, sndhwm=0)
    began = time.monotonic()
    sock.send_multipart(api_request("PRODUCE", args))
    answers = collect(sock, 1, 60)
    seconds = (time.monotonic() - began) * 1000
    sock.close(0)
    if not answers:
        return f"{size} x 11 KiB in one PRODUCE: NOT answered in 60 s"
    reply = msgpack.unpackb(answers[0][-1], raw=False)
    verdict = f"stored {reply.get('count')}" if answers[0][2:3] == [b"OK"] else f"refused {reply.get('code')}"
    return f"{size} x 11 KiB in one PRODUCE: {verdict}, answered in {seconds:.0f} ms"
