"""`pzq bench --protocol phpmq`: the benchmark's phases through the PHPMQ gateway, and the
send-then-consume rate (what scripts/phpmq_rate.py measured).

PHPMQ has no receipt for a send: a message counts as sent once written, and only consumers (or the
server's figures) prove it was stored. So there is no window-1 phase and no ack latency, and the
ceiling (a pyzmq server) does not apply.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from pzq.bench.phases import BenchOptions, run_phase
from pzq.bench.server import PzqServer
from pzq.bench.workers import BODY_HEAD, TAG_SHIFT, ConsumerJob, ConsumerResult, ProducerJob, ProducerResult
from pzq.clients.sockets import tcp_connect
from pzq.errors import PzqError
from pzq.protocols.phpmq import ACK, CONSUME, SEND, encode


def phases(options: BenchOptions, server: PzqServer, kw: dict, result: dict) -> dict:
    """The phases that mean something for PHPMQ, which has no receipt for a send: send rate (until
    written), consumer drain, end to end and paced (both prove every message was stored and delivered),
    and the send-then-consume measurement below."""
    kw = {**kw, "producer_fn": run_producer, "consumer_fn": run_consumer}
    result["send"], _ = run_phase(
        "phpmq send",
        options,
        server.phpmq,
        None,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=0,
        **kw,
    )
    result["consumer"], _ = run_phase(
        "phpmq consumer drain",
        options,
        None,
        server.phpmq,
        count=options.count,
        window=0,
        producers=0,
        consumers=options.consumers,
        **kw,
    )
    result["e2e"], _ = run_phase(
        "phpmq end to end",
        options,
        server.phpmq,
        server.phpmq,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=options.consumers,
        **kw,
    )
    result["e2e_paced"], _ = run_phase(
        f"phpmq paced {options.rate:g}/s",
        options,
        server.phpmq,
        server.phpmq,
        count=int(options.rate * options.paced_seconds),
        window=1,
        producers=options.producers,
        consumers=options.consumers,
        rate=options.rate,
        **kw,
    )
    result["send_then_consume"] = send_then_consume(server, options.count, options.size, options.window)
    result["server_rss_mb"] = round(server.rss_mb(), 1)
    return result


def run_producer(job: ProducerJob, start, progress, results) -> None:
    """PHPMQ sends (001, current dialect). The protocol has no receipt: a message counts as done once
    written to the socket; the orchestrator's consumers are what prove it was stored."""
    sock = tcp_connect(job.endpoint, timeout_s=None, nodelay=True)
    pad = b"x" * max(0, job.size - BODY_HEAD.size)
    interval_ns = int(1e9 / job.rate) if job.rate else 0
    start.wait()
    t0 = time.monotonic_ns()
    batch: list[bytes] = []
    for i in range(job.count):
        if interval_ns:
            due = t0 + i * interval_ns - time.monotonic_ns()
            if due > 0:
                time.sleep(due / 1e9)
        body = BODY_HEAD.pack(time.monotonic_ns(), (job.index << TAG_SHIFT) | i) + pad
        batch.append(encode(SEND, [(1, b"default"), (2, body), (5, b"0")]))
        if interval_ns or len(batch) >= job.window:
            sock.sendall(b"".join(batch))
            with progress.get_lock():
                progress.value += len(batch)
            batch.clear()
    if batch:
        sock.sendall(b"".join(batch))
        with progress.get_lock():
            progress.value += len(batch)
    seconds = (time.monotonic_ns() - t0) / 1e9
    results.put(ProducerResult(job.index, job.count, 0, seconds, []))
    sock.close()


