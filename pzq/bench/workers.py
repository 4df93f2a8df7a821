"""The processes `pzq bench` starts: producers, consumers and the no-storage echo server (the ceiling).

Each runs in its own OS process (never a thread of the orchestrator), talks only through ZeroMQ to the
server under test, and reports its raw figures back through a multiprocessing queue.

A benchmark body is ``send time (u64 ns, CLOCK_MONOTONIC, system-wide on Linux) | tag (u64) | padding``;
the tag is ``producer index << 40 | message index``, which lets consumers count lost and duplicated
messages exactly.

The native frames are written inline here, not through protocols/native.py: these loops are what is
measured, and the ceiling runs the very same code, so a function call per frame would only blur both.
"""

from __future__ import annotations

import dataclasses
import struct
import time

import zmq

from pzq.zmqio import NOBLOCK, Again, recv_frames, send_frames

BODY_HEAD = struct.Struct(">QQ")  # a bench body's head: send time (ns) and tag, read back by every bench consumer
_ID = struct.Struct(">I")
TAG_SHIFT = 40


@dataclasses.dataclass
class ProducerJob:
    endpoint: str
    index: int
    count: int
    window: int
    size: int
    rate: float = 0.0  # messages per second for this producer; 0 = as fast as the window allows
    timeout_s: float = 30.0
    batch: int = 0  # messages per batch (pzq.bench.batched); the legacy producer sends one at a time
    # more servers' receive endpoints (shards, pzq.bench.batched only): batches go to whichever has room,
    # ``window`` in flight at each (as a ShardedProducer's lanes)
    others: tuple[str, ...] = ()


@dataclasses.dataclass
class ProducerResult:
    index: int
    acked: int
    refused: int
    seconds: float
    latencies_ns: list[int]
    error: str = ""


def add_progress(progress, done: int, reported: int, every: int = 100) -> int:
    """Add to the shared progress counter what was done since the last report, once ``every`` more
    are done (0: now); returns what is reported so far."""
    if done - reported < every:
        return reported
    with progress.get_lock():
        progress.value += done - reported
    return done


def run_producer(job: ProducerJob, start, progress, results) -> None:
    """Send ``job.count`` messages with at most ``job.window`` unacked; report ack latencies."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(job.endpoint)
    pad = b"x" * max(0, job.size - BODY_HEAD.size)
    sent_at = [0] * job.count
    latencies: list[int] = []
    interval_ns = int(1e9 / job.rate) if job.rate else 0
    start.wait()
    t0 = time.monotonic_ns()
    nxt = acked = refused = pending = 0
    error = ""
    reported = 0
    while acked + refused < job.count:
        while nxt < job.count and pending < job.window:
            now = time.monotonic_ns()
            if interval_ns and now < t0 + nxt * interval_ns:
                break
            sent_at[nxt] = now
            send_frames(sock, [_ID.pack(nxt), b"", BODY_HEAD.pack(now, (job.index << TAG_SHIFT) | nxt) + pad])
            nxt += 1
            pending += 1
        if interval_ns and nxt < job.count and pending < job.window:
            # Paced: sleep until the next send is due (sub-millisecond, which poll's ms timeout is
            # not), taking acks as they come. A spinning producer would steal a core from the server.
            due = t0 + nxt * interval_ns - time.monotonic_ns()
            if due > 0 and not sock.poll(0):
                time.sleep(due / 1e9)
                continue
            wait_ms = 0
        else:
            wait_ms = int(job.timeout_s * 1000)
        if not sock.poll(wait_ms):
            if wait_ms:
                error = f"no ack within {job.timeout_s} s"
                break
            continue
        while True:
            try:
                frames = recv_frames(sock, NOBLOCK)
            except Again:
                break
            now = time.monotonic_ns()
            i = _ID.unpack(frames[0])[0]
            latencies.append(now - sent_at[i])
            pending -= 1
            if frames[1] == b"1":
                acked += 1
            else:
                refused += 1
        reported = add_progress(progress, acked + refused, reported)
    seconds = (time.monotonic_ns() - t0) / 1e9
    add_progress(progress, acked + refused, reported, every=0)
    results.put(ProducerResult(job.index, acked, refused, seconds, latencies, error))
    sock.close()
    ctx.term()


@dataclasses.dataclass
class ConsumerJob:
    endpoint: str
    index: int
    producers: int
    per_producer: int
    idle_timeout_s: float = 10.0
    credit: int = 100  # deliveries granted at once (pzq.bench.batched); the legacy consumer takes what comes
    others: tuple[str, ...] = ()  # more servers' consume endpoints (pzq.bench.batched): ``credit`` at each


@dataclasses.dataclass
class ConsumerResult:
    index: int
    received: int
    seen: list[bytearray]
    first_ns: int
    last_ns: int
    latencies_ns: list[int]
    error: str = ""


def run_consumer(job: ConsumerJob, start, progress, done, results) -> None:
    """Receive and ack until ``done`` says every message arrived (or nothing came for a while)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(job.endpoint)
    seen = [bytearray(job.per_producer) for _ in range(job.producers)]
    latencies: list[int] = []
    received = reported = 0
    first_ns = last_ns = 0
    error = ""
    mask = (1 << TAG_SHIFT) - 1
    start.wait()
    idle_since = time.monotonic()
    while not done.is_set():
        if not sock.poll(50):
            if time.monotonic() - idle_since > job.idle_timeout_s:
                error = f"nothing received for {job.idle_timeout_s} s"
                break
            continue
        idle_since = time.monotonic()
        while True:
            try:
                frames = recv_frames(sock, NOBLOCK)
            except Again:
                break
            now = time.monotonic_ns()
            send_frames(sock, [frames[0], frames[1], b"1"])
            sent_ns, tag = BODY_HEAD.unpack_from(frames[5])
            producer, seq = tag >> TAG_SHIFT, tag & mask
            if producer < job.producers and seq < job.per_producer:
                seen[producer][seq] += 1
            latencies.append(now - sent_ns)
            received += 1
            first_ns = first_ns or now
            last_ns = now
        reported = add_progress(progress, received, reported, every=0)
    add_progress(progress, received, reported, every=0)
    results.put(ConsumerResult(job.index, received, seen, first_ns, last_ns, latencies, error))
    sock.close()
    ctx.term()


def run_echo_server(endpoint: str, ready) -> None:
    """The ceiling: a ROUTER that acks every message at once and stores nothing."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(endpoint)
    ready.set()
    ok = b"1"
    while True:
        frames = recv_frames(sock)
        send_frames(sock, [frames[0], frames[1], ok, b""])


def run_forwarder(receive: str, send: str, ready) -> None:
    """The end-to-end ceiling: ack each produced message at once and pass it to a consumer, storing
    nothing and tracking nothing; consumers' acks are read and dropped. Same frames as pzq."""
    ctx = zmq.Context()
    front, back = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock, endpoint in ((front, receive), (back, send)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(endpoint)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    ready.set()
    ok, timeout = b"1", b"30000000"
    while True:
        for sock, _ in poller.poll():
            for _ in range(4096):
                try:
                    frames = recv_frames(sock, NOBLOCK)
                except Again:
                    break
                if sock is front:
                    send_frames(front, [frames[0], frames[1], ok, b""])
                    send_frames(back, [frames[1], b"%d" % time.time_ns(), timeout, b"", *frames[3:]])
