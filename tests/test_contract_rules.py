"""The rules every gateway shares, written once and run against each of them through its pair
(tests/pairs.py): a real store and broker, the gateway, and clients speaking its client codec, no socket,
time frozen unless a rule moves it."""

from __future__ import annotations

import pytest

from pzq.config import Limits

from pairs import PAIRS, Answered, Closed, Delivered, Pair


@pytest.fixture(params=sorted(PAIRS))
def pair(request, store) -> Pair:
    return Pair(PAIRS[request.param], store)


def delivered(events: list) -> list[Delivered]:
    return [e for e in events if isinstance(e, Delivered)]


def bodies(events: list) -> list[bytes]:
    return [d.body for d in delivered(events)]


def answers(events: list, tag: str) -> list[bool]:
    return [e.ok for e in events if isinstance(e, Answered) and e.tag == tag]


def holding(pair: Pair, body: bytes = b"held"):
    """A client ``a`` holding one delivery of queue q; returns (a, that delivery)."""
    a = pair.client("a")
    a.produce("q", body)
    a.consume("q", 1)
    pair.turn()
    [delivery] = delivered(a.take())
    assert delivery.body == body
    return a, delivery


def test_what_one_client_produces_another_consumes_in_order_and_settles(pair):
    a, b = pair.client("a"), pair.client("b")
    tags = [a.produce("q", b"m1"), a.produce("q", b"m2")]
    pair.turn()
    events = a.take()
    for tag in tags if a.confirms else []:
        assert answers(events, tag) == [True]
    b.consume("q", 2)
    pair.turn()
    got = delivered(b.take())
    assert [d.body for d in got] == [b"m1", b"m2"]
    for delivery in got:
        b.ack(delivery)
    pair.turn()
    assert pair.stored("q") == 0


def test_a_rolled_back_turn_confirms_nothing_it_lost(pair):
    a = pair.client("a")
    lost = a.produce("q", b"lost")
    pair.turn(fail=True)
    events = a.take()
    assert True not in answers(events, lost), "a success for a message that is not on disk"
    if a.confirms:  # a protocol that answers says it failed, rather than leaving the client waiting
        assert answers(events, lost) == [False]
    assert pair.stored("q") == 0
    kept = a.produce("q", b"kept")
    pair.turn()
    assert answers(a.take(), kept) == ([True] if a.confirms else [])
    b = pair.client("b")
    b.consume("q", 5)
    pair.turn()
    assert bodies(b.take()) == [b"kept"]


def test_a_delivery_of_a_rolled_back_turn_never_reaches_its_client_and_comes_again(pair):
    a, b = pair.client("a"), pair.client("b")
    a.produce("q", b"m")
    pair.turn()
    b.consume("q", 1)
    pair.turn(fail=True)
    assert delivered(b.take()) == []
    assert pair.stored("q") == 1
    b.consume("q", 1)
    pair.turn()
    assert bodies(b.take()) == [b"m"]


def test_a_disconnect_returns_what_the_client_held_to_another(pair):
    a, _ = holding(pair)
    a.disconnect()
    pair.turn()
    b = pair.client("b")
    b.consume("q", 1)
    pair.turn()
    assert bodies(b.take()) == [b"held"]


def test_a_delivery_its_client_could_not_take_is_not_lost(pair):
    a = pair.client("a")
    a.produce("q", b"m")
    a.consume("q", 1)
    pair.turn(full=frozenset({a.pipe}))
    assert delivered(a.take()) == []
    if a.unsent == "ready":  # taken back by the gateway: nobody holds it, ready for any client
        assert pair.loop.taken_back and pair.broker.ready_count("q") == 1
    else:  # kept for its peer (the endpoint's backlog), which gets it once it reads again
        assert not pair.loop.taken_back and pair.loop.backlog
    got = []
    for _ in range(3):  # (a peer with a backlog is handed nothing new until the backlog left)
        pair.turn()
        got += bodies(a.take())
    assert got == [b"m"], "lost, or delivered twice"


def test_a_reader_too_slow_for_its_deliveries_is_handed_nothing_more(pair):
    a = pair.client("a")
    if not a.holds_back:
        pytest.skip(f"{pair.spec.name}: its endpoint keeps a backlog per peer; the gateway hands out regardless")
    a.produce("q", b"m")
    a.consume("q", 1)
    pair.turn(slow=frozenset({a.pipe}))
    assert delivered(a.take()) == [] and pair.broker.ready_count("q") == 1
    pair.turn()
    assert bodies(a.take()) == [b"m"]


def test_garbage_harms_only_its_own_connection(pair):
    a, held = holding(pair)
    b = pair.client("b")
    a.garbage()
    pair.turn()
    closed = Closed() in a.take()
    assert closed == a.closes
    fresh = b.produce("q", b"fresh")
    b.consume("q", 2)
    pair.turn()
    events, to_a = b.take(), bodies(a.take())
    assert answers(events, fresh) == ([True] if b.confirms else [])
    if a.closes:  # its connection is gone, and with it what it held
        assert to_a == [] and sorted(bodies(events)) == [b"fresh", b"held"]
    else:  # a peer without a connection of its own keeps its session and what it holds
        assert sorted(bodies(events) + to_a) == [b"fresh"]  # (behind a DEALER, either may get it)
        a.ack(held)
        pair.turn()
        assert pair.stored("q") == 1


