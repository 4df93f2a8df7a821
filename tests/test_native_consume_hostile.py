"""A hostile batched consumer against a polite one on the same endpoint (issue 27's consume gateway):
it floods ACK and NACK without reading a SETTLED, names keys it was never given (forged from the
predictable key shape: the polite consumer's own), acks twice, nacks then acks, and leaves with all
of it in flight. The polite consumer's deliveries and acks go on, none of its messages is settled by
the other, and nothing it acked comes back."""

from __future__ import annotations

import time

import zmq
from test_native_consume_pipelined import produce, receive_all

from pzq.clients import native as client
from pzq.protocols import native_consume as wire

from conftest import recv


def test_a_consumer_flooding_forged_acks_and_nacks_unread_neither_settles_nor_delays_anothers_deliveries(
    make_server, sockets
):
    server = make_server(ack_timeout=30.0)  # (nothing goes back by the clock while the test reads)
    produce(server.receive, 60)
    with client.BatchConsumer(server.config.consume_dsn, ack_window=4) as polite:
        got = receive_all(polite, 40, most=20)
        keys = [key for key, _ in got]
        rude = sockets(zmq.DEALER, server.config.consume_dsn)
        rude.send_multipart(wire.hello())
        assert isinstance(wire.parse_reply(recv(rude)), wire.Limits)
        rude.send_multipart(wire.credit(5))
        mine: list[bytes] = []
        while len(mine) < 5:
            mine += wire.parse_reply(recv(rude)).keys
        # The polite consumer's keys (named by it: the shape is predictable), twice; garbage; its own keys
        # acked twice and nacked then acked; hundreds of commands it never reads the answers of
        forged = b"0000000000000001|ffffffffffffffffffffffffffffffff"
        rude.send_multipart(wire.nack(mine[:1]))
        rude.send_multipart(wire.ack(mine[:1] + mine[1:3] + mine[1:3]))
        for i in range(300):
            rude.send_multipart(wire.ack(keys + keys + [forged, b"x" * 49]) if i % 2 else wire.nack(keys[:10]))
        # ... meanwhile the polite one settles what it holds, then takes and settles the rest
        started = time.monotonic()
        assert polite.ack(keys) == wire.Settled(40, [])
        rest = receive_all(polite, 16, most=20)  # (60 less its 40, the rude one's 2 settled and 2 held)
        assert polite.ack([key for key, _ in rest]) == wire.Settled(16, [])
        assert polite.receive(10, 300) == []
        assert time.monotonic() - started < 10.0
        bodies = {body[0] for _, body in got + rest}
        assert len(bodies) == 56
        # The rude one's answers, read at last (those past what its pipe held were dropped, and the commands
        # sent meanwhile with them): its own keys settled once, every other key refused
        answers = [wire.parse_reply(recv(rude))]
        while rude.poll(1000):
            answers.append(wire.parse_reply(recv(rude)))
        assert 2 <= len(answers) <= 302
        assert (answers[0].count, answers[0].refused) == (1, [])
        assert (answers[1].count, answers[1].refused) == (2, [mine[0], *mine[1:3]])
        assert all(a.count == 0 and len(a.refused) in (10, 82) for a in answers[2:])
        rude.send_multipart(wire.bye())
        assert wire.parse_reply(recv(rude)) == 2  # (the two it held, back to the queue)
        # What it still held goes to the polite consumer (the one it nacked came already); nothing acked comes back
        again = receive_all(polite, 2, most=20)
        assert {body[0] for _, body in again}.isdisjoint(bodies)
        assert polite.ack([key for key, _ in again]) == wire.Settled(2, [])
        assert polite.receive(10, 300) == []
