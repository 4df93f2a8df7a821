#!/usr/bin/env python3
"""Pauses in a batched consumer's deliveries (PZQ-BATCH/1), seen from a client written from
docs/native-batch.md alone: several ways of pipelining ACK and CREDIT, each draining a preloaded queue
on a fresh `pzq serve`, and the longest wait for a DELIVER while the client held credit.

    PYTHONPATH=$PWD .venv/bin/python scripts/batch_consume_gaps.py [--messages 20000] [--style NAME ...]

Nothing of pzq is imported (raw pyzmq and msgpack, as an outside client): the same script measures
whichever tree is on PYTHONPATH. A row per style: messages drained, seconds, msg/s, the longest wait
with credit outstanding, and how many waits passed 100 ms, beside the server's CPU over the drain (a
long wait with the server's CPU low is the server idling with work to do: credit granted, messages
ready; with its CPU high, it is busy answering what the client sent before).

Styles (each grants at most --credit at a time):
- ack-credit: each DELIVER's keys in one ACK, then one CREDIT for as many (two messages);
- credit-ack: the same, CREDIT first;
- per-message: an ACK per message, then the CREDIT;
- small-credit: the ACK, then a CREDIT 1 per message;
- lock-step: the ACK, wait for its SETTLED, then the CREDIT;
- settle-window: ACKs with at most 4 unanswered, then the CREDIT.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

from pzq.bench.server import free_ports

GAP_S = 0.1  # a wait with credit outstanding longer than this counts as a pause
WAIT_S = 5.0  # a receive still unanswered after this ends the run (the server is idle for good)


class Server:
    """`python -m pzq serve` on a temp store, on loopback ports of its own."""

    def __init__(self, *extra: str):
        self.workdir = tempfile.mkdtemp(prefix="pzq-gaps-")
        names = ("receive", "send", "monitor", "consume", "phpmq", "mqks", "api", "emqp-frontend", "emqp-backend")
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        argv = [sys.executable, "-m", "pzq", "serve", "--database", f"{self.workdir}/db", "--log-level", "warning"]
        argv += ["--disk-reserve", "0", "--emqp-publish-dsn", ""]
        for name, port in ports.items():
            argv += [f"--{name}-dsn", f"tcp://127.0.0.1:{port}"]
        self.receive = f"tcp://127.0.0.1:{ports['receive']}"
        self.consume = f"tcp://127.0.0.1:{ports['consume']}"
        self.monitor = monitor = f"tcp://127.0.0.1:{ports['monitor']}"
        self.log = open(f"{self.workdir}/server.log", "ab")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen([*argv, *extra], cwd=self.workdir, stderr=self.log, start_new_session=True)
        sock = zmq.Context.instance().socket(zmq.REQ)
        sock.linger = 0
        sock.connect(monitor)
        sock.send(b"MONITOR")
        deadline = time.monotonic() + 60
        while not sock.poll(200):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("pzq serve did not start")
        sock.close(0)

    def cpu_s(self) -> float:
        """The server's CPU seconds so far (user and system, from /proc)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def preload(endpoint: str, n: int, batch: int = 500) -> None:
    """``n`` messages of 100 bytes, produced in batches (the probe first), every ack waited for."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    sock.send_multipart([b"probe", b"PZQ-BATCH/1", b""])
    if not sock.poll(10_000) or sock.recv_multipart()[1] != b"1":
        raise RuntimeError("the server does not speak PZQ-BATCH/1")
    sent = acked = 0
    while acked < n:
        while sent < n and sent - acked < 4 * batch:
            count = min(batch, n - sent)
            bodies = msgpack.packb([[b"%099d" % (sent + i)] for i in range(count)], use_bin_type=True)
            sock.send_multipart([b"b%d" % sent, b"PZQ-BATCH/1", b"", bodies])
            sent += count
        if not sock.poll(10_000):
            raise RuntimeError("no batch ack within 10 s")
        reply = sock.recv_multipart()
        if reply[1] != b"1":
            raise RuntimeError(f"batch refused: {reply}")
        acked += int(reply[3])
    sock.close(0)


class Consumer:
    """A DEALER on the consume endpoint, HELLO said; ``recv`` times every wait for a DELIVER."""

    def __init__(self, endpoint: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.sock.send_multipart([b"HELLO"])
        reply = self.receive()
        if reply[0] != b"HELLO":
            raise RuntimeError(f"HELLO answered {reply}")
        self.limits = msgpack.unpackb(reply[2], raw=False)
        self.waits: list[float] = []  # each wait for a DELIVER with credit outstanding, in seconds
        self.settled = 0  # messages settled (SETTLED's n, summed)
        self.answers = 0  # SETTLED answers read
        self.early: list[list[bytes]] = []  # keys of DELIVERs read while waiting for a SETTLED

    def receive(self) -> list[bytes]:
        if not self.sock.poll(int(WAIT_S * 1000)):
            raise TimeoutError(f"nothing came for {WAIT_S} s")
        frames = self.sock.recv_multipart()
        if frames[0] == b"ERR":
            raise RuntimeError(frames[1].decode())
        return frames

    def deliver(self) -> list[bytes]:
        """The next DELIVER's keys (SETTLEDs met on the way are counted)."""
        if self.early:
            return self.early.pop(0)
        began = time.monotonic()
        while True:
            frames = self.receive()
            if frames[0] == b"DELIVER":
                self.waits.append(time.monotonic() - began)
                return msgpack.unpackb(frames[3])
            self._settled(frames)

    def settled_answer(self) -> None:
        """Wait for the next SETTLED (DELIVERs met on the way are kept for ``deliver``)."""
        began = time.monotonic()
        while True:
            frames = self.receive()
            if frames[0] != b"DELIVER":
                self._settled(frames)
                return
            self.waits.append(time.monotonic() - began)
            self.early.append(msgpack.unpackb(frames[3]))
            began = time.monotonic()

    def _settled(self, frames: list[bytes]) -> None:
        if frames[0] != b"SETTLED":
            raise RuntimeError(f"unexpected {frames[0]!r}")
        self.settled += int(frames[1])
        self.answers += 1

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def ack(self, keys: list[bytes]) -> None:
        self.send(b"ACK", msgpack.packb(keys, use_bin_type=True))

    def credit(self, n: int) -> None:
        self.send(b"CREDIT", b"%d" % n)

    def close(self) -> None:
        self.sock.close(0)


