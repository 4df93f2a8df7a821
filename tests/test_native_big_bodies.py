"""Big native bodies (issue 26, item 2): what a consumer gets is the producer's bytes, to the byte,
whether the message was let in at once or held for a turn of its own (past the turn's bytes), and
after a restart; frames of a MiB and more, beside small ones."""

from __future__ import annotations

import dataclasses
import os

import zmq

from pzq.clients import native as client
from pzq.config import DEFAULT_LIMITS
from pzq.protocols import native as wire
from pzq.server import Server

from conftest import make_config

MIB = 1 << 20


def _server(tmp_path, name: str) -> tuple[Server, str, str]:
    cfg = make_config(
        tmp_path,
        receive_dsn=f"inproc://big-receive-{name}",
        send_dsn=f"inproc://big-send-{name}",
        monitor_dsn=f"inproc://big-monitor-{name}",
        limits=dataclasses.replace(DEFAULT_LIMITS, turn_write_bytes=MIB),
        max_message_size=16 << 20,  # (big bodies: the default before 1 MiB)
    )
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    return server, cfg.receive_dsn, cfg.send_dsn


def _producer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _turns_until_acked(server: Server, sock: zmq.Socket, count: int) -> list[bytes]:
    acked: list[bytes] = []
    for _ in range(60):
        server._turn(0)
        while sock.poll(0):
            ack = wire.parse_produce_ack(sock.recv_multipart())
            assert ack is not None and ack.ok, ack
            acked.append(ack.message_id)
        if len(acked) == count:
            return acked
    raise AssertionError(f"only {acked} of {count} acked")


def test_big_bodies_are_stored_and_delivered_to_the_byte_held_or_not(tmp_path):
    server, receive, send = _server(tmp_path, "a")
    producer = _producer(receive)
    # Two-frame bodies past a MiB (each held for a turn of its own: more than the turn's bytes), a big
    # frame beside a small one, and a small message: every frame must come back as it was sent.
    bodies = [
        [os.urandom(MIB + 7), os.urandom(MIB)],
        [b"head", os.urandom(2 * MIB + 1)],
        [b"small"],
        [os.urandom(MIB)],
    ]
    consumer = client.Consumer(send, ctx=zmq.Context.instance())
    try:
        for i, body in enumerate(bodies):
            producer.send_multipart(wire.produce(b"m%d" % i, body))
        assert _turns_until_acked(server, producer, len(bodies)) == [b"m0", b"m1", b"m2", b"m3"]
        got = []
        for _ in range(60):
            server._turn(0)
            delivery = consumer.receive(timeout_s=0)
            if delivery is not None:
                got.append(delivery.body)
                consumer.ack(delivery)
            if len(got) == len(bodies):
                break
        assert got == bodies, "every frame delivered as the producer sent it, in order"
    finally:
        consumer.close()
        producer.close(0)
        server.close()


def test_a_big_body_reads_back_to_the_byte_after_a_restart(tmp_path):
    server, receive, _ = _server(tmp_path, "b")
    producer = _producer(receive)
    body = [os.urandom(MIB + 3), b"tail"]
    try:
        producer.send_multipart(wire.produce(b"m", body))
        _turns_until_acked(server, producer, 1)
    finally:
        producer.close(0)
        server.close()
    server, _, send = _server(tmp_path, "c")
    consumer = client.Consumer(send, ctx=zmq.Context.instance())
    try:
        for _ in range(60):
            server._turn(0)
            delivery = consumer.receive(timeout_s=0)
            if delivery is not None:
                break
        else:
            raise AssertionError("nothing delivered after the restart")
        assert delivery.body == body
    finally:
        consumer.close()
        server.close()
