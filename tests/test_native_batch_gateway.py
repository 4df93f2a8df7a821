"""Batched producers' rules without a socket: NativeGateway fed PZQ-BATCH/1 frames on a real store.

A failed turn is done by hand as the server does it (see tests/test_native_gateway.py): ``store.abort()``,
``broker.reset()``, ``gateway.recover()``, then ``gateway.rolled_back(...)``.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_native_gateway import produced, someone_else_stores_the_seq_after_next

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS
from pzq.errors import StoreError
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import Send
from pzq.gateways.native import RECEIVE, NativeGateway
from pzq.leases import Leases
from pzq.protocols import api, native
from pzq.protocols import native_batch as wire
from pzq.store import Store
from pzq.store.dedup_keys import DedupKeys

T0 = 1_700_000_000_000_000
WINDOW_S = 60.0


def make(store: Store, **limits) -> NativeGateway:
    broker = Broker(store, ack_timeout_s=5.0)
    store.queue("q")
    return NativeGateway(
        broker,
        queue="q",
        max_message_size=1 << 20,
        max_inflight=10,
        ack_timeout_s=5.0,
        keys=DedupKeys(store),
        dedup_window_s=WINDOW_S,
        limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
    )


@pytest.fixture
def gateway(store) -> NativeGateway:
    return make(store)


def batch(peer: bytes, batch_id: bytes, *messages: list[bytes]) -> list[bytes]:
    return [peer, *wire.batch(batch_id, messages)]


def answers(sends: list[Send]) -> list[tuple]:
    """Each answer to a producer, as (id, ok, stored or None for a legacy ack, error)."""
    out: list[tuple] = []
    for send in sends:
        assert send.socket == RECEIVE
        got = wire.parse_batch_ack(send.frames[1:])
        if got is not None:
            out.append((got.batch_id, got.ok, got.stored, got.error))
            continue
        ack = native.parse_produce_ack(send.frames[1:])
        assert ack is not None, send.frames
        out.append((ack.message_id, ack.ok, None, ack.error))
    return out


def bodies(store: Store) -> list[list[bytes]]:
    return [m.frames for m in store.scan("q")]


def test_a_batch_between_legacy_messages_is_stored_and_answered_in_its_place(gateway, store):
    run = [
        produced(b"p", b"m1", b"a"),
        batch(b"p", b"b1", [b"b"], [b"c", b"c2"]),
        produced(b"p", b"m2", b"d"),
    ]
    assert answers(gateway.received_many(RECEIVE, run, now=Now(0.0, T0))) == [
        (b"m1", True, None, ""),
        (b"b1", True, 2, ""),
        (b"m2", True, None, ""),
    ]
    assert bodies(store) == [[b"a"], [b"b"], [b"c", b"c2"], [b"d"]]
    assert len({m.id for m in store.scan("q")}) == 4, "each message has its own id"


def test_a_full_store_mid_batch_stores_a_prefix_and_acks_how_many(tmp_path):
    store = Store(tmp_path / "small", max_size=8192)
    try:
        gateway = make(store)
        said = answers(gateway.received_many(RECEIVE, [batch(b"p", b"b1", *[[b"x" * 500]] * 40)], now=Now(0, T0)))
        [(batch_id, ok, stored, error)] = said
        assert batch_id == b"b1" and not ok and error == native.QUEUE_FULL
        assert 0 < stored < 40 and len(bodies(store)) == stored, "the first `stored` are there, none after"
        again = answers(gateway.received_many(RECEIVE, [batch(b"p", b"b1", *[[b"x" * 500]] * 40)], now=Now(0, T0)))
        assert again == said and len(bodies(store)) == stored, "a resend hears the same, and stores nothing"
    finally:
        store.close()


def test_a_batch_refused_whole_for_room_leaves_no_record_so_its_resend_is_stored_later(tmp_path):
    store = Store(tmp_path / "small", max_size=8192)
    try:
        gateway = make(store)
        gateway.received_many(RECEIVE, [produced(b"p", b"fill", b"x" * 6000)], now=Now(0, T0))
        [(_, ok, stored, error)] = answers(
            gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"y" * 3000])], now=Now(0, T0))
        )
        assert (ok, stored, error) == (False, 0, native.QUEUE_FULL)
        assert DedupKeys(store).get("native:b1") is None
    finally:
        store.close()


def test_a_resent_batch_id_is_stored_once_and_hears_the_first_answer(gateway, store):
    first = gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"], [b"b"])], now=Now(0.0, T0))
    store.commit()
    again = gateway.received_many(RECEIVE, [batch(b"p2", b"b1", [b"a"], [b"b"])], now=Now(1.0, T0 + 10**6))
    assert answers(first) == answers(again) == [(b"b1", True, 2, "")]
    assert bodies(store) == [[b"a"], [b"b"]]
    assert gateway.stats()["batch_duplicates_dropped"] == 1


def test_the_same_id_with_other_messages_is_stored_as_well(gateway, store):
    gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, T0))
    gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"other"])], now=Now(0.0, T0 + 1))
    assert bodies(store) == [[b"a"], [b"other"]], "a duplicate is better than a lost message"


def test_an_id_is_forgotten_after_the_dedup_window(gateway, store):
    gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, T0))
    later = T0 + int(WINDOW_S * 1e6) + 1
    gateway.received_many(RECEIVE, [batch(b"p", b"b2", [b"z"])], now=Now(0.0, later))
    assert DedupKeys(store).get("native:b1") is None, "its record went when the window passed"
    gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, later))
    assert bodies(store) == [[b"a"], [b"z"], [b"a"]]


def test_past_the_most_ids_remembered_the_oldest_is_forgotten_early(store):
    gateway = make(store, batch_dedup_ids=3)
    for i in range(5):
        gateway.received_many(RECEIVE, [batch(b"p", b"b%d" % i, [b"m%d" % i])], now=Now(0.0, T0 + i))
    assert [key for key, _ in DedupKeys(store).items()] == ["native:b2", "native:b3", "native:b4"]
    assert gateway.stats()["batch_ids_forgotten_early"] == 2


def test_remembered_ids_survive_a_new_gateway_on_the_same_store(gateway, store):
    gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, T0))
    store.commit()
    fresh = make(store)
    said = answers(fresh.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, T0 + 5)))
    assert said == [(b"b1", True, 1, "")] and bodies(store) == [[b"a"]]


def test_a_rolled_back_turn_turns_a_batchs_ack_into_store_failure_and_forgets_its_id(gateway, store):
    someone_else_stores_the_seq_after_next(store)
    first = gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, T0))
    assert answers(first) == [(b"b1", True, 1, "")]
    with pytest.raises(StoreError):
        gateway.received_many(
            RECEIVE,
            [batch(b"p", b"b2", [b"b"]), batch(b"p", b"b3", [b"c"]), [b"p", b"p1", wire.MARK, b""]],
            now=Now(0, T0),
        )
    store.abort()
    gateway.broker.reset()
    gateway.recover()
    out = gateway.rolled_back(first)
    assert answers(out[:3]) == [
        (b"b1", False, 0, native.STORE_FAILED),
        (b"b2", False, 0, native.STORE_FAILED),
        (b"b3", False, 0, native.STORE_FAILED),
    ]
    assert wire.parse_probe_answer(out[3].frames[1:]) is not None, "a probe's answer stays true"
    assert bodies(store) == [[b"theirs"]] and DedupKeys(store).get("native:b1") is None
    again = gateway.received_many(RECEIVE, [batch(b"p", b"b1", [b"a"])], now=Now(0.0, T0 + 1))
    assert answers(again) == [(b"b1", True, 1, "")] and [b"a"] in bodies(store), "its resend is stored"


def test_a_hostile_batch_is_refused_whole_and_the_next_one_is_stored(store):
    gateway = make(store, batch_max_messages=3, batch_max_bytes=1000)
    hostile = [
        batch(b"p", b"many", *[[b"a"]] * 4),
        batch(b"p", b"big", [b"x" * 1000]),
        [b"p", b"garbage", wire.MARK, b"", b"\xc1\x00"],
        [b"p", b"nested", wire.MARK, b"", b"\x91" * 900 + b"\xc0"],
        [b"p", b"empty", wire.MARK, b"", b"\x90"],
        [b"p", b"empties", wire.MARK, b"", b"\x92\x90\x90"],
        [b"p", "ïd".encode(), wire.MARK, b"", b"\x91\x91\xc4\x01a"],
    ]
    said = answers(gateway.received_many(RECEIVE, [*hostile, batch(b"p", b"honest", [b"ok"])], now=Now(0, T0)))
    assert [(ok, stored) for _, ok, stored, _ in said] == [(False, 0)] * len(hostile) + [(True, 1)]
    assert all(error for *_, error in said[:-1]) and bodies(store) == [[b"ok"]]
    assert gateway.stats()["batches_refused"] == len(hostile)


def test_an_api_produce_key_in_the_native_namespace_is_refused(store):
    broker = Broker(store, ack_timeout_s=5.0)
    gateway = ApiGateway(
        broker, Leases(broker, timeout_s=60), DedupKeys(store), max_message_size=1 << 20, dedup_window_s=60
    )
    request = api.request(b"r1", "PRODUCE", {"messages": [["q", b"a"]], "key": "native:b1"})
    reply = api.parse_reply(gateway.handle([b"peer", *request], now=Now(0.0, T0))[1:])
    assert reply is not None and not reply[1] and reply[2]["code"] == "bad-arguments"


def test_without_a_dedup_table_a_full_store_mid_batch_still_acks_only_the_prefix(tmp_path):
    store = Store(tmp_path / "small", max_size=8192)
    try:
        broker = Broker(store, ack_timeout_s=5.0)
        store.queue("q")
        gateway = NativeGateway(broker, queue="q", max_message_size=1 << 20, max_inflight=10, ack_timeout_s=5.0)
        said = answers(gateway.received_many(RECEIVE, [batch(b"p", b"b1", *[[b"x" * 500]] * 40)], now=Now(0, T0)))
        [(_, ok, stored, error)] = said
        assert not ok and error == native.QUEUE_FULL and 0 < stored == len(bodies(store)) < 40
    finally:
        store.close()
