"""The batched processes of `pzq bench --client batched` (PZQ-BATCH/1, docs/native-batch.md): a producer
that sends batches of ``job.batch`` messages with ``job.window`` *messages* in flight, and a consumer that
grants ``job.credit`` deliveries and acks each received batch in one ACK.

They keep the contract of pzq.bench.workers (same jobs, results, body stamps and progress counter), so
pzq.bench.phases.run_phase drives them like the legacy ones and their figures compare one to one: the
same number of messages in flight, only packed differently.

The producer writes its frames inline with pzq.protocols.native_batch (its loop is what is measured:
``Producer.send_many`` does the same but reports no ack times); a batch's ack time is each of its
messages' ack latency. The consumer is ``pzq.clients.native.BatchConsumer``, as a user would write it.
"""

from __future__ import annotations

import os
import time

import zmq

from pzq.bench.workers import (
    BODY_HEAD,
    TAG_SHIFT,
    ConsumerJob,
    ConsumerResult,
    ProducerJob,
    ProducerResult,
    add_progress,
)
from pzq.clients.native_consume import BatchConsumer
from pzq.errors import ClientError
from pzq.protocols import native_batch as wire
from pzq.zmqio import NOBLOCK, Again, recv_frames, send_frames


def probe(sock: zmq.Socket, timeout_s: float) -> wire.Caps:
    """The server's batch caps; ClientError if it does not speak PZQ-BATCH/1 or does not answer."""
    send_frames(sock, wire.probe(b"bench-probe"))
    if not sock.poll(int(timeout_s * 1000)):
        raise ClientError(f"no answer to the batch probe within {timeout_s} s")
    caps = wire.parse_probe_answer(recv_frames(sock))
    if caps is None:
        raise ClientError("the server does not speak PZQ-BATCH/1")
    return caps


