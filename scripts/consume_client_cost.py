"""The client's CPU per message in ``BatchConsumer``'s receive loop (PZQ-BATCH/1), with no pzq server: a
child process plays the consume endpoint from docs/native-batch.md (HELLO answered, each CREDIT answered
with DELIVERs of pre-built batches, each ACK with SETTLED), so the figure is the client's own cost
(receive, buffer, ack_async, settle), not the server's. Prints the consumer process's CPU µs per message
and its rate for ``--runs`` runs, and the median. Runs against an older tree too (``PYTHONPATH`` naming
it): compare alternately, as the machine is shared.

    PYTHONPATH=$PWD .venv/bin/python scripts/consume_client_cost.py [--count 200000] [--ask 100] [--prefetch 100]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time

import zmq


def fake_server(dsn: str, batch: int) -> None:
    """The consume endpoint's answers, as fast as a ROUTER sends them: credit is served in DELIVERs of up
    to ``batch`` messages of 100 bytes (keys of 49 bytes, as the server's)."""
    from pzq.protocols import native_consume as wire

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.bind(dsn)
    bodies = [[b"x" * 100]] * batch
    seq = 0
    while True:
        peer, *frames = sock.recv_multipart()
        name = frames[0]
        if name == b"HELLO":
            sock.send_multipart([peer, *wire.hello_reply(1000, batch, 1000, 60_000_000, 60_000_000)])
        elif name == b"CREDIT":
            left = int(frames[1])
            while left > 0:
                n = min(left, batch)
                keys = [b"%016d|%032d" % (seq + i, seq + i) for i in range(n)]
                seq += n
                sock.send_multipart([peer, *wire.deliver(60_000_000, int(time.time() * 1e6), keys, bodies[:n])])
                left -= n
        elif name == b"ACK":
            count = len(wire.decode_keys(frames[1], 1000))
            sock.send_multipart([peer, *wire.settled(count, [])])
        elif name == b"BYE":
            sock.send_multipart([peer, *wire.bye_reply(0)])


def run(dsn: str, count: int, ask: int, prefetch: int) -> tuple[float, float]:
    """Drain ``count`` messages: (client CPU µs a message, messages a second)."""
    from pzq.clients.native import BatchConsumer

    with BatchConsumer(dsn, prefetch=prefetch) as consumer:
        got = 0
        cpu, wall = time.process_time(), time.perf_counter()
        while got < count:
            batch = consumer.receive(ask, timeout_s=5)
            if not batch:
                raise SystemExit("no delivery within 5 s")
            consumer.ack_async([key for key, _ in batch])
            got += len(batch)
        consumer.settle()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / got * 1e6, got / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--ask", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dsn = f"ipc://{tmp}/consume"
        server = multiprocessing.Process(target=fake_server, args=(dsn, args.ask), daemon=True)
        server.start()
        try:
            figures = []
            for i in range(args.runs):
                us, rate = run(dsn, args.count, args.ask, args.prefetch)
                figures.append(us)
                print(f"run {i + 1}: {us:.2f} client CPU µs a message, {rate:,.0f} messages a second")
            print(f"median: {statistics.median(figures):.2f} client CPU µs a message")
        finally:
            server.terminate()
            server.join(5)


if __name__ == "__main__":
    main()
