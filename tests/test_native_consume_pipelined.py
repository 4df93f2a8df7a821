"""Pipelined acks of the batched consumer (``BatchConsumer.ack_async`` and ``settle``, issue 27): acks in
flight are matched to their SETTLED answers in order, refusals are reported, the window bounds what is
in flight, and what was acked does not come back."""

from __future__ import annotations

import dataclasses

import pytest

from pzq.clients import native as client
from pzq.config import DEFAULT_LIMITS
from pzq.protocols import native_consume as wire


def produce(endpoint: str, count: int) -> None:
    with client.Producer(endpoint) as producer:
        results = producer.produce_many([[b"m%d" % i] for i in range(count)])
    assert all(r.ok for r in results)


def receive_all(consumer: client.BatchConsumer, count: int, most: int = 100) -> list[tuple[bytes, list[bytes]]]:
    got: list[tuple[bytes, list[bytes]]] = []
    while len(got) < count:
        batch = consumer.receive(min(most, count - len(got)), 5000)
        assert batch, f"only {len(got)} of {count} delivered"
        got += batch
    return got


def test_acks_sent_without_waiting_are_all_settled_and_nothing_comes_back(server):
    produce(server.receive, 300)
    with client.BatchConsumer(server.config.consume_dsn, prefetch=20, ack_window=2) as consumer:
        for _ in range(15):
            batch = consumer.receive(20, 5000)
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
