"""Crash safety under load: producers pipeline and consumers ack while the server is killed with SIGKILL
at random moments, twenty times in a row. Every message acked to a producer must be delivered at some
point or still be stored; the store must open every time. Duplicates are reported (at-least-once)."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest
import zmq

from conftest import wait_connected

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KILLS = 20


class Load:
    """One pipelining producer and one acking consumer, on their own sockets, across restarts."""

    def __init__(self, server):
        self.server = server
        self.acked: set[bytes] = set()
        self.delivered: list[bytes] = []
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        # Daemons: a test that times out before finish() must not keep the process from exiting.
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._produce, self._consume)]

    def start(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def _produce(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.server.receive)
        sent, pending = 0, {}
        while not self.stop.is_set():
            while len(pending) < 100:
                body = b"msg-%d" % sent
                sock.send_multipart([b"%d" % sent, b"", body])
                pending[b"%d" % sent] = time.monotonic()
                sent += 1
            if sock.poll(50):
                mid, status, *_ = sock.recv_multipart()
                if pending.pop(mid, None) is not None and status == b"1":
                    self.acked.add(b"msg-" + mid)
            # Acks lost in a crash never come: after a while their messages' fate is simply unknown.
            for mid in [m for m, t in pending.items() if time.monotonic() - t > 2]:
                del pending[mid]
        sock.close(0)

    def _consume(self) -> None:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.server.send)
        while not self.stop.is_set():
            if sock.poll(50):
                peer, key, _sent, _timeout, _empty, body = sock.recv_multipart()
                self.delivered.append(body)
                sock.send_multipart([peer, key, b"1"])
        sock.close(0)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        if not any(thread.is_alive() for thread in self.threads):  # (else its sockets are still open)
            self.ctx.term()


def test_twenty_sigkills_under_load_lose_no_acked_message(process_server, sockets, capsys):
    server = process_server()
    load = Load(server).start()
    rng = random.Random(20261121)
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.6))  # a random moment under load
            server.restart(signal.SIGKILL)  # start() raises if the store does not open
    finally:
        time.sleep(0.5)
        load.finish()
    # Drain what is left, then compare.
    consumer = wait_connected(sockets(zmq.ROUTER, None), server.send)
    left = []
    deadline = time.monotonic() + 60
    while server.stats()["messages"]:  # until the server holds nothing more, not until a quiet spell
        assert time.monotonic() < deadline, f"{server.stats()['messages']} messages still stored after 60 s"
        if consumer.poll(100):
            peer, key, _sent, _timeout, _empty, body = consumer.recv_multipart()
            left.append(body)
            consumer.send_multipart([peer, key, b"1"])
    seen = load.delivered + left
    lost = load.acked - set(seen)
    duplicates = len(seen) - len(set(seen))
    with capsys.disabled():
        print(
            f"\ncrash test: {KILLS} SIGKILLs survived, {len(load.acked)} messages acked to the producer, "
            f"lost {len(lost)}, {len(seen)} deliveries of {len(set(seen))} messages "
            f"({duplicates} duplicates)"
        )
    assert len(load.acked) > 1000
    assert not lost, sorted(lost)[:10]