def run_consumer(job: ConsumerJob, start, progress, done, results) -> None:
    """A PHPMQ consumer with a credit window of 100 that acks each dispatch as it reads it."""
    sock = tcp_connect(job.endpoint, timeout_s=None, nodelay=True)
    sock.sendall(encode(CONSUME, [(1, b"default"), (4, b"100")]))
    sock.settimeout(0.05)
    seen = [bytearray(job.per_producer) for _ in range(job.producers)]
    latencies: list[int] = []
    received = 0
    first_ns = last_ns = 0
    mask = (1 << TAG_SHIFT) - 1
    buf = bytearray()
    start.wait()
    while not done.is_set():
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
        now = time.monotonic_ns()
        acks = []
        while True:  # whole 003 messages at the front of the buffer
            if len(buf) < 8:
                break
            count, pos, packets = int(buf[6:8]), 8, {}
            for _ in range(count):
                if len(buf) < pos + 32:
                    break
                length = int(buf[pos + 3 : pos + 32])
                if len(buf) < pos + 32 + length:
                    break
                packets[int(buf[pos + 1 : pos + 3])] = bytes(buf[pos + 32 : pos + 32 + length])
                pos += 32 + length
            if len(packets) < count:
                break
            del buf[:pos]
            acks.append(encode(ACK, [(1, b"default"), (3, packets[3])]))
            sent_ns, tag = BODY_HEAD.unpack_from(packets[2])
            producer, seq = tag >> TAG_SHIFT, tag & mask
            if producer < job.producers and seq < job.per_producer:
                seen[producer][seq] += 1
            latencies.append(now - sent_ns)
            first_ns = first_ns or now
            last_ns = now
        if acks:
            sock.sendall(b"".join(acks))
            received += len(acks)
            with progress.get_lock():
                progress.value += len(acks)
    results.put(ConsumerResult(job.index, received, seen, first_ns, last_ns, latencies))
    sock.close()


def send_then_consume(server: PzqServer, count: int, size: int, window: int, timeout_s: float = 60) -> dict:
    """One connection writes ``count`` current-dialect 001s at once; sending ends when the monitor
    shows them all stored (committed). Then one consumer with a credit window of ``window`` acks each
    dispatch as it reads it, until the queue is empty again. Rates of each half and overall."""
    queue, body = b"rate", b"x" * size
    producer = tcp_connect(server.phpmq, timeout_s=timeout_s)
    consumer = tcp_connect(server.phpmq, timeout_s=timeout_s)
    try:
        t0 = time.monotonic()
        producer.sendall(b"".join(encode(SEND, [(1, queue), (2, body), (5, b"0")]) for _ in range(count)))
        stored = _wait_depth(server, "rate", lambda depth: depth >= count, timeout_s)
        t1 = time.monotonic()
        consumer.sendall(encode(CONSUME, [(1, queue), (4, b"%d" % window)]))
        buf, ids = bytearray(), set()
        for _ in range(count):
            packets = _read_message(consumer, buf)
            ids.add(packets[3])
            consumer.sendall(encode(ACK, [(1, queue), (3, packets[3])]))
        left = _wait_depth(server, "rate", lambda depth: depth == 0, timeout_s)
        t2 = time.monotonic()
    finally:
        producer.close()
        consumer.close()
    return {
        "messages": count,
        "stored": stored,
        "received": count,
        "distinct": len(ids),
        "left": left,
        "send_seconds": round(t1 - t0, 6),
        "send_msg_s": round(count / (t1 - t0)),
        "consume_seconds": round(t2 - t1, 6),
        "consume_msg_s": round(count / (t2 - t1)),
        "seconds": round(t2 - t0, 6),
        "msg_s": round(count / (t2 - t0)),
    }


def _wait_depth(server: PzqServer, queue: str, done: Callable[[int], bool], timeout_s: float) -> int:
    """Poll the monitor until the queue's depth is ``done``; its depth then. The 5 ms between asks keep
    the monitor from taking the turns the measured traffic needs."""
    deadline = time.monotonic() + timeout_s
    while not done(depth := server.depth(queue)):
        if time.monotonic() > deadline:
            raise PzqError(f"phpmq: queue {queue} still holds {depth} after {timeout_s:g} s")
        time.sleep(0.005)
    return depth


def _read_message(sock: socket.socket, buf: bytearray) -> dict[int, bytes]:
    """One whole server message (its packets by type), reading more as needed; a silent server times out."""

    def need(n: int) -> bytes:
        while len(buf) < n:
            try:
                more = sock.recv(1 << 20)
            except TimeoutError:
                raise PzqError("phpmq: no dispatch from the server in time") from None
            if not more:
                raise PzqError("phpmq: the server closed the connection")
            buf.extend(more)
        out = bytes(buf[:n])
        del buf[:n]
        return out

    head = need(8)
    packets = {}
    for _ in range(int(head[6:8])):
        packet_head = need(32)
        packets[int(packet_head[1:3])] = need(int(packet_head[3:]))
    return packets
