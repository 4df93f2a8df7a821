"""Every gateway under the one contract (gateways/contract.py), without a socket: what it sends, what it
closes, and what a rolled-back turn may still say."""

from __future__ import annotations

from pzq.broker import Broker
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import ONLY, FramesGateway, Send, StreamGateway
from pzq.gateways.emqp import BACK, FRONT, EmqpGateway
from pzq.gateways.mqks import MqksGateway
from pzq.gateways.phpmq import PhpmqGateway
from pzq.leases import Leases
from pzq.protocols import api, phpmq
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

V = b"eMQP/1.0"


def gateways(store) -> dict[str, object]:
    broker = Broker(store, ack_timeout_s=5)
    return {
        "phpmq": PhpmqGateway(broker, max_content=1 << 20),
        "mqks": MqksGateway(
            broker, Bindings(store), max_line=1 << 20, window=10, drop_queue=broker.drop_queue, error_id=lambda: "E1"
        ),
        "api": ApiGateway(
            broker, Leases(broker, timeout_s=60), DedupKeys(store), max_message_size=1 << 20, dedup_window_s=60
        ),
        "emqp": EmqpGateway(
            broker,
            EmqpJobs(store),
            Schedules(store),
            default_queues=["default"],
            heartbeat_s=3,
            liveness=3,
            new_id=lambda: "ID",
            wall_clock=lambda: 7.0,
        ),
    }


def test_every_gateway_offers_the_contract_of_its_kind(store):
    made = gateways(store)
    assert isinstance(made["phpmq"], StreamGateway) and isinstance(made["mqks"], StreamGateway)
    assert isinstance(made["api"], FramesGateway) and isinstance(made["emqp"], FramesGateway)


def test_phpmq_garbage_closes_only_that_connection_and_what_it_held_goes_back(store):
    gateway = gateways(store)["phpmq"]
    gateway.broker.produce("q", [b"m"], now_us=1)
    gateway.connected(b"a")
    gateway.connected(b"b")
    assert (
        gateway.received(b"a", phpmq.encode(phpmq.CONSUME, [(phpmq.QUEUE, b"q"), (phpmq.COUNT, b"1")]), now_us=1) == []
    )
    [delivery] = gateway.dispatch(now=0.0, now_us=2)
    assert delivery.peer == b"a" and delivery.frames[1].startswith(b"H01003")
    assert gateway.received(b"a", b"GARBAGE!", now_us=3) == [Send(ONLY, [b"a"], close=True)]
    assert (
        gateway.received(b"b", phpmq.encode(phpmq.SEND, [(phpmq.QUEUE, b"q"), (phpmq.CONTENT, b"x")]), now_us=3) == []
    )
    gateway.disconnected(b"a")
    assert gateway.broker.ready_count("q") == 2


def test_a_phpmq_dispatch_its_connection_would_not_take_is_ready_again(store):
    gateway = gateways(store)["phpmq"]
    gateway.broker.produce("q", [b"m"], now_us=1)
    gateway.connected(b"a")
    gateway.received(b"a", phpmq.encode(phpmq.CONSUME, [(phpmq.QUEUE, b"q"), (phpmq.COUNT, b"5")]), now_us=1)
    [delivery] = gateway.dispatch(now=0.0, now_us=2)
    assert gateway.unsent(delivery) is False and gateway.broker.ready_count("q") == 1
    assert gateway.dispatch(now=0.0, now_us=3, blocked=frozenset({b"a"})) == [], "a blocked reader gets nothing"


def test_mqks_answers_a_bad_line_with_an_error_and_closes_on_an_endless_one(store):
    gateway = gateways(store)["mqks"]
    gateway.connected(b"c")
    assert gateway.received(b"c", b"r1 frobnicate\n", now=0.0, now_us=1) == [Send(ONLY, [b"c", b"r1 error E1\n"])]
    [close] = gateway.received(b"c", b"x" * ((1 << 20) + 10), now=0.0, now_us=2)
    assert close.close and close.peer == b"c"


def test_mqks_after_a_rollback_confirms_become_errors_and_deliveries_are_dropped(store):
    gateway = gateways(store)["mqks"]
    gateway.connected(b"c")
    sent = gateway.received(b"c", b"p1 publish --confirm e1 hello\n", now=0.0, now_us=1)
    delivery = Send(ONLY, [b"c", b"c1 ok m1 event=e1 hello\n"], ("auto",))
    ping = Send(ONLY, [b"c", b"r9 error E0\n"])
    said = gateway.rolled_back([*sent, delivery, ping])
    assert [s.frames[1] for s in said] == [b"r9 error E0\n", b"p1 error E1\n"]


def test_every_api_reply_of_a_rolled_back_turn_becomes_store_failed(store):
    gateway = gateways(store)["api"]
    frames = [b"peer", *api.request(b"1", "PRODUCE", {"messages": [["q", b"m"]]})]
    [reply] = gateway.received(ONLY, frames, now=0.0, now_us=1, user=None)
    assert api.parse_reply(reply.frames[1:])[1] is True
    [failed] = gateway.rolled_back([reply])
    request_id, ok, body = api.parse_reply(failed.frames[1:])
    assert (request_id, ok, body["code"]) == (b"1", False, "store-failed")


def test_emqp_after_a_rollback_acks_become_error_replies_and_jobs_give_their_slots_back(store):
    gateway = gateways(store)["emqp"]
    ack = gateway.received(
        FRONT, [b"cl", b"", V, b"REQUEST", b"r1", b"jobs", b"", b'"x"'], now=0.0, now_us=1, user=None
    )
    assert [s.frames[3] for s in ack] == [b"ACK"]
    gateway.received(BACK, [b"w", b"", V, b"INFORM", b"i1", b'[[10, "jobs"]]', b"worker"], now=0.0, now_us=1, user=None)
    gateway.received(BACK, [b"w", b"", V, b"READY", b"i2"], now=0.0, now_us=1, user=None)
    jobs = [s for s in gateway.dispatch(now=0.0, now_us=2) if s.frames[3] == b"REQUEST"]
    assert len(jobs) == 1 and gateway.workers[b"w"].slots == 0
    said = gateway.rolled_back([*ack, *jobs])
    assert gateway.workers[b"w"].slots == 1
    [error] = said
    assert error.socket == FRONT and error.frames[:5] == [b"cl", b"", V, b"REPLY", b"ID"]
    assert b"store failure" in error.frames[5] and error.frames[6] == b"r1"


def test_emqp_heartbeats_carry_the_injected_time_and_id(store):
    gateway = gateways(store)["emqp"]
    gateway.received(BACK, [b"w", b"", V, b"INFORM", b"i1", b"", b"worker"], now=0.0, now_us=1, user=None)
    beats = [s for s in gateway.dispatch(now=0.0, now_us=2) if s.frames[3] == b"HEARTBEAT"]
    assert beats == [Send(BACK, [b"w", b"", V, b"HEARTBEAT", b"ID", b"7.0"])]


def test_a_phpmq_message_that_shares_a_read_with_garbage_is_stored_before_the_close(store):
    gateway = gateways(store)["phpmq"]
    gateway.connected(b"a")
    send = phpmq.encode(phpmq.SEND, [(phpmq.QUEUE, b"q"), (phpmq.CONTENT, b"whole")])
    assert gateway.received(b"a", send + b"GARBAGE!", now_us=1) == [Send(ONLY, [b"a"], close=True)]
    assert gateway.broker.ready_count("q") == 1