def drain(consumer: Consumer, style: str, n: int, credit: int) -> None:
    """Take ``n`` messages in ``style``, then wait for the last SETTLED."""
    consumer.credit(credit)
    got = acks = 0  # messages delivered, ACKs sent (settle-window)
    while got < n:
        keys = consumer.deliver()
        got += len(keys)
        if style == "ack-credit":
            consumer.ack(keys)
            consumer.credit(len(keys))
        elif style == "credit-ack":
            consumer.credit(len(keys))
            consumer.ack(keys)
        elif style == "per-message":
            for key in keys:
                consumer.ack([key])
            consumer.credit(len(keys))
        elif style == "small-credit":
            consumer.ack(keys)
            for _ in keys:
                consumer.credit(1)
        elif style == "lock-step":
            consumer.ack(keys)
            consumer.settled_answer()
            consumer.credit(len(keys))
        elif style == "settle-window":
            consumer.ack(keys)
            acks += 1
            while acks - consumer.answers >= 4:
                consumer.settled_answer()
            consumer.credit(len(keys))
        else:
            raise ValueError(style)
    while consumer.settled < n:
        consumer.settled_answer()


STYLES = ("ack-credit", "credit-ack", "per-message", "small-credit", "lock-step", "settle-window")


def run(style: str, n: int, credit: int, extra: tuple[str, ...]) -> str:
    server = Server(*extra)
    try:
        preload(server.receive, n)
        consumer = Consumer(server.consume)
        began, cpu = time.monotonic(), server.cpu_s()
        error = ""
        try:
            drain(consumer, style, n, credit)
        except (TimeoutError, RuntimeError) as exc:
            error = f" ({exc})"
        took = time.monotonic() - began
        busy = (server.cpu_s() - cpu) / took
        waits = consumer.waits
        got = consumer.settled
        consumer.close()
    finally:
        server.close()
    longest = max(waits, default=0.0) * 1000
    pauses = sum(w > GAP_S for w in waits)
    row = f"| {style} | {credit} | {got} | {took:.2f} | {got / took:,.0f} | {busy:.0%} | {longest:.0f} | {pauses} |"
    return row + error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--credit", type=int, action="append", help="credit granted (repeat; default 25, 100, 1000)")
    parser.add_argument("--style", action="append", choices=STYLES, help="a style (repeat; default all)")
    parser.add_argument("--server-arg", action="append", default=[], help="an argument for pzq serve")
    args = parser.parse_args()
    print("| style | credit | settled | s | msg/s | server CPU | longest wait ms | waits > 100 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for style in args.style or STYLES:
        for credit in args.credit or (25, 100, 1000):
            print(run(style, args.messages, credit, tuple(args.server_arg)), flush=True)


if __name__ == "__main__":
    main()
