"""Pipelined acks of the batched consumer (``BatchConsumer.ack_async`` and ``settle``, issue 27): acks in
flight are matched to their SETTLED answers in order, refusals are reported, the window bounds what is
in flight, and what was acked does not come back."""

from __future__ import annotations

import dataclasses

import pytest
import zmq

from pzq.clients import native as client
from pzq.config import DEFAULT_LIMITS
from pzq.protocols import native_consume as wire

from conftest import recv


def produce(endpoint: str, count: int) -> None:
    with client.Producer(endpoint) as producer:
        results = producer.produce_many([[b"m%d" % i] for i in range(count)])
    assert all(r.ok for r in results)


def receive_all(consumer: client.BatchConsumer, count: int, most: int = 100) -> list[tuple[bytes, list[bytes]]]:
    got: list[tuple[bytes, list[bytes]]] = []
    while len(got) < count:
        batch = consumer.receive(min(most, count - len(got)), timeout_s=5)
        assert batch, f"only {len(got)} of {count} delivered"
        got += batch
    return got


def test_acks_sent_without_waiting_are_all_settled_and_nothing_comes_back(server):
    produce(server.receive, 300)
    with client.BatchConsumer(server.config.consume_dsn, prefetch=20, ack_window=2) as consumer:
        for _ in range(15):
            batch = consumer.receive(20, timeout_s=5)
            assert batch
            consumer.ack_async([key for key, _ in batch])
            assert len(consumer._awaiting) <= 2  # (the window bounds the ACKs in flight)
        left = 300 - 15 * 20
        if left:
            consumer.ack_async([key for key, _ in receive_all(consumer, left)])
        assert consumer.settle() == wire.Settled(300, [])
        assert consumer.settle() == wire.Settled(0, [])  # (summed since the last settle)
    assert server.stats()["queues"]["default"]["depth"] == 0
    assert server.stats()["queues"]["default"]["inflight"] == 0


def test_forged_and_foreign_keys_in_a_pipelined_ack_are_reported_refused_in_order(server):
    produce(server.receive, 6)
    with client.BatchConsumer(server.config.consume_dsn) as one, client.BatchConsumer(server.config.consume_dsn) as two:
        mine = [key for key, _ in receive_all(one, 3)]
        theirs = [key for key, _ in receive_all(two, 3)]
        forged = b"0000000000000001|ffffffffffffffffffffffffffffffff"
        one.ack_async([mine[0], theirs[0], b"garbage"])
        one.ack_async([forged, mine[1], mine[0]])  # (an ack of a key acked already: refused)
        assert one.settle() == wire.Settled(2, [theirs[0], b"garbage", forged, mine[0]])
        assert two.ack(theirs) == wire.Settled(3, [])
    assert server.stats()["queues"]["default"]["depth"] == 1


def test_a_blocking_ack_after_pipelined_ones_gets_only_its_own_answer(server):
    produce(server.receive, 9)
    with client.BatchConsumer(server.config.consume_dsn, ack_window=8) as consumer:
        keys = [key for key, _ in receive_all(consumer, 9)]
        consumer.ack_async(keys[:3])
        consumer.ack_async(keys[3:6])
        assert consumer.ack([*keys[6:], keys[0]]) == wire.Settled(3, [keys[0]])
        assert consumer.settle() == wire.Settled(6, [])
    assert server.stats()["queues"]["default"]["depth"] == 0


def test_a_pipelined_ack_longer_than_max_keys_is_split_and_summed(make_server):
    srv = make_server(limits=dataclasses.replace(DEFAULT_LIMITS, consume_max_keys=4))
    produce(srv.receive, 10)
    with client.BatchConsumer(srv.config.consume_dsn, ack_window=1) as consumer:
        keys = [key for key, _ in receive_all(consumer, 10)]
        consumer.ack_async([*keys, b"garbage"])  # (three ACKs, one in flight at a time)
        assert consumer.settle() == wire.Settled(10, [b"garbage"])
    assert srv.stats()["queues"]["default"]["depth"] == 0


def test_an_ack_window_below_one_is_refused(server):
    with pytest.raises(ValueError, match="ack_window"):
        client.BatchConsumer(server.config.consume_dsn, ack_window=0)


def test_a_raw_consumer_firing_acks_without_reading_gets_one_settled_each_in_the_order_sent(server, sockets):
    # What ack_async relies on: SETTLED answers each ACK or NACK in the order sent, however many are queued
    produce(server.receive, 40)
    sock = sockets(zmq.DEALER, server.config.consume_dsn)
    sock.send_multipart(wire.hello())
    assert isinstance(wire.parse_reply(recv(sock)), wire.Limits)
    sock.send_multipart(wire.credit(40))
    keys: list[bytes] = []
    while len(keys) < 40:
        keys += wire.parse_reply(recv(sock)).keys
    forged = b"0000000000000001|ffffffffffffffffffffffffffffffff"
    commands = [wire.ack(keys[i : i + 4] + [forged] * (i // 4)) for i in range(0, 36, 4)]
    commands.append(wire.nack(keys[36:]))
    for command in commands:
        sock.send_multipart(command)
    answers = [wire.parse_reply(recv(sock)) for _ in commands]
    assert [(a.count, len(a.refused)) for a in answers] == [(4, i) for i in range(9)] + [(4, 0)]


def test_acks_sent_without_waiting_then_closing_at_once_are_not_delivered_again(server):
    produce(server.receive, 30)
    with client.BatchConsumer(server.config.consume_dsn, ack_window=8) as rude:
        got = receive_all(rude, 30, most=10)
        rude.ack_async([key for key, _ in got[:20]])  # (no settle: BYE follows the ACKs on the same pipe)
    with client.BatchConsumer(server.config.consume_dsn) as next_one:
        again = receive_all(next_one, 10)
        assert [body for _, body in again] == [body for _, body in got[20:]]
        assert next_one.ack([key for key, _ in again]) == wire.Settled(10, [])
        assert next_one.receive(10, timeout_s=0.3) == []
