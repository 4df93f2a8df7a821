"""The batched consumers' gateway on a real broker and store, without sockets: the order of service,
their bodies in the byte account, slots shared per CURVE key, silent consumers, and a rolled-back turn."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS
from pzq.gateways.native_consume import HOLDER, BatchConsumeGateway
from pzq.protocols import native_consume as wire


@pytest.fixture
def broker(store):
    b = Broker(store, ack_timeout_s=5.0)
    b.produce_many("default", [[b"m%d" % i] for i in range(500)], now_us=1)
    return b


def gateway(broker, **limits) -> BatchConsumeGateway:
    return BatchConsumeGateway(
        broker,
        queue="default",
        ack_timeout_s=5.0,
        limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
    )


def hello(g: BatchConsumeGateway, peer: bytes, credit: int, now: float = 0.0) -> None:
    g.received(peer, [b"HELLO"], now=now)
    assert g.received(peer, [b"CREDIT", b"%d" % credit], now=now) == []


def never_blocked(peer: bytes) -> bool:
    return False


def test_consumers_with_credit_are_served_a_batch_each_in_turn_so_a_big_credit_does_not_starve_a_small_one(broker):
    g = gateway(broker)
    hello(g, b"big", 1000)
    hello(g, b"small", 10)
    outs = g.dispatch(now=Now(0.0, 2), most=128, blocked=never_blocked)
    assert [(o.frames[0], len(o.refs)) for o in outs] == [(b"big", 100), (b"small", 10), (b"big", 18)]
    # FIFO across the consumers: each batch continues where the last one ended
    seqs = [ref[1] for o in outs for ref in o.refs]
    assert seqs == sorted(seqs) and len(set(seqs)) == 128


def test_a_consumer_whose_answers_cannot_leave_is_skipped_and_the_others_are_served(broker):
    g = gateway(broker)
    hello(g, b"stuck", 50)
    hello(g, b"reader", 50)
    outs = g.dispatch(now=Now(0.0, 2), most=128, blocked=lambda peer: peer == b"stuck")
    assert [(o.frames[0], len(o.refs)) for o in outs] == [(b"reader", 50)]


def test_a_deliver_is_cut_at_the_byte_bound_and_a_bigger_message_goes_alone(store):
    b = Broker(store, ack_timeout_s=5.0)
    b.produce_many("default", [[b"a" * 400], [b"b" * 400], [b"c" * 2000], [b"d" * 10]], now_us=1)
    g = gateway(b, consume_batch_bytes=1000)
    hello(g, b"p", 4)
    outs = g.dispatch(now=Now(0.0, 2), most=128, blocked=never_blocked)
    assert [len(o.refs) for o in outs] == [2, 1, 1]


def test_what_a_consumer_was_handed_counts_in_the_byte_account_until_it_acks_or_says_bye(broker):
    g = gateway(broker)
    hello(g, b"p", 200)
    outs = g.dispatch(now=Now(0.0, 2), most=200, blocked=never_blocked)
    held = lambda: broker.accounts.held((HOLDER, b"p"), broker.inflight)  # noqa: E731
    assert held() == g.dispatched_bytes == 690  # (bodies "m0".."m199"; the DELIVERs' keys are not counted)
    first = wire.parse_reply(outs[0].frames[1:])
    g.received(b"p", wire.ack(first.keys), now=0.0)
    assert held() == 690 - sum(len(frames[0]) for frames in first.bodies)
    g.received(b"p", [b"BYE"], now=0.0)
    assert held() == 0


def test_an_acked_message_stops_counting_against_credit_when_its_ack_is_read_not_when_settled_is_sent(broker):
    g = gateway(broker, consume_max_credit=10)
    hello(g, b"p", 10)
    keys = [
        key
        for out in g.dispatch(now=Now(0.0, 2), most=128, blocked=never_blocked)
        for key in wire.parse_reply(out.frames[1:]).keys
    ]
    assert len(keys) == 10
    assert g.received(b"p", wire.credit(1), now=0.0)[0].frames[1] == wire.ERR  # (holds 10: no room)
    (settled,) = g.received(b"p", wire.ack(keys[:4]), now=0.0)  # (its SETTLED waits for the turn's commit)
    assert settled.kind == wire.ACK
    assert g.received(b"p", wire.credit(4), now=0.0) == [], "the 4 acked make room as the ACK is read"
    assert g.consumers[b"p"].credit == 4 and broker.held_count((HOLDER, b"p")) == 6


def test_a_consumer_that_reads_nothing_is_handed_its_byte_share_and_one_message_more_whatever_its_credit(store):
    b = Broker(store, ack_timeout_s=5.0, limits=dataclasses.replace(DEFAULT_LIMITS, delivery_share=10_000))
    b.produce_many("default", [[b"x" * 1000]] * 50, now_us=1)
    g = gateway(b, delivery_share=10_000)
    hello(g, b"hog", 1000)
    taken = sum(len(out.refs) for out in g.dispatch(now=Now(0.0, 2), most=1000, blocked=never_blocked))
    assert taken == 10 and g.dispatch(now=Now(0.0, 2), most=1000, blocked=never_blocked) == []
    hello(g, b"reader", 5)
    assert sum(len(out.refs) for out in g.dispatch(now=Now(0.0, 2), most=1000, blocked=never_blocked)) == 5


def test_one_curve_key_holds_at_most_its_part_of_the_consumer_slots_and_another_keys_hello_is_answered(broker):
    g = gateway(broker, consume_max_consumers=16)  # (a key's part: 16 / 8 = 2; the last 2 kept for new keys)
    for i in range(16):
        g.received(b"m%d" % i, [b"CREDIT", b"0"], now=0.0)  # (never said HELLO: nothing known)
        said = g.received(b"m%d" % i, [b"HELLO"], now=0.0, user="MALLORY")
        assert said[0].kind == (wire.HELLO if i < 2 else wire.ERR)
        if i < 2:
            g.received(b"m%d" % i, [b"CREDIT", b"1"], now=0.0)  # (busy: never evicted for another)
    refused = wire.parse_reply(g.received(b"m9", [b"HELLO"], now=0.0, user="MALLORY")[0].frames[1:])
    assert refused.code == "too-many-consumers" and "one client may hold 2" in refused.detail
    assert g.received(b"alice", [b"HELLO"], now=0.0, user="ALICE")[0].kind == wire.HELLO
    assert g.stats()["refused_slots_total"] >= 14


def test_a_keys_hello_past_its_part_takes_the_place_of_its_own_idle_consumer_not_anothers(broker):
    g = gateway(broker, consume_max_consumers=16)
    assert g.received(b"alice", [b"HELLO"], now=0.0, user="ALICE")[0].kind == wire.HELLO
    for i in range(3):
        assert g.received(b"m%d" % i, [b"HELLO"], now=float(i), user="MALLORY")[0].kind == wire.HELLO
    assert b"alice" in g.consumers and b"m0" not in g.consumers and set(g.consumers) == {b"alice", b"m1", b"m2"}


def test_a_consumer_forgotten_for_silence_keeps_its_timed_out_copies_charged_until_its_connection_closes(broker):
    g = gateway(broker, consume_idle_s=10.0)
    hello(g, b"p", 3)
    g.connection(b"p", 42)
    g.dispatch(now=Now(0.0, 2), most=3, blocked=never_blocked)
    broker.expire(6.0)  # (its copies may still sit in its pipe)
    g.sweep(11.0)
    assert b"p" not in g.consumers and broker.accounts.held((HOLDER, b"p"), broker.inflight) == 6
    g.disconnected(42)
    assert broker.accounts.held((HOLDER, b"p"), broker.inflight) == 0


def test_a_silent_consumer_loses_its_credit_and_is_forgotten_once_it_holds_nothing(broker):
    g = gateway(broker, consume_idle_s=10.0)
    hello(g, b"silent", 5, now=0.0)
    hello(g, b"holder", 1, now=0.0)
    assert len(g.dispatch(now=Now(0.0, 2), most=1, blocked=lambda peer: peer != b"holder")) == 1
    assert g.next_sweep() == 10.0
    g.sweep(11.0)
    assert list(g.consumers) == [b"holder"]  # (it holds a delivery: kept, without credit)
    assert g.consumers[b"holder"].credit == 0
    reply = g.received(b"silent", [b"CREDIT", b"1"], now=11.0)
    assert reply[0].frames[1:] == wire.error(
        "hello-first", "unknown consumer (never said HELLO, or forgotten): send HELLO"
    )


def test_a_rolled_back_turn_gives_the_credit_of_its_deliveries_back_and_turns_settled_into_err(broker):
    g = gateway(broker)
    hello(g, b"p", 10)
    first = g.dispatch(now=Now(0.0, 2), most=128, blocked=never_blocked)
    keys = wire.parse_reply(first[0].frames[1:]).keys
    settled = g.received(b"p", wire.ack(keys[:2]), now=0.0)
    kept = g.rolled_back(first + settled)
    assert [o.frames[1] for o in kept] == [b"ERR"] and b"store-failure" in kept[0].frames[2]
    assert g.consumers[b"p"].credit == 10


def test_the_endpoint_hands_out_no_more_than_the_turns_records_and_reads_acks_a_record_per_key(broker, tmp_path):
    import msgpack
    import zmq

    from pzq.endpoints.base import Sockets, TurnBudget
    from pzq.endpoints.native_consume import BatchConsumeEndpoint

    from conftest import make_config

    cfg = make_config(tmp_path, consume_dsn=f"inproc://consume-budget-{id(tmp_path)}")
    g = gateway(broker)
    binder = Sockets(zmq.Context.instance())
    endpoint = BatchConsumeEndpoint(cfg, g, binder)
    try:
        hello(g, b"big", 1000)
        endpoint.budget = TurnBudget.start(3600.0, 1 << 30, records=300)
        endpoint.work(Now(0.0, 2))
        assert sum(len(o.refs) for o in endpoint._out) == 300  # (of 500 ready and 1,000 of credit)
        endpoint.budget = TurnBudget.start(3600.0, 1 << 30, records=300)
        endpoint.work(Now(0.0, 2))
        assert sum(len(o.refs) for o in endpoint._out) == 500  # (the rest the next turn)
        flood = zmq.Context.instance().socket(zmq.DEALER)
        flood.connect(cfg.consume_dsn)
        keys = msgpack.packb([b"%016d|%032x" % (i, i) for i in range(1000)])
        for _ in range(5):
            flood.send_multipart([b"ACK", keys])
        endpoint._out = []
        reads = 0
        while reads < 5:
            endpoint.budget = TurnBudget.start(3600.0, 1 << 30, records=1000)
            assert endpoint.sock.poll(5000)
            endpoint.read({endpoint.sock: zmq.POLLIN}, Now(0.0, 2))
            turn = len(endpoint._out) - reads
            assert turn == 1  # (an ACK of 1,000 keys is a turn's records: one a turn)
            reads += turn
        flood.close(linger=0)
    finally:
        binder.close()


def test_a_key_named_twice_in_one_ack_is_settled_once_and_its_repeat_alone_refused(broker):
    g = gateway(broker)
    hello(g, b"p", 3)
    [out] = g.dispatch(now=Now(0.0, 2), most=128, blocked=never_blocked)
    k0, k1, k2 = msgpack.unpackb(out.frames[4])
    [answer] = g.received(b"p", [b"ACK", msgpack.packb([k0, k0, k1, k0])], now=0.0)
    # k0 and k1 acked: 2 settled, only the two repeats of k0 refused (not its first mention)
    assert answer.frames[1:3] == [b"SETTLED", b"2"] and msgpack.unpackb(answer.frames[3]) == [k0, k0]
    [answer] = g.received(b"p", [b"NACK", msgpack.packb([k0, k1, k2])], now=0.0)
    assert answer.frames[1:3] == [b"SETTLED", b"1"] and msgpack.unpackb(answer.frames[3]) == [k0, k1]


def test_a_turn_hands_batched_consumers_no_more_bodies_than_its_bytes_and_each_consumer_one_batch_in_turn(
    store, tmp_path
):
    import zmq

    from pzq.endpoints.base import Sockets, TurnBudget
    from pzq.endpoints.native_consume import BatchConsumeEndpoint

    from conftest import make_config

    b = Broker(store, ack_timeout_s=5.0)
    b.produce_many("default", [[b"x" * (256 << 10)]] * 40, now_us=1)
    cfg = make_config(tmp_path, consume_dsn=f"inproc://consume-bytes-{id(tmp_path)}")
    g = gateway(b)
    endpoint = BatchConsumeEndpoint(cfg, g, Sockets(zmq.Context.instance()))
    try:
        hello(g, b"a", 1000)
        hello(g, b"b", 1000)
        endpoint.budget = TurnBudget.start(3600.0, 2 << 20, records=1000)
        endpoint.work(Now(0.0, 2))
        # 2 MiB of 256 KiB bodies a turn (a batch passes it by one message at most), and a consumer's
        # batch is 1 MiB (one message past it at most) before the next consumer's turn
        assert 8 <= sum(len(o.refs) for o in endpoint._out) <= 10
        assert [(o.frames[0], len(o.refs)) for o in endpoint._out] == [(b"a", 4), (b"b", 4)]
    finally:
        endpoint.sock.close(linger=0)
