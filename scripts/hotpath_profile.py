"""Server CPU per legacy native message, and where it goes (issue 27's "leaner legacy path"): an
in-process server (this process's main thread, libzmq's I/O threads beside it) and raw pyzmq clients in
child processes. Three phases: produce ``--count`` messages (a window of ``--window``), drain them
(consume + ack), then produce and consume at once. Prints the server's CPU µs per message of each
phase (process CPU: the loop and libzmq's threads, as ``pzq bench`` counts it), the loop thread's part
of it, the turns' waits for a receive pipe's refill, and, with ``--profile``, the loop's top functions by
own time over all phases.

    .venv/bin/python scripts/hotpath_profile.py [--count 50000] [--window 100] [--profile]
    .venv/bin/python scripts/hotpath_profile.py --no-sockets [--profile]
    .venv/bin/python scripts/hotpath_profile.py --no-sockets --batch 25 [--profile]
    .venv/bin/python scripts/hotpath_profile.py --batch 25 --phase produce [--profile]

``--no-sockets``: the native gateway, broker and store alone (no sockets, no fsync), in runs of 100:
produce, then take + deliver + ack, by thread CPU; steady to a few % even on a busy machine (trees from
issue 25 on: older ones have no pzq.gateways.native). With ``--batch N``: the produce phase alone, each
run of 100 as PZQ-BATCH/1 batches of N (their ids remembered in the dedup table, as the server does);
the profile is then the batched produce path's. With sockets, ``--batch N`` makes the producers send
batches of N, ``--window // N`` of them in flight.

CPU time, not wall time: the figures move little on a shared machine (a few %); run it with
``PYTHONPATH`` naming an older tree to compare, alternately.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import multiprocessing
import pstats
import tempfile
import time

import zmq

from pzq.clock import Now


def producer(dsn: str, count: int, window: int, size: int) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dsn)
    body = b"x" * size
    sent = acked = 0
    while acked < count:
        while sent < count and sent - acked < window:
            sock.send_multipart([b"%d" % sent, b"", body])
            sent += 1
        if not sock.poll(30_000):
            raise SystemExit("producer: no ack for 30 s")
        answer = sock.recv_multipart()
        if answer[1] != b"1":
            raise SystemExit(f"producer: refused {answer!r}")
        acked += 1
    sock.close()


def batched_producer(dsn: str, count: int, window: int, size: int, per: int) -> None:
    """``count`` messages in PZQ-BATCH/1 batches of ``per``, ``window // per`` batches in flight."""
    from pzq.protocols import native_batch as wire

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dsn)
    body, most = b"x" * size, max(1, window // per)
    sent = acked = 0
    while acked < count:
        while sent < count and (sent - acked) // per < most:
            n = min(per, count - sent)
            sock.send_multipart(wire.batch(b"b%d" % sent, [[body]] * n))
            sent += n
        if not sock.poll(30_000):
            raise SystemExit("producer: no ack for 30 s")
        answer = sock.recv_multipart()
        if answer[1] != b"1":
            raise SystemExit(f"producer: refused {answer!r}")
        acked += int(answer[3])
    sock.close()


def consumer(dsn: str, count: int) -> None:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(dsn)
    for _ in range(count):
        if not sock.poll(30_000):
            raise SystemExit("consumer: no delivery for 30 s")
        frames = sock.recv_multipart()
        sock.send_multipart([frames[0], frames[1], b"1"])
    time.sleep(0.5)  # (let the last acks out: LINGER)
    sock.close()


def no_sockets(count: int, size: int, profile: cProfile.Profile | None) -> None:
    from pzq.broker import Broker
    from pzq.gateways.native import RECEIVE, SEND, NativeGateway
    from pzq.store import Store

    store = Store(tempfile.mkdtemp(prefix="pzq-hot-") + "/db", max_size=1 << 30, sync=False)
    broker = Broker(store, ack_timeout_s=30.0)
    store.queue("q")
    gateway = NativeGateway(broker, queue="q", max_message_size=1 << 20, max_inflight=100, ack_timeout_s=30.0)
    body, now_us = b"x" * size, time.time_ns() // 1000
    produce_s = consume_s = now = 0.0

    def turn(work, *args, **kwargs):
        store.turn_begins()
        broker.turn_begins()
        out = work(*args, **kwargs)
        store.commit()
        broker.committed()
        return out

    for first in range(0, count, 100):
        run = [[b"peer", b"%d" % i, b"", body] for i in range(first, first + 100)]
        started = time.thread_time()
        if profile:
            profile.enable()
        turn(gateway.received_many, RECEIVE, run, now=Now(now, now_us))
        middle = time.thread_time()
        sends = turn(gateway.dispatch, now=Now(now, now_us), most=100, most_bytes=1 << 20)
        answers = [[send.frames[0], b"1"] for send in sends]
        turn(gateway.received_many, SEND, answers, now=Now(now + 0.001, now_us))
        if profile:
            profile.disable()
        produce_s, consume_s = produce_s + middle - started, consume_s + time.thread_time() - middle
        if len(sends) != 100:
            raise SystemExit(f"{len(sends)} deliveries of a run of 100")
        now += 0.002
    print(f"    produce: {produce_s / count * 1e6:6.2f} µs CPU per message (gateway, broker, store; no sockets)")
    print(f"take + ack: {consume_s / count * 1e6:6.2f} µs CPU per message (take, delivery frames, acks)")


def _refills(server) -> tuple[int, int]:
    """The native endpoint's refill waits and those that got a refill (0, 0 on trees without them)."""
    for endpoint in getattr(server, "endpoints", []):
        if hasattr(endpoint, "refills"):
            return endpoint.refill_waits, endpoint.refills
    return 0, 0


def no_sockets_batched(count: int, size: int, per: int, profile: cProfile.Profile | None) -> None:
    from pzq.broker import Broker
    from pzq.gateways.native import RECEIVE, NativeGateway
    from pzq.protocols import native_batch as wire
    from pzq.store import Store
    from pzq.store.dedup_keys import DedupKeys

    store = Store(tempfile.mkdtemp(prefix="pzq-hot-") + "/db", max_size=1 << 30, sync=False)
    broker = Broker(store, ack_timeout_s=30.0)
    store.queue("q")
    gateway = NativeGateway(
        broker, queue="q", max_message_size=1 << 20, max_inflight=100, ack_timeout_s=30.0, keys=DedupKeys(store)
    )
    now_us, produce_s, n = time.time_ns() // 1000, 0.0, 0
    for first in range(0, count, 100):
        run = [
            [b"peer", *wire.batch(b"b%d" % i, [[b"%d" % j + b"x" * (size - 8)] for j in range(i, i + per)])]
            for i in range(first, first + 100, per)
        ]
        started = time.thread_time()
        if profile:
            profile.enable()
        store.turn_begins()
        broker.turn_begins()
        answers = gateway.received_many(RECEIVE, run, now=Now(0.0, now_us))
        store.commit()
        broker.committed()
        if profile:
            profile.disable()
        produce_s += time.thread_time() - started
        n += sum(int(send.frames[4]) for send in answers)
        now_us += 10
    if n != count // 100 * 100:
        raise SystemExit(f"{n} stored of {count}")
    print(f"batched produce ({per} a batch): {produce_s / count * 1e6:6.2f} µs CPU per message (no sockets)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="the profile's order (tottime, cumulative)")
    parser.add_argument("--phase", action="append", help="only these phases (repeatable)")
    parser.add_argument("--max-message-size", type=int, default=1 << 20, help="the server's (it sizes RCVHWM)")
    parser.add_argument("--no-sockets", action="store_true", help="the gateway, broker and store alone")
    parser.add_argument("--batch", type=int, default=0, help="--no-sockets: produce PZQ-BATCH/1 batches of N")
    args = parser.parse_args()
    profile = cProfile.Profile(time.process_time)  # (CPU, not wall: a shared machine)
    if args.no_sockets:
        if args.batch:
            no_sockets_batched(args.count, args.size, args.batch, profile if args.profile else None)
        else:
            no_sockets(args.count, args.size, profile if args.profile else None)
        if args.profile:
            pstats.Stats(profile).sort_stats(args.sort).print_stats(40)
        return
    from pzq.config import Config
    from pzq.errors import ConfigError
    from pzq.server import Server

    tmp = tempfile.mkdtemp(prefix="pzq-hot-")
    fields = dict(
        database=f"{tmp}/db",
        receive_dsn=f"ipc://{tmp}/receive",
        send_dsn=f"ipc://{tmp}/send",
        monitor_dsn="",
        phpmq_dsn="",
        emqp_frontend_dsn="",
        emqp_backend_dsn="",
        emqp_publish_dsn="",
        mqks_dsn="",
        api_dsn="",
        disk_reserve=0,
        ack_timeout=30.0,
        max_inflight=args.window,
        max_message_size=args.max_message_size,
        # (the batched consume endpoint's default is a fixed port; an older tree has no such setting)
        **{name: "" for name in ("consume_dsn",) if name in {f.name for f in dataclasses.fields(Config)}},
    )
    try:
        cfg = Config(**fields).validate()
    except ConfigError:  # (an older pzq: --ack-timeout in µs)
        cfg = Config(**{**fields, "ack_timeout": 30_000_000}).validate()
    server = Server(cfg)
    server.start()
    commit_cpu = [0.0]  # the loop thread's CPU in the store's commits (their fdatasyncs' system time)
    real_commit = server.store.commit

    def timed_commit(*args, **kwargs):
        started = time.thread_time()
        try:
            return real_commit(*args, **kwargs)
        finally:
            commit_cpu[0] += time.thread_time() - started

    server.store.commit = timed_commit  # type: ignore[method-assign]
    ctx = multiprocessing.get_context("spawn")
    n, w, size = args.count, args.window, args.size
    make = (
        (lambda: ctx.Process(target=batched_producer, args=(cfg.receive_dsn, n, w, size, args.batch)))
        if args.batch
        else (lambda: ctx.Process(target=producer, args=(cfg.receive_dsn, n, w, size)))
    )
    phases = {
        "produce": [make()],
        "drain": [ctx.Process(target=consumer, args=(cfg.send_dsn, n))],
        "end to end": [
            make(),
            ctx.Process(target=consumer, args=(cfg.send_dsn, n)),
        ],
    }
    for phase, children in phases.items():
        if args.phase and phase not in args.phase:
            continue
        for child in children:
            child.start()
        time.sleep(0.5)  # (the children import and connect: not the server's work)
        cpu, wall, syncs, turns = time.process_time(), time.monotonic(), server.store.syncs, getattr(server, "turns", 0)
        loop_cpu, waits, commit_cpu[0] = time.thread_time(), _refills(server), 0.0
        if args.profile:
            profile.enable()
        while any(child.is_alive() for child in children):
            server._turn(10)
        if args.profile:
            profile.disable()
        cpu, wall, loop_cpu = time.process_time() - cpu, time.monotonic() - wall, time.thread_time() - loop_cpu
        waits = [now - before for now, before in zip(_refills(server), waits, strict=True)]
        if any(child.exitcode for child in children):
            raise SystemExit(f"{phase}: a client failed")
        syncs, turns = server.store.syncs - syncs, getattr(server, "turns", 0) - turns
        print(
            f"{phase:>11}: {cpu / n * 1e6:6.1f} µs server CPU per message, {loop_cpu / n * 1e6:.1f} of it the "
            f"loop's thread, {commit_cpu[0] / n * 1e6:.1f} in commits ({n / wall:,.0f} msg/s wall, "
            f"{n / max(turns, 1):.0f} messages a turn, {n / max(syncs, 1):.0f} a commit)"
        )
        print(f"{'':>11}  refill waits {waits[0]}, refilled {waits[1]} (a turn's waits for a receive pipe's refill)")
    server.close()
    if args.profile:
        pstats.Stats(profile).sort_stats(args.sort).print_stats(40)


if __name__ == "__main__":
    main()
