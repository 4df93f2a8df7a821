"""Every gateway under the one contract (gateways/contract.py), without a socket: its kind, and the
exact words of what it sends, closes, and still says after a rolled-back turn. Each gateway is built by
its pair's factory (tests/pairs.py); the rules all gateways share are in test_contract_rules.py (a
blocked reader, an unsent delivery, garbage, a disconnect, a rollback, settling another's delivery)."""

from __future__ import annotations

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.gateways.contract import ONLY, Account, BrokerSurface, Deliveries, FramesGateway, Queues, Send, StreamGateway
from pzq.gateways.emqp import BACK, FRONT
from pzq.protocols import api, phpmq

from pairs import MAX_INPUT, PAIRS, Delivered, Pair

V = b"eMQP/1.0"
KINDS = {
    "phpmq": StreamGateway,
    "mqks": StreamGateway,
    "api": FramesGateway,
    "emqp": FramesGateway,
    "native": FramesGateway,
}


def test_every_name_of_the_broker_surface_is_one_the_server_s_broker_answers(store):
    # (mypy checks the types where the server hands the Broker in; this fails fast on a name alone)
    broker = Broker(store, ack_timeout_s=60.0)
    names = [n for n in vars(BrokerSurface) if not n.startswith("_")]
    assert names and not [n for n in names if not hasattr(broker, n)], "BrokerSurface names what the Broker lacks"
    for view, surface in ((broker.deliveries, Deliveries), (broker.queues, Queues), (broker.account("p"), Account)):
        names = [n for n in vars(surface) if not n.startswith("_")]
        assert names and not [n for n in names if not hasattr(view, n)], f"{surface.__name__} names what it lacks"


def test_the_broker_surface_is_about_twenty_names_and_each_view_at_most_ten():
    # (issue 41: 50 names before the views; a table a gateway could mutate is none of them)
    def names(surface: type) -> list[str]:
        return [n for n in vars(surface) if not n.startswith("_")]

    assert len(names(BrokerSurface)) <= 22
    assert all(len(names(view)) <= 10 for view in (Deliveries, Queues, Account))
    assert not {"inflight", "accounts", "store", "refusing"} & set(names(BrokerSurface))


def gateway(name: str, store):
    return Pair(PAIRS[name], store).gateway


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_gateway_offers_the_contract_of_its_kind(store, name):
    if name == "native_batch":  # (its pair's gateway is tests/pair_batch.py's BatchedNative: two gateways)
        pytest.skip("the batched consume gateway answers ``Out``s of its own endpoint, not the Gateway contract")
    assert isinstance(gateway(name, store), KINDS[name])


def test_phpmq_garbage_closes_with_a_bare_close_and_nothing_else(store):
    g = gateway("phpmq", store)
    g.connected(b"a")
    assert g.received(b"a", b"GARBAGE!", now=Now(0.0, 3)) == [Send(ONLY, [b"a"], close=True)]


def test_a_phpmq_message_that_shares_a_read_with_garbage_is_stored_before_the_close(store):
    g = gateway("phpmq", store)
    g.connected(b"a")
    send = phpmq.encode(phpmq.SEND, [(phpmq.QUEUE, b"q"), (phpmq.CONTENT, b"whole")])
    assert g.received(b"a", send + b"GARBAGE!", now=Now(0.0, 1)) == [Send(ONLY, [b"a"], close=True)]
    assert g.broker.ready_count("q") == 1


def test_mqks_answers_a_bad_line_with_an_error_and_closes_on_an_endless_one(store):
    g = gateway("mqks", store)
    g.connected(b"c")
    assert g.received(b"c", b"r1 frobnicate\n", now=Now(0.0, 1)) == [Send(ONLY, [b"c", b"r1 error E1\n"])]
    [close] = g.received(b"c", b"x" * (MAX_INPUT + 10), now=Now(0.0, 2))
    assert close.close and close.peer == b"c"


def test_mqks_after_a_rollback_confirms_become_errors_and_deliveries_are_dropped(store):
    g = gateway("mqks", store)
    g.connected(b"c")
    sent = g.received(b"c", b"p1 publish --confirm e1 hello\n", now=Now(0.0, 1))
    delivery = Send(ONLY, [b"c", b"c1 ok m1 event=e1 hello\n"], ("auto",))
    ping = Send(ONLY, [b"c", b"r9 error E0\n"])
    said = g.rolled_back([*sent, delivery, ping])
    assert [s.frames[1] for s in said] == [b"r9 error E0\n", b"p1 error E1\n"]


def test_every_api_reply_of_a_rolled_back_turn_becomes_store_failed(store):
    g = gateway("api", store)
    frames = [b"peer", *api.request(b"1", "PRODUCE", {"messages": [["q", b"m"]]})]
    [reply] = g.received(ONLY, frames, now=Now(0.0, 1), user=None)
    assert api.parse_reply(reply.frames[1:])[1] is True
    [failed] = g.rolled_back([reply])
    request_id, ok, body = api.parse_reply(failed.frames[1:])
    assert (request_id, ok, body["code"]) == (b"1", False, "store-failed")


def test_emqp_after_a_rollback_acks_become_error_replies_and_jobs_give_their_slots_back(store):
    g = gateway("emqp", store)
    ack = g.received(FRONT, [b"cl", b"", V, b"REQUEST", b"r1", b"jobs", b"", b'"x"'], now=Now(0.0, 1), user=None)
    assert [s.frames[3] for s in ack] == [b"ACK"]
    g.received(BACK, [b"w", b"", V, b"INFORM", b"i1", b'[[10, "jobs"]]', b"worker"], now=Now(0.0, 1), user=None)
    g.received(BACK, [b"w", b"", V, b"READY", b"i2"], now=Now(0.0, 1), user=None)
    jobs = [s for s in g.dispatch(now=Now(0.0, 2)) if s.frames[3] == b"REQUEST"]
    assert len(jobs) == 1 and g.workers[b"w"].slots == 0
    said = g.rolled_back([*ack, *jobs])
    assert g.workers[b"w"].slots == 1
    [error] = said
    assert error.socket == FRONT and error.frames[:5] == [b"cl", b"", V, b"REPLY", b"server5"]
    assert b"store failure" in error.frames[5] and error.frames[6] == b"r1"


def test_emqp_heartbeats_carry_the_injected_time_and_id(store):
    pair = Pair(PAIRS["emqp"], store)
    g = pair.gateway
    informed = g.received(BACK, [b"w", b"", V, b"INFORM", b"i1", b"", b"worker"], now=Now(0.0, 1), user=None)
    assert [s.frames[4] for s in informed] == [b"server1", b"server2"]  # its ACK, its first heartbeat
    beats = [s for s in g.dispatch(now=Now(0.0, 2)) if s.frames[3] == b"HEARTBEAT"]
    assert beats == [Send(BACK, [b"w", b"", V, b"HEARTBEAT", b"server3", repr(pair.clock.wall_s()).encode()])]


def test_an_emqp_worker_that_says_disconnect_gives_its_jobs_to_another(store):
    pair = Pair(PAIRS["emqp"], store)
    a, b = pair.client("a"), pair.client("b")
    a.produce("q", b"job")
    a.consume("q", 1)
    pair.turn()
    assert [e.body for e in a.take() if isinstance(e, Delivered)] == [b"job"]
    pair.loop.feed_frames(BACK, [a.peer, b"", V, b"DISCONNECT", b"d1"], a.user)
    b.consume("q", 1)
    pair.turn()
    assert [e.body for e in b.take() if isinstance(e, Delivered)] == [b"job"]
