"""How long the loop's turns are while one producer sends 16 MiB messages (issue 26's "big messages"):
an in-process server (its own thread), a producer that sends ``--count`` messages at once and sends
each one answered "busy" again, and a consumer that acks every delivery. Prints the turns' lengths
(p50/p90/p99/longest, the poll's wait included) and the loop's profile by own time.

    .venv/bin/python scripts/big_bodies.py [--count 30] [--size-mib 16]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import tempfile
import threading
import time

import zmq

from pzq.clients import native as client
from pzq.config import Config
from pzq.server import Server


def off_if_known(config: type, *names: str) -> dict[str, str]:
    """``name=""`` (an endpoint off) for each setting this pzq knows: an older tree, run with its own
    PYTHONPATH to compare, lacks the newer ones (the batched consume endpoint's default is a fixed port)."""
    known = {field.name for field in dataclasses.fields(config)}
    return {name: "" for name in names if name in known}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--size-mib", type=int, default=16)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="pzq-big-")
    cfg = Config(
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
        ack_timeout=5.0,
        **off_if_known(Config, "consume_dsn"),
    ).validate()
    server = Server(cfg)
    server.start()
    lengths: list[float] = []
    stop = threading.Event()
    profile = cProfile.Profile()

    def loop() -> None:
        profile.enable()
        while not stop.is_set():
            started = time.perf_counter()
            server._turn(10)
            lengths.append(time.perf_counter() - started)
        profile.disable()

    def produce() -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(cfg.receive_dsn)
        body = os.urandom(args.size_mib << 20)
        for i in range(args.count):
            sock.send_multipart([b"%d" % i, b"", body])
        acked = busy = 0
        while acked < args.count and sock.poll(30_000):
            answer = sock.recv_multipart()
            if answer[1] == b"1":
                acked += 1
            else:
                busy += 1
                sock.send_multipart([answer[0], b"", body])
        print(f"{acked} of {args.count} x {args.size_mib} MiB acked, {busy} answered busy and sent again")
        sock.close()

    def consume() -> None:
        with client.Consumer(cfg.send_dsn) as consumer:
            while not stop.is_set():
                delivery = consumer.receive(timeout_s=0.1)
                if delivery is not None:
                    consumer.ack(delivery)

    threads = [threading.Thread(target=loop), threading.Thread(target=consume, daemon=True)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    produce()
    took = time.monotonic() - started
    stop.set()
    threads[0].join()
    server.close()
    ms = sorted(x * 1000 for x in lengths)
    n = len(ms)
    print(
        f"{n} turns in {took:.1f} s: p50 {ms[n // 2]:.1f} ms, p90 {ms[int(n * 0.9)]:.1f}, "
        f"p99 {ms[int(n * 0.99)]:.1f}, longest {ms[-1]:.1f} (the poll's wait included)"
    )
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
