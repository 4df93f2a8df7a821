"""µs per 4-frame message received and sent by pzq.zmqio, pure Python against compiled (pzq._zmqfast), and
pyzmq's own recv_multipart/send_multipart for reference: one process, a ROUTER and a DEALER over ipc://,
messages shaped as a legacy producer's (routing id, seq, empty, a ``--size``-byte body).

    PYTHONPATH=$PWD .venv/bin/python scripts/zmqio_costs.py [--count 100000] [--size 100] [--rounds 5]
    PYTHONPATH=$PWD .venv/bin/python scripts/zmqio_costs.py --legacy [--count 40000]

``--legacy``: the four calls the server makes per legacy message end to end (receive a producer's
4-frame message, send its 3-frame ack, send a 5-frame delivery from the DEALER, receive the consumer's
2-frame ack), each implementation, and their sum.

Each figure is the best of ``--rounds`` alternated rounds (a shared machine only ever adds time), CPU
time of this thread around the loop alone (filling and draining the other side are outside it).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import zmq

from pzq import zmqio


def _pair(tmp: str, count: int, name: str = "costs") -> tuple[zmq.Socket, zmq.Socket]:
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    client = ctx.socket(zmq.DEALER)
    for sock in (server, client):
        sock.setsockopt(zmq.SNDHWM, count + 10)
        sock.setsockopt(zmq.RCVHWM, count + 10)
        sock.setsockopt(zmq.LINGER, 0)
    server.bind(f"ipc://{tmp}/{name}")
    client.connect(f"ipc://{tmp}/{name}")
    return server, client


def _wait(sock: zmq.Socket, count: int) -> None:
    """Until ``count`` messages wait on ``sock`` (libzmq's I/O thread moves them over)."""
    deadline = time.monotonic() + 30
    while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0:
        if time.monotonic() > deadline:
            raise SystemExit("nothing arrived in 30 s")
        time.sleep(0.01)
    time.sleep(0.2 + count / 500_000)  # (the rest of the run follows its first message)


def receive(impl, server, client, count: int, body: bytes, many: int) -> float:
    for i in range(count):
        client.send_multipart([b"%d" % i, b"", body])
    _wait(server, count)
    got = 0
    start = time.thread_time()
    if impl is None:
        while got < count:
            server.recv_multipart(zmq.NOBLOCK)
            got += 1
    elif many:
        while got < count:
            got += len(impl.recv_many(server, many))
    else:
        recv = impl.recv_frames
        while got < count:
            recv(server, zmqio.NOBLOCK)
            got += 1
    return (time.thread_time() - start) / count * 1e6


def send(impl, server, client, count: int, body: bytes, many: int) -> float:
    client.send(b"hello")
    _wait(server, 1)
    peer = server.recv_multipart()[0]
    messages = [[peer, b"%d" % i, b"", body] for i in range(count)]
    start = time.thread_time()
    if impl is None:
        for frames in messages:
            server.send_multipart(frames, zmq.NOBLOCK)
    elif many:
        for i in range(0, count, many):
            impl.send_many(server, messages[i : i + many], zmqio.NOBLOCK)
    else:
        send_frames = impl.send_frames
        for frames in messages:
            send_frames(server, frames, zmqio.NOBLOCK)
    took = (time.thread_time() - start) / count * 1e6
    for _ in range(count):
        if not client.poll(30_000):
            raise SystemExit("a message sent was not received in 30 s")
        client.recv_multipart()
    return took


LEGACY = ("recv message", "send ack", "send delivery", "recv ack")


def legacy_calls(impl, sockets, count: int, body: bytes) -> dict[str, float]:
    """µs of each of the server's four zmqio calls per legacy message (see --legacy)."""
    prod_srv, prod_cli, pid, cons_srv, cons_cli, cid = sockets
    took = {}
    for i in range(count):
        prod_cli.send_multipart([b"%d" % i, b"", body])
    _wait(prod_srv, count)
    start = time.thread_time()
    for _ in range(count):
        impl.recv_frames(prod_srv, zmqio.NOBLOCK)
    took["recv message"] = time.thread_time() - start
    start = time.thread_time()
    for i in range(count):
        impl.send_frames(prod_srv, [pid, b"%d" % i, b"1"], zmqio.NOBLOCK)
    took["send ack"] = time.thread_time() - start
    start = time.thread_time()
    for i in range(count):
        impl.send_frames(cons_srv, [b"k%d" % i, b"1700000000000000", b"5000000", b"", body], zmqio.NOBLOCK)
    took["send delivery"] = time.thread_time() - start
    for sock in (prod_cli, cons_cli):
        for _ in range(count):
            if not sock.poll(30_000):
                raise SystemExit("a message sent was not received in 30 s")
            sock.recv_multipart()
    for i in range(count):
        cons_cli.send_multipart([cid, b"k%d" % i, b"1"])
    _wait(cons_srv, count)
    start = time.thread_time()
    for _ in range(count):
        impl.recv_frames(cons_srv, zmqio.NOBLOCK)
    took["recv ack"] = time.thread_time() - start
    return {name: t / count * 1e6 for name, t in took.items()}


def legacy(tmp: str, count: int, rounds: int, body: bytes) -> None:
    prod_srv, prod_cli = _pair(tmp, count, "producers")
    cons_cli, cons_srv = _pair(tmp, count, "consumers")  # (the server's send socket is the DEALER)
    prod_cli.send(b"hello")
    cons_srv.send(b"hello")
    _wait(prod_srv, 1)
    _wait(cons_cli, 1)
    sockets = (prod_srv, prod_cli, prod_srv.recv_multipart()[0], cons_srv, cons_cli, cons_cli.recv_multipart()[0])
    impls = [zmqio.PURE] + ([zmqio.COMPILED] if zmqio.COMPILED is not None else [])
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for impl in impls:
            for name, took in legacy_calls(impl, sockets, count, body).items():
                best[impl.name, name] = min(best.get((impl.name, name), took), took)
    print(f"µs per call, the server's four per legacy message, best of {rounds} rounds, thread CPU:")
    for name in LEGACY:
        print(f"{name:14} " + "  ".join(f"{impl.name} {best[impl.name, name]:5.2f}" for impl in impls))
    sums = {impl.name: sum(best[impl.name, name] for name in LEGACY) for impl in impls}
    print("per legacy message end to end: " + ", ".join(f"{name} {total:.2f} µs" for name, total in sums.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--many", type=int, default=256, help="messages a recv_many/send_many call")
    parser.add_argument("--legacy", action="store_true", help="the server's four calls per legacy message")
    args = parser.parse_args()
    if args.legacy:
        with tempfile.TemporaryDirectory() as tmp:
            legacy(tmp, args.count, args.rounds, b"x" * args.size)
        return
    impls = [("pyzmq multipart", None), ("zmqio pure", zmqio.PURE)]
    if zmqio.COMPILED is not None:
        impls.append(("zmqio compiled", zmqio.COMPILED))
    else:
        print("pzq._zmqfast is not built (or PZQ_PURE_PYTHON=1): pure only")
    body = b"x" * args.size
    best: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server, client = _pair(tmp, args.count)
        for _ in range(args.rounds):
            for name, impl in impls:
                for many in (0, args.many) if impl is not None else (0,):
                    label = f"{name}{f' x{many}' if many else ''}"
                    for what, run in (("recv", receive), ("send", send)):
                        took = run(impl, server, client, args.count, body, many)
                        best[label, what] = min(best.get((label, what), took), took)
    print(f"µs per 4-frame message ({args.size}-byte body), best of {args.rounds} rounds, thread CPU:")
    print(f"{'':24} {'recv':>8} {'send':>8}")
    labels = list(dict.fromkeys(label for label, _ in best))
    for label in labels:
        print(f"{label:24} {best[label, 'recv']:8.2f} {best[label, 'send']:8.2f}")
    if zmqio.COMPILED is not None:
        for what in ("recv", "send"):
            ratio = best["zmqio compiled", what] / best["zmqio pure", what]
            print(f"compiled/pure {what}: {ratio:.2f}")


if __name__ == "__main__":
    main()
