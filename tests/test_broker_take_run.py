"""The broker's batch path (Broker.take_run, Store.plain_run): stored records handed on as read where no
message asks for a look, the general path from the first that does, and the same effects as ``take``."""

from __future__ import annotations

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.store import Store

T0 = 1_700_000_000_000_000  # a wall-clock µs timestamp


@pytest.fixture
def broker(store):
    return Broker(store, ack_timeout_s=10.0)


def bodies(taken) -> list[bytes]:
    return [b"".join(frames) for _, _, frames in taken]


def take_run(broker: Broker, n: int = 100, consumer: str = "c1", **kw) -> list:
    return broker.take_run("q", n, consumer, now=Now(0.0, T0), **kw)


def test_a_run_is_handed_on_in_fifo_order_with_its_refs_enqueue_times_and_frames(broker):
    broker.produce_many("q", [[b"a"], [b"b", b"c"], [b"d"]], now_us=T0)
    taken = take_run(broker)
    assert [frames for _, _, frames in taken] == [[b"a"], [b"b", b"c"], [b"d"]]
    assert [enqueued for _, enqueued, _ in taken] == [T0] * 3
    qid = broker.store.queue("q").qid
    assert [ref for ref, _, _ in taken] == [(qid, 1), (qid, 2), (qid, 3)]
    assert broker.held_count("c1") == 3 and broker.counters.delivered == 3
    assert take_run(broker) == []


def test_a_run_counts_each_delivery_as_take_does_and_a_redelivery_as_one(broker):
    broker.produce_many("q", [[b"a"], [b"b"]], now_us=T0)
    first = take_run(broker)
    assert broker.store.get("q", first[0][0][1]).deliveries == 1
    broker.nack(first[0][0], by="c1")  # (it comes back: the general path takes it, counted again)
    again = take_run(broker, consumer="c2")
    assert bodies(again) == [b"a"]
    assert broker.store.get("q", first[0][0][1]).deliveries == 2
    assert broker.counters.redelivered == 1


def test_a_message_with_a_ttl_stops_the_run_and_the_general_path_dead_letters_it_when_stale(broker):
    broker.produce_many("q", [[b"a"]], now_us=T0)
    broker.produce("q", [b"stale"], now_us=T0, expires_us=T0 - 1)
    broker.produce("q", [b"fresh"], now_us=T0, expires_us=T0 + 10**9)
    broker.produce_many("q", [[b"b"]], now_us=T0)
    assert bodies(take_run(broker)) == [b"a", b"fresh", b"b"]
    assert broker.store.queue("q").dead_count == 1


def test_a_message_with_its_own_delivery_cap_is_taken_by_the_general_path(store):
    broker = Broker(store, ack_timeout_s=10.0)
    broker.produce("q", [b"capped"], now_us=T0, meta={"max_deliveries": 1})
    broker.produce_many("q", [[b"plain"]], now_us=T0)
    taken = take_run(broker)
    assert bodies(taken) == [b"capped", b"plain"]
    broker.nack(taken[0][0], by="c1")
    assert take_run(broker) == []  # (delivered once: its cap sends it to the dead letters)
    assert store.queue("q").dead_count == 1


def test_with_max_deliveries_every_message_is_looked_at(store):
    broker = Broker(store, ack_timeout_s=10.0, max_deliveries=1)
    broker.produce_many("q", [[b"a"]], now_us=T0)
    taken = take_run(broker)
    broker.nack(taken[0][0], by="c1")
    assert take_run(broker) == []
    assert store.queue("q").dead_count == 1


def test_messages_already_in_flight_are_passed_over_and_the_run_goes_on_past_them(broker):
    broker.produce_many("q", [[b"%d" % i] for i in range(6)], now_us=T0)
    qid = broker.store.queue("q").qid
    for seq in (1, 2, 3):  # (held since start-up, as a durable lease re-registered: the cursor meets them)
        broker.hold((qid, seq), "lease")
    assert bodies(take_run(broker, 2)) == [b"3", b"4"]
    assert bodies(take_run(broker)) == [b"5"]


def test_a_run_stops_once_its_records_reach_max_bytes_but_always_takes_one(broker):
    broker.produce_many("q", [[b"x" * 100] for _ in range(6)], now_us=T0)
    assert len(take_run(broker, max_bytes=1)) == 1
    assert len(take_run(broker, max_bytes=250)) == 3  # (as take: the one that reaches it is taken: 3 x ~110)
    assert len(take_run(broker, max_bytes=1 << 20)) == 2


def test_an_unreadable_record_in_a_run_is_set_aside_by_the_general_path_and_the_rest_delivered(broker, store):
    broker.produce_many("q", [[b"a"], [b"b"], [b"c"]], now_us=T0)
    info = store.queue("q")
    from pzq.store.layout import KEY

    txn = store.env.write()
    txn.put(KEY.pack(info.qid, 2), b"\x93\xc1\xc1\xc1", db=store._messages_db)  # (0xc1: never valid msgpack)
    assert bodies(take_run(broker)) == [b"a", b"c"]
    assert store.damaged_total == 1


def test_a_run_and_its_acks_leave_the_store_and_the_in_flight_table_as_take_and_ack_do(tmp_path):
    figures = []
    for batch in (True, False):
        store = Store(str(tmp_path / f"db{batch}"), max_size=1 << 26, sync=False)
        broker = Broker(store, ack_timeout_s=10.0)
        broker.produce_many("q", [[b"%d" % i] for i in range(10)], now_us=T0)
        if batch:
            refs = [ref for ref, _, _ in take_run(broker, 6)]
        else:
            refs = [(m.qid, m.seq) for m in broker.take("q", 6, "c1", now=Now(0.0, T0))]
        assert broker.ack_many(refs[:4] + refs[:1], by="c1") == refs[:1]  # (a repeat is refused)
        info = store.queue("q")
        figures.append((info.count, broker.held_count("c1"), broker.queue_inflight(info.qid), broker.counters))
        store.close()
    assert figures[0] == figures[1]


def test_counts_written_by_a_commit_are_read_by_the_next_run_and_deleted_with_the_ack(store):
    broker = Broker(store, ack_timeout_s=10.0)
    broker.produce_many("q", [[b"a"], [b"b"]], now_us=T0)
    assert len(take_run(broker)) == 2
    store.commit()  # (the counts are written: a commit with no age given writes every one)
    broker = Broker(store, ack_timeout_s=10.0)  # (a restart: every delivery forgotten, the cursor at 0)
    taken = take_run(broker)
    assert bodies(taken) == [b"a", b"b"] and broker.counters.redelivered == 2
    store.commit()
    assert [store.get("q", ref[1]).deliveries for ref, _, _ in taken] == [2, 2]
    assert broker.ack_many([ref for ref, _, _ in taken], by="c1") == []
    store.commit()
    with store.env.reading() as txn:
        assert txn.stat(store._deliveries_db)["entries"] == 0
