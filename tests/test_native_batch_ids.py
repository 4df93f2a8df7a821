"""Batch ids: under CURVE each producer key has its own, so one producer cannot make another's batch look
like a resend by using its id; without CURVE the client's ids start with 16 random bytes (docs/native-batch.md,
"Batch ids: whose they are")."""

from __future__ import annotations

import collections
import shutil

import pytest
import zmq
from test_curve import curve_settings, keys  # noqa: F401 - keys is a fixture
from test_native_batch_gateway import T0, answers, make

from pzq.clients.native_batches import BatchSender
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.curve import secure_client
from pzq.gateways.native import RECEIVE
from pzq.gateways.native_batches import Remembered, id_key, space_of
from pzq.protocols import native_batch as wire
from pzq.store.dedup_keys import DedupKeys

from conftest import free_tcp_endpoint

pytestmark = pytest.mark.timeout(60)
ALICE, MALLORY = "A" * 40, "M" * 40  # (z85 keys are 40 characters)


def keyed(key: str | None, batch_id: bytes, *messages: list[bytes]) -> list[bytes]:
    frames = [b"p-" + (key or "plain").encode()[:4], *wire.batch(batch_id, messages)]
    return frames if key is None else wire.KeyedFrames(frames, key)


def test_two_keys_batches_of_one_id_and_the_same_bodies_are_both_stored(store):
    gateway = make(store)
    run = [keyed(MALLORY, b"b1", [b"same"]), keyed(ALICE, b"b1", [b"same"])]
    assert answers(gateway.received_many(RECEIVE, run, now=Now(0.0, T0))) == [
        (b"b1", True, 1, ""),
        (b"b1", True, 1, ""),
    ]
    assert [m.frames for m in store.scan("q")] == [[b"same"], [b"same"]]
    assert gateway.batches.duplicates_total == 0


def test_a_keys_resend_is_still_stored_once_across_a_restart_and_the_plain_namespace_is_apart(store):
    gateway = make(store)
    gateway.received_many(RECEIVE, [keyed(ALICE, b"b1", [b"m"])], now=Now(0.0, T0))
    store.commit()
    again = make(store)  # (a restart: the ids are read back from the store)
    sends = again.received_many(RECEIVE, [keyed(ALICE, b"b1", [b"m"])], now=Now(0.0, T0 + 1))
    assert answers(sends) == [(b"b1", True, 1, "")] and again.batches.duplicates_total == 1
    # Without CURVE (a socket named unauthenticated) the same id is another namespace's: stored
    sends = again.received_many(RECEIVE, [keyed(None, b"b1", [b"m"])], now=Now(0.0, T0 + 2))
    assert answers(sends) == [(b"b1", True, 1, "")] and again.batches.duplicates_total == 1
    assert len(store.scan("q")) == 2
    remembered = {key for key, _ in DedupKeys(store).items(b"native:")}
    assert remembered == {id_key(b"b1", ALICE), id_key(b"b1", None)} == {f"native:{ALICE}\x1fb1", "native:b1"}


def test_an_id_cannot_reach_into_a_keys_namespace():
    # An id holds printable bytes only, so no plain id names the key of a CURVE key's id, and no key's id
    # names another key's (z85 keys are 40 characters, without the separator)
    with pytest.raises(UnicodeDecodeError):
        id_key(b"\xff", None)
    assert "\x1f" not in id_key(b"A" * 40 + b"~b1", None)


def send_batch(endpoint: str, curve: tuple[str, str], batch_id: bytes, bodies: list[list[bytes]]) -> list[bytes]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, *curve)
    try:
        sock.connect(endpoint)
        sock.send_multipart(wire.batch(batch_id, bodies))
        assert sock.poll(10_000), "no answer to the batch within 10 s"
        return sock.recv_multipart()
    finally:
        sock.close(0)


def test_on_a_curve_server_a_second_key_using_the_same_batch_id_has_its_batch_stored(make_server, keys):  # noqa: F811
    shutil.copy(keys / "mallory" / "mallory.key", keys / "clients")  # (both keys allowed)
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(receive_dsn=endpoint, **curve_settings(keys, unauthenticated="monitor"))
    server_key = str(keys / "server" / "server.key")
    alice = (str(keys / "alice" / "alice.key_secret"), server_key)
    mallory = (str(keys / "mallory" / "mallory.key_secret"), server_key)
    # Mallory saw (or guessed) the id Alice will use and sends it first, with Alice's bodies
    answer = wire.parse_batch_ack(send_batch(endpoint, mallory, b"alice-1", [[b"a1"], [b"a2"]]))
    assert answer == wire.BatchAck(b"alice-1", True, 2)
    answer = wire.parse_batch_ack(send_batch(endpoint, alice, b"alice-1", [[b"a1"], [b"a2"]]))
    assert answer == wire.BatchAck(b"alice-1", True, 2)
    assert srv.stats()["messages"] == 4, "Alice's batch was stored, not taken for a resend of Mallory's"
    answer = wire.parse_batch_ack(send_batch(endpoint, alice, b"alice-1", [[b"a1"], [b"a2"]]))
    assert answer == wire.BatchAck(b"alice-1", True, 2)
    assert srv.stats()["messages"] == 4, "Alice's own resend is still stored once"


