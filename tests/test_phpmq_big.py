"""PHPMQ past a turn (issue 39) over real TCP: a big send is written a part per turn and stored to the
byte, the sends after it keep their order, also when its client hangs up at once; a consumer that never
reads holds at most its share of delivered bytes while another drains the rest; and a turn hands out at
most its slice of deliveries, the consuming connections served in turn."""

from __future__ import annotations

import dataclasses
import os
import socket

from pzq.broker import Broker
from pzq.clients import native as client
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS
from pzq.gateways.phpmq import PhpmqGateway
from pzq.protocols.phpmq import ACK, CONSUME, CONTENT, COUNT, MESSAGE_ID, QUEUE, SEND, encode

from conftest import free_tcp_endpoint, wait_until
from test_phpmq import Client

KIB = 1 << 10
SMALL_PARTS = dataclasses.replace(DEFAULT_LIMITS, body_chunk_bytes=64 * KIB, turn_write_bytes=128 * KIB)


def _phpmq_server(make_server, **overrides):
    dsn, addr = free_tcp_endpoint()
    return make_server(phpmq_dsn=dsn, **overrides), addr


def _drain(reader: Client, queue: bytes, want: int) -> list[bytes]:
    """Read ``want`` dispatches, acking each; their contents in the order they came."""
    got = []
    for _ in range(want):
        msg_type, packets, _ = reader.read(10)
        assert msg_type == 3
        got.append(packets[CONTENT])
        reader.send(ACK, (QUEUE, queue), (MESSAGE_ID, packets[MESSAGE_ID]))
    return got


def test_big_sends_are_stored_to_the_byte_in_parts_and_what_followed_them_keeps_its_order(make_server):
    srv, addr = _phpmq_server(make_server, limits=SMALL_PARTS)
    first, second = os.urandom(1 << 20), os.urandom(300 * KIB)
    sender = socket.create_connection(addr, timeout=5)
    stream = b"".join(
        encode(SEND, [(QUEUE, b"big"), (CONTENT, body)]) for body in (first, b"after first", second, b"last")
    )
    sender.sendall(stream)
    sender.close()  # (a PHP script sends and exits: what it sent whole is still stored)
    wait_until(lambda: client.stats(srv.monitor)["queues"].get("big", {}).get("depth") == 4, timeout_s=20)
    reader = Client(addr)
    reader.send(CONSUME, (QUEUE, b"big"), (COUNT, b"10"))
    assert _drain(reader, b"big", 4) == [first, b"after first", second, b"last"]
    figures = client.stats(srv.monitor)
    assert figures["phpmq"]["big_stored_total"] == 2 and figures["phpmq"]["big_held_bytes"] == 0
    reader.sock.close()


def test_a_consumer_that_never_reads_holds_at_most_its_share_while_another_drains_the_rest(make_server):
    share = 1 << 20
    srv, addr = _phpmq_server(make_server, limits=dataclasses.replace(DEFAULT_LIMITS, delivery_share=share))
    body = os.urandom(200 * KIB)
    producer = Client(addr)
    for _ in range(30):
        producer.send(SEND, (QUEUE, b"deaf"), (CONTENT, body))
    wait_until(lambda: client.stats(srv.monitor)["queues"].get("deaf", {}).get("depth") == 30, timeout_s=20)
    deaf = socket.create_connection(addr, timeout=5)
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    deaf.sendall(encode(CONSUME, [(QUEUE, b"deaf"), (COUNT, b"1000")]))

    def delivered() -> int:
        return client.stats(srv.monitor)["memory"]["delivery_bytes"]

    held = wait_until(lambda: (d := delivered()) >= share and d, timeout_s=10)
    reader = Client(addr)
    reader.send(CONSUME, (QUEUE, b"deaf"), (COUNT, b"1000"))
    got = _drain(reader, b"deaf", 30 - held // len(body))
    assert held <= share + len(body), f"the deaf consumer was handed {held} bytes, past its share"
    wait_until(lambda: delivered() == held, timeout_s=10)  # (the reader's acks read: the deaf one got no more)
    deaf.close()  # (what it held goes back at once, to the reader)
    got += _drain(reader, b"deaf", held // len(body))
    assert len(got) == 30 and set(got) == {body}
    wait_until(lambda: client.stats(srv.monitor)["queues"]["deaf"]["depth"] == 0, timeout_s=10)
    reader.sock.close()
    producer.sock.close()


def test_a_dispatch_hands_out_at_most_its_slice_and_the_next_one_begins_with_the_connections_left_out(store):
    broker = Broker(store, ack_timeout_s=60.0)
    gateway = PhpmqGateway(broker, max_content=1 << 20)
    conns = [b"c%d" % i for i in range(4)]
    for conn in conns:
        gateway.connected(conn)
        gateway.received(conn, encode(CONSUME, [(QUEUE, b"q"), (COUNT, b"100")]), now=Now(0.0, 1))
    for i in range(40):
        broker.produce("q", [b"%04d" % i + b"x" * 996], now_us=1)
    first = gateway.dispatch(now=Now(1.0, 1), most=3)
    assert len(first) == gateway.dispatched == 3 and {s.peer for s in first} == {b"c0"}
    second = gateway.dispatch(now=Now(1.0, 1), most=100, most_bytes=2500)
    assert [s.peer for s in second] == [b"c1"] * 3, "one message past the bytes, then the turn's slice is spent"
    assert gateway.dispatched_bytes == 3000
    third = gateway.dispatch(now=Now(1.0, 1), most=2)
    assert {s.peer for s in third} == {b"c2"}, "the connections left out go first"
    rest = gateway.dispatch(now=Now(1.0, 1))  # (unbounded: the one left out first, and it has credit for all)
    assert {s.peer for s in rest} == {b"c3"} and len(first + second + third + rest) == 40
