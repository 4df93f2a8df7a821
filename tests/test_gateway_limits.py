"""Each gateway keeps the limits it is handed (a ``Limits`` object, as the server passes config.limits),
without a socket: small values in, refusals out."""

from __future__ import annotations

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import ONLY, Send
from pzq.gateways.emqp import FRONT, EmqpGateway
from pzq.gateways.mqks import MqksGateway
from pzq.leases import Leases
from pzq.protocols import api
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

V = b"eMQP/1.0"


def mqks_on(store, limits: Limits) -> MqksGateway:
    broker = Broker(store, ack_timeout_s=5)
    return MqksGateway(
        broker,
        Bindings(store),
        max_line=1 << 16,
        window=10,
        drop_queue=broker.drop_queue,
        error_id=lambda: "E",
        limits=limits,
    )


def emqp_on(store, limits: Limits) -> EmqpGateway:
    broker = Broker(store, ack_timeout_s=5)
    return EmqpGateway(
        broker,
        EmqpJobs(store),
        Schedules(store),
        default_queues=["default"],
        heartbeat_s=3,
        liveness=3,
        new_id=lambda: "ID",
        wall_clock=lambda: 7.0,
        limits=limits,
    )


def test_mqks_refuses_a_consumer_past_the_limit_per_connection_and_one_past_the_bindings_in_all(store):
    gateway = mqks_on(store, Limits(mqks_max_consumers=1, mqks_max_bindings=2))
    gateway.connected(b"c")
    assert gateway.received(b"c", b"c1 consume --confirm q1 e1\n", now=Now(0.0, 1)) == [
        Send(ONLY, [b"c", b"c1 ok \n"], ("confirm", "c1"))
    ]
    assert gateway.received(b"c", b"c2 consume --confirm q2 e2\n", now=Now(0.0, 2)) == [
        Send(ONLY, [b"c", b"c2 error E\n"])
    ]
    assert gateway.received(b"c", b"r1 rebind --confirm q1 e1 e2 e3\n", now=Now(0.0, 3)) == [
        Send(ONLY, [b"c", b"r1 error E\n"])
    ]
    assert gateway.stats()["consumers"] == 1 and gateway.stats()["bindings"] == 1


def test_mqks_refuses_a_rebind_whose_remove_mask_would_work_past_its_budget_and_changes_nothing(store):
    gateway = mqks_on(store, Limits(mqks_mask_work=20))
    gateway.connected(b"c")
    events = b" ".join(b"e%d.x.y" % i for i in range(10))  # indexed at "x": 10 x (3 + 1) units of work
    assert gateway.received(b"c", b"c1 consume --confirm q1 " + events + b"\n", now=Now(0.0, 1))[0].frames[1] == (
        b"c1 ok \n"
    )
    assert gateway.received(b"c", b"r1 rebind --confirm q1 --remove-mask *.x.y\n", now=Now(0.0, 2)) == [
        Send(ONLY, [b"c", b"r1 error E\n"])
    ]
    assert len(gateway.bindings.get("q1").events) == 10
    assert gateway.received(b"c", b"r2 rebind --confirm q1 --remove-mask e1.*\n", now=Now(0.0, 3))[-1].frames[1] == (
        b"r2 ok \n"
    ), "a mask of two segments splits none of these events"


def test_a_rebind_to_the_events_a_queue_has_leaves_its_index_as_it_was(store):
    gateway = mqks_on(store, Limits())
    gateway.connected(b"c")
    gateway.received(b"c", b"r1 rebind q1 e1 e2 e3\n", now=Now(0.0, 1))
    gateway.received(b"c", b"r2 rebind q2 e2\n", now=Now(0.0, 1))
    gateway.received(b"c", b"r3 rebind q1 e3 e2 e1\n", now=Now(0.0, 2))
    gateway.received(b"c", b"r4 rebind q1 e2 e4\n", now=Now(0.0, 3))
    index = gateway.bindings
    assert {event: set(index.queues_for(event)) for event in ("e1", "e2", "e3", "e4")} == {
        "e1": set(),
        "e2": {"q1", "q2"},
        "e3": set(),
        "e4": {"q1"},
    }
    assert index.bound_total == 3 and "e1" not in index.by_event


def test_mqks_hands_a_consumer_at_most_its_turn_budget_per_turn(store):
    gateway = mqks_on(store, Limits(mqks_turn_budget=2))
    gateway.connected(b"c")
    gateway.received(b"c", b"c1 consume q e\n", now=Now(0.0, 1))
    for i in range(5):
        gateway.received(b"c", b"p%d publish e m%d\n" % (i, i), now=Now(0.0, 2))
    assert len(gateway.dispatch(now=Now(0.0, 3))) == 2
    assert len(gateway.dispatch(now=Now(0.0, 4))) == 2


def test_emqp_keeps_at_most_max_schedules_and_refuses_a_cron_expression_over_max_cron(store):
    gateway = emqp_on(store, Limits(max_schedules=1, max_cron=9))

    def schedule(payload: bytes, interval: bytes, cron: bytes) -> bytes:
        frames = [b"cl", b"", V, b"SCHEDULE", b"m", b"jobs", b"", interval, payload, cron]
        [reply] = gateway.received(FRONT, frames, now=Now(0.0, 1), user=None)
        return reply.frames[3]

    assert schedule(b'"a"', b"60", b"") == b"ACK"
    assert schedule(b'"b"', b"60", b"") == b"REPLY", "a second schedule is refused with an error reply"
    assert schedule(b'"a"', b"-1", b"0 0 1 1 1-5") == b"REPLY", "eleven characters of cron"
    assert len(gateway.schedules) == 1


def test_emqp_heartbeats_at_most_max_schedulers_scheduler_daemons(store):
    gateway = emqp_on(store, Limits(max_schedulers=1))
    for peer in (b"s1", b"s2"):
        gateway.received(FRONT, [peer, b"", V, b"INFORM", b"m", b"", b"scheduler"], now=Now(0.0, 1), user=None)
    assert list(gateway.schedulers) == [b"s1"]


def test_the_api_snapshot_returns_at_most_snapshot_max_messages(store):
    broker = Broker(store, ack_timeout_s=5)
    gateway = ApiGateway(
        broker,
        Leases(broker, timeout_s=60),
        DedupKeys(store),
        max_message_size=1 << 20,
        dedup_window_s=60,
        limits=Limits(snapshot_max=3),
    )
    for i in range(5):
        broker.produce("q", [b"m%d" % i], now_us=1)
    frames = [b"peer", *api.request(b"1", "SNAPSHOT", {"queue": "q", "after": 0, "before": 100, "limit": 100})]
    [reply] = gateway.received(ONLY, frames, now=Now(0.0, 2), user=None)
    _, ok, body = api.parse_reply(reply.frames[1:])
    assert ok and len(body["messages"]) == 3 and body["next"] == body["messages"][-1][0] + 1