def run_batched_producer(job: ProducerJob, start, progress, results) -> None:
    """Send ``job.count`` messages in batches of ``job.batch``, at most ``job.window`` messages unacked
    (so ``job.window // job.batch`` batches, at least one) at each server (``job.endpoint`` and
    ``job.others``: the next batch to the first with room); report each message's ack latency."""
    ctx = zmq.Context()
    socks = []
    for endpoint in (job.endpoint, *job.others):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(endpoint)
        socks.append(sock)
    error = ""
    try:
        most = min(probe(sock, job.timeout_s).max_messages for sock in socks)
    except ClientError as e:
        start.wait()
        results.put(ProducerResult(job.index, 0, 0, 0.0, [], str(e)))
        _close(ctx, socks)
        return
    # (never more than the window in one batch: the messages in flight are what the systems share)
    per = max(1, min(job.batch or 1, most, job.window))
    batches = max(1, job.window // per)
    pad = b"x" * max(0, job.size - BODY_HEAD.size)
    prefix = b"%s-%d-" % (os.urandom(6).hex().encode(), job.index)  # ids unique across phases of one server
    pending: dict[bytes, tuple[int, int]] = {}  # batch id -> (sent ns, messages)
    inflight = [0] * len(socks)  # batches unacked at each server
    poller = zmq.Poller()  # (kept: Socket.poll makes a Poller at each call)
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    latencies: list[int] = []
    start.wait()
    t0 = time.monotonic_ns()
    nxt = acked = refused = reported = 0
    while acked + refused < job.count:
        for at, sock in enumerate(socks):
            while nxt < job.count and inflight[at] < batches:
                n = min(per, job.count - nxt)
                now = time.monotonic_ns()
                tag = job.index << TAG_SHIFT
                bodies = [[BODY_HEAD.pack(now, tag | i) + pad] for i in range(nxt, nxt + n)]
                batch_id = prefix + b"%d" % nxt
                pending[batch_id] = (now, n)
                inflight[at] += 1
                send_frames(sock, wire.batch(batch_id, bodies))
                nxt += n
        ready = poller.poll(int(job.timeout_s * 1000))
        if not ready:
            error = f"no batch ack within {job.timeout_s} s"
            break
        for sock, _ in ready:
            at = socks.index(sock)
            while True:
                try:
                    frames = recv_frames(sock, NOBLOCK)
                except Again:
                    break
                now = time.monotonic_ns()
                ack = wire.parse_batch_ack(frames)
                entry = pending.pop(ack.batch_id, None) if ack else None
                if ack is None or entry is None:
                    error = f"an answer that is not a batch ack: {frames[:3]!r}"
                    continue
                inflight[at] -= 1
                sent, n = entry
                latencies.extend([now - sent] * n)
                stored = max(0, min(ack.stored, n))
                acked += stored
                refused += n - stored  # (the bench counts them; it does not send them again)
                if ack.error and not error:
                    error = ack.error
        reported = add_progress(progress, acked + refused, reported)
    seconds = (time.monotonic_ns() - t0) / 1e9
    add_progress(progress, acked + refused, reported, every=0)
    results.put(ProducerResult(job.index, acked, refused, seconds, latencies, error))
    _close(ctx, socks)


def _close(ctx: zmq.Context, socks: list[zmq.Socket]) -> None:
    for sock in socks:
        sock.close()
    ctx.term()


def run_batched_consumer(job: ConsumerJob, start, progress, done, results) -> None:
    """Receive with a credit of ``job.credit`` (half of it granted ahead) at each server (``job.endpoint``
    and ``job.others``) and ack each received batch (``ack_async``: SETTLED answers read as they come, all
    waited for at the end) until ``done`` says every message arrived (or nothing came for a while)."""
    seen = [bytearray(job.per_producer) for _ in range(job.producers)]
    latencies: list[int] = []
    received = 0
    first_ns = last_ns = 0
    error = ""
    mask = (1 << TAG_SHIFT) - 1
    consumers: list[BatchConsumer] = []
    try:
        # Half the credit asked for by each receive, half granted ahead: deliveries go on while a batch is
        # acked, and what it holds stays the window (the same number in flight as every other system)
        ask = max(1, job.credit // 2)
        for endpoint in (job.endpoint, *job.others):
            consumers.append(
                BatchConsumer(endpoint, hello_timeout_s=job.idle_timeout_s, prefetch=max(0, job.credit - ask))
            )
    except ClientError as e:
        for consumer in consumers:
            consumer.close()
        start.wait()
        results.put(ConsumerResult(job.index, 0, seen, 0, 0, [], str(e)))
        return
    take = _taker(consumers, ask)
    start.wait()
    idle_since = time.monotonic()
    try:
        while not done.is_set():
            got = take()
            if not got:
                if time.monotonic() - idle_since > job.idle_timeout_s:
                    error = f"nothing received for {job.idle_timeout_s} s"
                    break
                continue
            now = time.monotonic_ns()
            idle_since = time.monotonic()
            for consumer, batch in got:
                for _, frames in batch:
                    sent_ns, tag = BODY_HEAD.unpack_from(frames[0])
                    producer, seq = tag >> TAG_SHIFT, tag & mask
                    if producer < job.producers and seq < job.per_producer:
                        seen[producer][seq] += 1
                    latencies.append(now - sent_ns)
                received += len(batch)
                first_ns = first_ns or now
                last_ns = now
                # (not waiting for its SETTLED: acks in flight share the server's commits; settled below)
                consumer.ack_async([key for key, _ in batch], timeout_s=job.idle_timeout_s)
                add_progress(progress, received, received - len(batch), every=0)
        refused = sum(len(c.settle(timeout_s=job.idle_timeout_s).refused) for c in consumers)
        if refused and not error:
            error = f"{refused} ack(s) refused"
    except ClientError as e:
        error = str(e)
    finally:
        for consumer in consumers:
            consumer.close()
    results.put(ConsumerResult(job.index, received, seen, first_ns, last_ns, latencies, error))


def _taker(consumers: list[BatchConsumer], ask: int):
    """What one step of the consumer's loop receives, as [(consumer, messages)]: one server's receive
    waits up to 50 ms; with several, their sockets are polled (50 ms) and each is asked in turn, waiting a
    millisecond at one with something to read and not at all at the others (a receive of 0 s still tops its
    credit up and returns what a DELIVER left buffered)."""
    if len(consumers) == 1:
        (one,) = consumers
        return lambda: [(one, batch)] if (batch := one.receive(ask, timeout_s=0.05)) else []
    poller = zmq.Poller()
    for consumer in consumers:
        poller.register(consumer.sock, zmq.POLLIN)
    state = {"got": True}  # (the last step received: look again at once before waiting)

    def take() -> list[tuple[BatchConsumer, list]]:
        ready = {sock for sock, _ in poller.poll(0 if state["got"] else 50)}
        got = [(c, b) for c in consumers if (b := c.receive(ask, timeout_s=0.001 if c.sock in ready else 0))]
        state["got"] = bool(got)
        return got

    return take
