"""The batched consumer never waits with work to do (issue 40): once a consumer has credit and messages
are ready, its DELIVER comes at once, whatever turn its commands were read in and whatever answers it
still had to read. Before, the server slept until its next event or its 1 s tick (0.4-1.0 s pauses seen
by a client that acked each message in an ACK of its own)."""

from __future__ import annotations

import dataclasses
import time

import msgpack
import pytest
import zmq
from test_native_consume import dealer, produce

from pzq.config import DEFAULT_LIMITS
from pzq.protocols import native_consume as wire
from pzq.server import chores

from conftest import recv, wait_until

# A DELIVER owed comes within this. The server idled up to its next wake-up before: with the 1 s tick,
# pauses of 0.4-1.0 s, which a busy machine's prompt answer (0.39 s seen) could not be told from. With the
# tick and the idle sleep 30 s away (``far_wakeups``), waiting for a wake-up takes seconds.
PROMPT_S = 3.0


@pytest.fixture(autouse=True)
def far_wakeups(monkeypatch):
    """The loop's housekeeping tick 30 s apart (a module constant, not a limit); the tests' servers also
    sleep up to 30 s when idle (--reaper-frequency) and have an ack timeout of 30 s."""
    monkeypatch.setattr(chores, "TICK_S", 30.0)


def deliver_wait(sock: zmq.Socket) -> tuple[list[bytes], float]:
    """The next DELIVER's keys and how long it took (SETTLEDs on the way are passed over)."""
    began = time.monotonic()
    while True:
        reply = wire.parse_reply(recv(sock))
        if isinstance(reply, wire.Delivered):
            return list(reply.keys), time.monotonic() - began
        assert isinstance(reply, wire.Settled), reply


def test_credit_read_in_a_turn_after_its_dispatch_is_served_at_once(make_server, sockets):
    # A turn that spends its records on ACKs leaves the next turn to begin where it stopped: the
    # deliveries, then the reads. The CREDIT read there was served only at the next event or tick.
    limits = dataclasses.replace(DEFAULT_LIMITS, turn_records=20)
    srv = make_server(limits=limits, ack_timeout=30.0, reaper_frequency=30.0)  # (nothing wakes the loop meanwhile)
    produce(srv.receive, 200)
    sock = dealer(sockets, srv)
    sock.send_multipart(wire.credit(20))
    keys: list[bytes] = []
    while len(keys) < 20:
        keys += deliver_wait(sock)[0]
    waits = []
    for _ in range(5):
        for key in keys:  # (an ACK per message, then the credit back: 21 commands at once)
            sock.send_multipart(wire.ack([key]))
        sock.send_multipart(wire.credit(len(keys)))
        keys, wait = deliver_wait(sock)
        waits.append(wait)
        while len(keys) < 20:
            keys += deliver_wait(sock)[0]
    assert max(waits) < PROMPT_S, [round(w, 3) for w in waits]


def test_a_consumer_passed_over_while_its_answers_waited_is_served_once_they_are_sent(make_server, sockets):
    # ACKs of unknown keys, each answered by a SETTLED naming its 1,000 refused keys (~51 KB), sent by a
    # consumer that reads nothing: its pipe fills, the answers wait on pzq's side and it is served
    # nothing. It then grants credit and reads: the flush that sends the last waiting answer leaves it
    # unblocked with credit and messages ready, and nothing else to say (it only read SETTLEDs).
    srv = make_server(ack_timeout=30.0, reaper_frequency=30.0)
    produce(srv.receive, 50)
    waits = []
    for round_ in range(5):
        sock = sockets(zmq.DEALER, None)
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.connect(srv.config.consume_dsn)
        sock.send_multipart(wire.hello())
        assert isinstance(wire.parse_reply(recv(sock)), wire.Limits)
        unknown = msgpack.packb([b"%016d|%032x" % (round_, i) for i in range(1000)])
        for _ in range(60):
            sock.send_multipart([wire.ACK, unknown])
        # (the ACKs read and answered into a pipe that is not read: the server counted their refused keys)
        wait_until(lambda n=60_000 * (round_ + 1): srv.stats()["native_batch"]["refused_keys_total"] >= n)
        sock.send_multipart(wire.credit(1))
        answered = 0
        while answered < 60:
            reply = wire.parse_reply(recv(sock))
            assert isinstance(reply, wire.Settled) and reply.count == 0 and len(reply.refused) == 1000
            answered += 1
        keys, wait = deliver_wait(sock)
        waits.append(wait)
        sock.send_multipart(wire.ack(keys))
        assert wire.parse_reply(recv(sock)) == wire.Settled(1, [])
    assert max(waits) < PROMPT_S, [round(w, 3) for w in waits]