def test_a_client_settles_only_what_it_holds(pair):
    a, held = holding(pair)
    b = pair.client("b")
    if not b.settles_own:
        pytest.skip(f"{pair.spec.name}: its consumers share one holder (the send socket's DEALER hides who got what)")
    settle = b.ack(held)
    pair.turn()
    assert True not in answers(b.take(), settle)
    assert pair.stored("q") == 1, "another client's ack deleted the message"
    a.ack(held)
    pair.turn()
    assert pair.stored("q") == 0


def test_a_held_delivery_stays_held_while_the_clock_stands_still(pair):
    a, _ = holding(pair)
    b = pair.client("b")
    b.consume("q", 1)
    for _ in range(5):
        pair.turn()
    assert delivered(b.take()) == [] and pair.stored("q") == 1


SHARE = 4096  # a payer's share of delivered bytes in the rules below (Limits.delivery_share; native: its pool's)


@pytest.fixture(params=sorted(PAIRS))
def shared_pair(request, store) -> Pair:
    return Pair(PAIRS[request.param], store, limits=Limits(delivery_share=SHARE, native_send_pool=SHARE))


def test_a_client_that_never_settles_holds_at_most_its_byte_share_and_a_reader_gets_the_rest(shared_pair):
    pair = shared_pair
    if pair.spec.name == "api":
        pytest.skip("api: FETCH replies are bounded as replies (memory_peer_share), leases hold no bytes")
    producer, hoarder = pair.client("p"), pair.client("h")
    for i in range(20):
        producer.produce("q", b"%04d" % i + b"x" * 996)
    pair.turn()
    for _ in range(20):  # (eMQP: one job per READY; the others ask once for all)
        hoarder.consume("q", 20)
    for _ in range(4):
        pair.turn()
    held = delivered(hoarder.take())
    assert held, "a client that holds nothing is always handed one message"
    assert sum(len(d.body) for d in held) <= SHARE + 1000, "past its share and one message"
    reader = pair.client("r")
    if not reader.settles_own:  # (behind the native DEALER every consumer draws on one pool: its own rules)
        return
    got: list[Delivered] = []
    for _ in range(12):
        reader.consume("q", 20)
        pair.turn()
        mine = delivered(reader.take())
        for delivery in mine:
            reader.ack(delivery)
        got += mine
    assert len(got) + len(held) == 20, "a reader is served beside a client that holds its share"


BIG = Limits(body_chunk_bytes=1024, turn_write_bytes=2048)  # a 4,000-byte message: four parts, two turns
# Doors whose big messages take another way: native's endpoint holds them itself (pzq/endpoints/native.py:
# the pairs have no endpoint), MQKS publish writes its copies a slice per turn (gateways/mqks_publish.py).
# Any other door must have its gateway's ``parts``.
OWN_WAY = {
    "native": "its endpoint writes big messages itself",
    "native_batch": "its producers are the native endpoint's, which writes big messages itself",
}


def _has_parts(pair: Pair) -> None:
    if pair.spec.name in OWN_WAY and not hasattr(pair.gateway, "parts"):
        pytest.skip(f"{pair.spec.name}: {OWN_WAY[pair.spec.name]}")
    if pair.spec.name != "mqks":
        assert hasattr(pair.gateway, "parts"), "a door's big messages are written a part per turn (gateways/parted.py)"


@pytest.fixture(params=sorted(PAIRS))
def big_pair(request, store) -> Pair:
    return Pair(PAIRS[request.param], store, limits=BIG)


def test_a_big_message_is_written_over_turns_and_answered_only_once_all_of_it_is_stored(big_pair):
    pair = big_pair
    _has_parts(pair)
    a = pair.client("a")
    body = bytes(range(256)) * 15 + b"end"  # (past 3 chunks: written over two turns)
    if pair.spec.name in ("emqp", "mqks"):
        body = b"x" * 3000 + b"end"  # (eMQP and MQKS peers read every body as text)
    tag = a.produce("q", body)
    pair.turn()
    assert answers(a.take(), tag) == [] and pair.stored("q") == 0, "answered or stored before its last part"
    pair.turn()
    assert answers(a.take(), tag) == ([True] if a.confirms else []) and pair.stored("q") == 1
    b = pair.client("b")
    b.consume("q", 1)
    pair.turn()
    assert bodies(b.take()) == [body]


def test_a_big_message_of_a_rolled_back_turn_is_not_confirmed_and_the_client_may_send_it_again(big_pair):
    pair = big_pair
    _has_parts(pair)
    a = pair.client("a")
    body = b"y" * 4000
    lost = a.produce("q", body)
    pair.turn()
    pair.turn(fail=True)  # (its last part's turn)
    assert True not in answers(a.take(), lost) and pair.stored("q") == 0
    again = a.produce("q", body)
    pair.turn()
    pair.turn()
    assert answers(a.take(), again) == ([True] if a.confirms else []) and pair.stored("q") == 1