def test_the_clients_batch_ids_start_with_16_random_bytes_of_their_own_per_producer():
    ctx = zmq.Context.instance()
    socks = [ctx.socket(zmq.DEALER) for _ in range(2)]
    try:
        first, second = (BatchSender(sock, 1000) for sock in socks)
        ids = [first._next_id(b"b"), first._next_id(b"b"), second._next_id(b"b")]
        assert [len(i.split(b"-")[0]) for i in ids] == [32, 32, 32]  # (hex: 16 bytes)
        assert ids[0].split(b"-")[0] == ids[1].split(b"-")[0] != ids[2].split(b"-")[0]
        assert len(set(ids)) == 3
    finally:
        for sock in socks:
            sock.close(0)


# -- how many ids each key keeps (issue 39: one key's flood evicted every other key's ids) --------------

BOB = "B" * 40


def stored_bodies(store) -> list[list[bytes]]:
    return [m.frames for m in store.scan("q")]


def test_one_keys_flood_of_batches_forgets_its_own_ids_and_another_keys_resend_is_stored_once(store):
    gateway = make(store, batch_dedup_ids=10)
    gateway.received_many(RECEIVE, [keyed(BOB, b"b1", [b"bob"])], now=Now(0.0, T0))
    flood = [keyed(MALLORY, b"m%d" % i, [b"m"]) for i in range(11)]
    gateway.received_many(RECEIVE, flood, now=Now(0.0, T0 + 1))
    sends = gateway.received_many(RECEIVE, [keyed(BOB, b"b1", [b"bob"])], now=Now(0.0, T0 + 2))
    assert answers(sends) == [(b"b1", True, 1, "")] and gateway.batches.duplicates_total == 1
    assert stored_bodies(store).count([b"bob"]) == 1, "Bob's resend is known: stored once"
    figures = gateway.stats()
    assert (figures["batch_ids"], figures["batch_id_keys"], figures["batch_ids_forgotten_early"]) == (10, 2, 2)
    again = gateway.received_many(RECEIVE, [keyed(MALLORY, b"m0", [b"m"])], now=Now(0.0, T0 + 3))
    assert answers(again) == [(b"m0", True, 1, "")] and gateway.batches.duplicates_total == 1, "its own went"


def test_at_the_full_limit_a_key_sending_100_001_batches_leaves_another_keys_batch_remembered(store):
    # (what the gateway remembers its ids with, at its full limit: 100,001 batches stored through the
    # gateway took 7-10 s of a busy run; the gateway's own path is the test above's, at a limit of 10)
    gateway = make(store)
    assert gateway.batches.most_ids == DEFAULT_LIMITS.batch_dedup_ids == 100_000
    ids = Remembered(gateway.batches.most_ids)
    bob = id_key(b"bob-1", BOB)
    ids.add(space_of(bob), bob, T0)
    for i in range(100_001):
        mallory = id_key(b"m%d" % i, MALLORY)
        ids.add(space_of(mallory), mallory, T0 + 1 + i)
    assert bob in ids.ids and len(ids) == 100_000 and ids.spaces == 2
    assert id_key(b"m0", MALLORY) not in ids.ids, "the flood forgot its own oldest"


def test_keys_that_all_send_at_once_share_the_ids_and_one_that_holds_fewer_keeps_all_of_its_own():
    ids = Remembered(12)
    for i in range(30):  # (two producers in step, a third now and then)
        ids.add("A", f"a{i}", i)
        ids.add("B", f"b{i}", i)
        if i % 10 == 0:
            ids.add("C", f"c{i}", i)
    held = collections.Counter(space for space, _ in ids.ids.values())
    assert held["A"] + held["B"] == 9 and abs(held["A"] - held["B"]) <= 1, "the two in step share the rest"
    assert [key for key, (space, _) in ids.ids.items() if space == "C"] == ["c0", "c10", "c20"]


def test_past_the_limit_a_new_key_takes_the_place_of_the_key_that_got_there_first_among_those_holding_most():
    ids = Remembered(3)
    for space in "ABC":
        ids.add(space, space.lower(), 0)
    assert ids.add("D", "d", 1) == [("a", 0)] and ids.spaces == 3
    assert ids.add("D", "d2", 2) == [("d", 1)], "now the one holding the most: its own oldest"


def test_on_a_curve_server_another_keys_flood_of_batches_leaves_a_keys_resend_stored_once(make_server, keys):  # noqa: F811
    shutil.copy(keys / "mallory" / "mallory.key", keys / "clients")
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(
        receive_dsn=endpoint, limits=Limits(batch_dedup_ids=8), **curve_settings(keys, unauthenticated="monitor")
    )
    server_key = str(keys / "server" / "server.key")
    alice = (str(keys / "alice" / "alice.key_secret"), server_key)
    mallory = (str(keys / "mallory" / "mallory.key_secret"), server_key)
    stored = wire.BatchAck(b"alice-1", True, 1)
    assert wire.parse_batch_ack(send_batch(endpoint, alice, b"alice-1", [[b"a1"]])) == stored
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, *mallory)
    try:
        sock.connect(endpoint)
        for i in range(20):
            sock.send_multipart(wire.batch(b"m%d" % i, [[b"m"]]))
        for _ in range(20):
            assert sock.poll(10_000), "every batch is answered"
            sock.recv_multipart()
    finally:
        sock.close(0)
    assert wire.parse_batch_ack(send_batch(endpoint, alice, b"alice-1", [[b"a1"]])) == stored
    assert srv.stats()["messages"] == 21, "Alice's resend was known (it was stored twice once Mallory's ids filled)"
    assert srv.stats()["native"]["batch_id_keys"] == 2
