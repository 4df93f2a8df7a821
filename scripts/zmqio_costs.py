"""µs per 4-frame message received and sent by pzq.zmqio, pure Python against compiled (pzq._zmqfast), and
pyzmq's own recv_multipart/send_multipart for reference: one process, a ROUTER and a DEALER over ipc://,
messages shaped as a legacy producer's (routing id, seq, empty, a ``--size``-byte body).

    PYTHONPATH=$PWD .venv/bin/python scripts/zmqio_costs.py [--count 100000] [--size 100] [--rounds 5]

Each figure is the best of ``--rounds`` alternated rounds (a shared machine only ever adds time), CPU
time of this thread around the loop alone (filling and draining the other side are outside it).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import zmq

from pzq import zmqio


def _pair(tmp: str, count: int) -> tuple[zmq.Socket, zmq.Socket]:
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    client = ctx.socket(zmq.DEALER)
    for sock in (server, client):
        sock.setsockopt(zmq.SNDHWM, count + 10)
        sock.setsockopt(zmq.RCVHWM, count + 10)
        sock.setsockopt(zmq.LINGER, 0)
    server.bind(f"ipc://{tmp}/costs")
    client.connect(f"ipc://{tmp}/costs")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--many", type=int, default=256, help="messages a recv_many/send_many call")
    args = parser.parse_args()
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
