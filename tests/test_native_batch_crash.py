"""Crash safety of batches: a producer floods batches (four in flight) while the server is killed with
SIGKILL at random moments; every message of every batch acked "1" (or of an acked prefix) must still be
stored afterwards. The pattern of tests/test_crash.py, with batches."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest
import zmq

from pzq.protocols import native_batch as wire

from conftest import wait_connected

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KILLS = 8


class BatchFlood:
    """One producer of batches of 50 messages, each body unique, across restarts."""

    def __init__(self, server):
        self.server = server
        self.acked: set[bytes] = set()
        self.stop = threading.Event()
        self.ctx = zmq.Context()
        self.thread = threading.Thread(target=self._produce, daemon=True)

    def _produce(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.server.receive)
        sent, pending = 0, {}
        while not self.stop.is_set():
            while len(pending) < 4:
                bodies = [b"b%d-%d" % (sent, i) for i in range(50)]
                batch_id = b"b%d" % sent
                sock.send_multipart(wire.batch(batch_id, [[body] for body in bodies]))
                pending[batch_id] = (time.monotonic(), bodies)
                sent += 1
            if sock.poll(50):
                answer = wire.parse_batch_ack(sock.recv_multipart())
                if answer is not None and answer.batch_id in pending:
                    _, bodies = pending.pop(answer.batch_id)
                    self.acked.update(bodies[: answer.stored])
            # Answers lost in a crash never come: after a while their batches' fate is simply unknown.
            for batch_id in [b for b, (t, _) in pending.items() if time.monotonic() - t > 2]:
                del pending[batch_id]
        sock.close(0)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)
        if not self.thread.is_alive():
            self.ctx.term()


def test_sigkills_under_a_flood_of_batches_lose_no_acked_message(process_server, sockets, capsys):
    server = process_server()
    flood = BatchFlood(server)
    flood.thread.start()
    rng = random.Random(20261127)
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.6))  # a random moment under load
            server.restart(signal.SIGKILL)  # start() raises if the store does not open
    finally:
        time.sleep(0.5)
        flood.finish()
    consumer = wait_connected(sockets(zmq.ROUTER, None), server.send)
    seen: set[bytes] = set()
    deadline = time.monotonic() + 120
    while server.stats()["messages"]:  # until the server holds nothing more
        assert time.monotonic() < deadline, f"{server.stats()['messages']} messages still stored after 120 s"
        while consumer.poll(100):
            peer, key, _sent, _timeout, _empty, body = consumer.recv_multipart()
            seen.add(body)
            consumer.send_multipart([peer, key, b"1"])
    lost = flood.acked - seen
    with capsys.disabled():
        print(f"\nbatch crash test: {KILLS} SIGKILLs, {len(flood.acked)} messages acked in batches, lost {len(lost)}")
    assert len(flood.acked) > 1000
    assert not lost, sorted(lost)[:10]
