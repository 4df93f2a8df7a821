"""Server CPU per batched native message end to end (issue 27: PZQ-BATCH/1 producers and consumers), and
where it goes: an in-process server (this process's main thread, libzmq's I/O threads beside it) and
pyzmq clients in child processes, as scripts/hotpath_profile.py does for the legacy clients. Three
phases: produce ``--count`` messages in batches of ``--batch`` (``--window`` messages in flight), drain
them (``pzq.clients.native.BatchConsumer``: ``--ask`` a receive, ``--prefetch`` granted ahead, each
batch acked with ``ack_async``, ``--blocking-acks``: ``ack``), then produce and consume at once.
Prints the server's CPU µs per message of each phase (process CPU: the loop and libzmq's threads, as
``pzq bench`` counts it) and, with ``--profile``, the loop's top functions (their call counts are
steady on a busy machine; the times are not).

    .venv/bin/python scripts/hotpath_batched.py [--count 50000] [--prefetch 100] [--profile]
    .venv/bin/python scripts/hotpath_batched.py --no-sockets [--profile]

``--no-sockets``: the batched consume gateway, broker and store alone (no sockets, no fsync), in runs
of ``--batch``: produce, then credit + take + DELIVER frames + ACK, by thread CPU. Runs against an older
tree too (``PYTHONPATH`` naming it; ``--prefetch 0`` where its BatchConsumer has none): compare
alternately.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pstats
import tempfile
import time

import zmq

from pzq.clock import Now


def batch_producer(dsn: str, count: int, window: int, size: int, per: int) -> None:
    from pzq.protocols import native_batch as wire

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dsn)
    body, prefix = b"x" * size, os.urandom(6).hex().encode()  # (ids unique across phases: the server dedups them)
    sent = acked = 0
    pending: dict[bytes, int] = {}
    while acked < count:
        while sent < count and (len(pending) + 1) * per <= max(window, per):
            n = min(per, count - sent)
            pending[b"%s-%d" % (prefix, sent)] = n
            sock.send_multipart(wire.batch(b"%s-%d" % (prefix, sent), [[body]] * n))
            sent += n
        if not sock.poll(30_000):
            raise SystemExit("batch producer: no ack for 30 s")
        ack = wire.parse_batch_ack(sock.recv_multipart())
        if ack is None or ack.error or ack.batch_id not in pending:
            raise SystemExit(f"batch producer: refused {ack!r}")
        acked += pending.pop(ack.batch_id)
    sock.close()


def batch_consumer(dsn: str, count: int, per: int, prefetch: int, blocking_acks: bool = False) -> None:
    from pzq.clients.native_consume import BatchConsumer

    got = 0
    ahead = {"prefetch": prefetch} if prefetch else {}  # (an older tree's BatchConsumer has no prefetch)
    with BatchConsumer(dsn, hello_timeout_s=30, **ahead) as consumer:
        pipelined = hasattr(consumer, "ack_async") and not blocking_acks  # (an older tree's has none)
        while got < count:
            batch = consumer.receive(per, timeout_s=30)
            if not batch:
                raise SystemExit("batch consumer: no delivery for 30 s")
            keys = [key for key, _ in batch]
            if pipelined:  # (acks in flight, answered as they come: more share a commit)
                consumer.ack_async(keys, timeout_s=30)
            elif consumer.ack(keys, timeout_s=30).refused:
                raise SystemExit("batch consumer: acks refused")
            got += len(batch)
        if pipelined and consumer.settle(timeout_s=30).refused:
            raise SystemExit("batch consumer: acks refused")


def no_sockets(count: int, size: int, per: int, profile: cProfile.Profile | None) -> None:
    from pzq.broker import Broker
    from pzq.gateways.native_consume import BatchConsumeGateway
    from pzq.protocols import native_consume as wire
    from pzq.store import Store

    store = Store(tempfile.mkdtemp(prefix="pzq-hot-") + "/db", max_size=1 << 30, sync=False)
    broker = Broker(store, ack_timeout_s=30.0)
    store.queue("q")
    gateway = BatchConsumeGateway(broker, queue="q", ack_timeout_s=30.0)
    body, now_us = [b"x" * size], time.time_ns() // 1000
    produce_s = consume_s = now = 0.0

    def turn(work, *args, **kwargs):
        store.turn_begins()
        broker.turn_begins()
        out = work(*args, **kwargs)
        store.commit(counts_older_than=time.monotonic() - 0.01)  # (as the server: counts acked soon never written)
        broker.committed()
        return out

    gateway.received(b"peer", wire.hello(), now=now)
    for _ in range(0, count, per):
        started = time.thread_time()
        if profile:
            profile.enable()
        turn(broker.produce_many, "q", [body] * per, now_us=now_us)
        middle = time.thread_time()
        gateway.received(b"peer", wire.credit(per), now=now)
        outs = turn(gateway.dispatch, now=Now(now, now_us), most=per, blocked=lambda peer: False)
        keys = [key for out in outs for key in wire.parse_reply(out.frames[1:]).keys]
        settled = turn(gateway.received, b"peer", wire.ack(keys), now=now)
        if profile:
            profile.disable()
        produce_s, consume_s = produce_s + middle - started, consume_s + time.thread_time() - middle
        if len(keys) != per or wire.parse_reply(settled[0].frames[1:]).count != per:
            raise SystemExit(f"{len(keys)} deliveries of a run of {per}")
        now += 0.002
    print(f"    produce: {produce_s / count * 1e6:6.2f} µs CPU per message (broker.produce_many; no sockets)")
    print(f"take + ack: {consume_s / count * 1e6:6.2f} µs CPU per message (credit, dispatch, DELIVER frames, ACK)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=100, help="messages in flight from the producer")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100, help="messages a producer's batch")
    parser.add_argument("--ask", type=int, default=100, help="messages a consumer's receive asks for")
    parser.add_argument("--prefetch", type=int, default=100, help="credit a consumer grants ahead")
    parser.add_argument("--blocking-acks", action="store_true", help="each ack waits for its SETTLED (no ack_async)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="the profile's order (tottime, cumulative)")
    parser.add_argument("--phase", action="append", help="only these phases (repeatable)")
    parser.add_argument("--no-sockets", action="store_true", help="the gateway, broker and store alone")
    args = parser.parse_args()
    profile = cProfile.Profile(time.process_time)  # (CPU, not wall: a shared machine)
    if args.no_sockets:
        no_sockets(args.count, args.size, args.batch, profile if args.profile else None)
        if args.profile:
            pstats.Stats(profile).sort_stats(args.sort).print_stats(40)
        return
    from pzq.config import Config
    from pzq.server import Server

    tmp = tempfile.mkdtemp(prefix="pzq-hot-")
    sockets = ("phpmq_dsn", "emqp_frontend_dsn", "emqp_backend_dsn", "emqp_publish_dsn", "mqks_dsn", "api_dsn")
    cfg = Config(
        database=f"{tmp}/db",
        receive_dsn=f"ipc://{tmp}/receive",
        send_dsn=f"ipc://{tmp}/send",
        consume_dsn=f"ipc://{tmp}/consume",
        monitor_dsn="",
        disk_reserve=0,
        ack_timeout=30.0,
        **dict.fromkeys(sockets, ""),
    ).validate()
    server = Server(cfg)
    server.start()
    ctx = multiprocessing.get_context("spawn")
    n, w, size, b, blocking = args.count, args.window, args.size, args.batch, args.blocking_acks
    phases = {
        "produce": [ctx.Process(target=batch_producer, args=(cfg.receive_dsn, n, w, size, b))],
        "drain": [ctx.Process(target=batch_consumer, args=(cfg.consume_dsn, n, args.ask, args.prefetch, blocking))],
        "end to end": [
            ctx.Process(target=batch_producer, args=(cfg.receive_dsn, n, w, size, b)),
            ctx.Process(target=batch_consumer, args=(cfg.consume_dsn, n, args.ask, args.prefetch, blocking)),
        ],
    }
    for phase, children in phases.items():
        if args.phase and phase not in args.phase:
            continue
        for child in children:
            child.start()
        time.sleep(0.5)  # (the children import and connect: not the server's work)
        cpu, wall, syncs, turns = time.process_time(), time.monotonic(), server.store.syncs, getattr(server, "turns", 0)
        if args.profile:
            profile.enable()
        while any(child.is_alive() for child in children):
            server._turn(10)
        if args.profile:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        if any(child.exitcode for child in children):
            raise SystemExit(f"{phase}: a client failed")
        syncs, turns = server.store.syncs - syncs, getattr(server, "turns", 0) - turns
        print(
            f"{phase:>11}: {cpu / n * 1e6:6.1f} µs server CPU per message ({n / wall:,.0f} msg/s wall, "
            f"{n / max(turns, 1):.0f} messages a turn, {n / max(syncs, 1):.0f} a commit)"
        )
    server.close()
    if args.profile:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(40)


if __name__ == "__main__":
    main()
