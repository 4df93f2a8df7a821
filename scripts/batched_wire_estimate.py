"""What a batched wire format would reach: a design estimate, not a pzq feature.

    .venv/bin/python scripts/batched_wire_estimate.py [--count 200000] [--batch 100] [--window 4]

pzq's native protocol carries one message per ZeroMQ multipart, so the server pays pyzmq's per-frame
calls (about 5 µs) for every message. This script measures the alternative with the same storage: a
producer process packs ``--batch`` messages of 100 B into one frame (u32 length + body each), keeps
``--window`` batches unacknowledged, and a pyzmq ROUTER server unpacks each batch, stores its bodies
with one ``cursor.putmulti`` in an LMDB write transaction, commits durably (fsync'd, as pzq does) once
per turn, and then acks each batch with one frame. It prints msg/s and server CPU µs per message, to
set beside `pzq bench` and `scripts/compare_peers.py` in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import tempfile
import time

import lmdb
import zmq

_LEN = struct.Struct(">I")
_KEY = struct.Struct(">Q")


def server(endpoint: str, path: str, ready, cpu) -> None:
    env = lmdb.open(path, map_size=4 << 30, sync=True, metasync=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    ready.set()
    seq = 0
    t0 = time.process_time()
    while True:
        sock.poll()
        acks = []
        txn = env.begin(write=True)
        cursor = txn.cursor()
        for _ in range(64):  # batches per turn
            try:
                routing, batch_id, payload = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            if payload == b"stop":
                cpu.value = time.process_time() - t0
                return
            items, off = [], 0
            while off < len(payload):
                (n,) = _LEN.unpack_from(payload, off)
                items.append((_KEY.pack(seq), payload[off + 4 : off + 4 + n]))
                seq += 1
                off += 4 + n
            cursor.putmulti(items, append=True)
            acks.append((routing, batch_id))
        txn.commit()  # durable before any ack leaves
        for routing, batch_id in acks:
            sock.send_multipart((routing, batch_id, b"1"))


def producer(endpoint: str, count: int, batch: int, window: int, size: int, start, result) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    body = b"x" * size
    payload = (_LEN.pack(size) + body) * batch
    batches = count // batch
    start.wait()
    t0 = time.perf_counter()
    sent = acked = 0
    while acked < batches:
        while sent < batches and sent - acked < window:
            sock.send_multipart((_KEY.pack(sent), payload))
            sent += 1
        if not sock.poll(30_000):
            raise SystemExit("no ack within 30 s")
        sock.recv_multipart()
        acked += 1
    result.value = time.perf_counter() - t0
    sock.send_multipart((b"", b"stop"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="messages per frame")
    parser.add_argument("--window", type=int, default=4, help="unacknowledged batches")
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"tcp://127.0.0.1:{_free_port()}"  # loopback TCP, as pzq bench and compare_peers use
        ready, start = mp.Event(), mp.Barrier(2)
        cpu, seconds = mp.Value("d", 0.0), mp.Value("d", 0.0)
        srv = mp.Process(target=server, args=(endpoint, os.path.join(tmp, "db"), ready, cpu))
        srv.start()
        ready.wait(30)
        prod = mp.Process(
            target=producer, args=(endpoint, args.count, args.batch, args.window, args.size, start, seconds)
        )
        prod.start()
        start.wait()
        prod.join()
        srv.join(30)
    count = args.count // args.batch * args.batch
    print(f"batched wire, {args.batch} x {args.size} B per frame, window {args.window} frames, fsync'd commits")
    print(f"  producer: {count / seconds.value:,.0f} msg/s")
    print(f"  server CPU: {cpu.value / count * 1e6:.2f} µs/msg")


if __name__ == "__main__":
    main()
