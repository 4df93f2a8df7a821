"""Permissions on the eMQP gateway, over real CURVE sockets speaking raw eMQP frames: REQUEST and PUBLISH
need the produce right on their queue or topic, a worker's INFORM the consume right on every queue it
names, SCHEDULE and UNSCHEDULE the manage right (on the queue named and the schedule's own); a refusal
is an error REPLY (PUBLISH and INFORM: dropped and logged), changes nothing and is counted; a SIGHUP
that narrows a key drops its workers at once and requeues their jobs."""

from __future__ import annotations

import json

import pytest
import zmq

from pzq.curve import secure_client

from conftest import free_tcp_endpoint, recv, wait_until
from permission_keys import ORDERS_PRODUCE_ONLY, TENANTS, reload
from test_emqp import V, mid, next_command, settled_stats

pytestmark = pytest.mark.timeout(60)
# The PUB socket hands every topic to every subscriber: only a key that may consume every topic may
# subscribe (tests/test_permissions_emqp_publish.py); here the stranger is that subscriber.
SUBSCRIBER = '\n[keys.stranger]\nconsume = ["*"]\n'


class Peers:
    """eMQP clients, workers and subscribers, each a DEALER (SUB) with a tenant's CURVE key."""

    def __init__(self, tenants, front: str, back: str, pub: str):
        self.tenants, self.front, self.back, self.pub = tenants, front, back, pub
        self.made: list[zmq.Socket] = []

    def socket(self, kind: int, name: str, endpoint: str) -> zmq.Socket:
        sock = zmq.Context.instance().socket(kind)
        sock.linger = 0
        if kind == zmq.DEALER:
            sock.identity = mid()
        secure_client(sock, *self.tenants.curve(name))
        sock.connect(endpoint)
        self.made.append(sock)
        return sock

    def client(self, name: str) -> zmq.Socket:
        return self.socket(zmq.DEALER, name, self.front)

    def worker(self, name: str, queues: bytes) -> zmq.Socket:
        """A worker that sent its INFORM (its ACK, if any, is left for the test to read)."""
        w = self.socket(zmq.DEALER, name, self.back)
        w.send_multipart([b"", V, b"INFORM", mid(), queues, b"worker"])
        return w

    def close(self) -> None:
        for sock in self.made:
            sock.close(linger=0)


@pytest.fixture
def emqp(make_server, tenants):
    """start(**overrides) -> (server, peers): the eMQP gateway (with PUBLISH) under CURVE, with the
    tenants' permissions file beside the clients directory."""
    made: list[Peers] = []

    def start(**overrides):
        tenants.write(TENANTS + SUBSCRIBER)
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        pub, _ = free_tcp_endpoint()
        srv = make_server(
            emqp_frontend_dsn=front,
            emqp_backend_dsn=back,
            emqp_publish_dsn=pub,
            unauthenticated="monitor",
            **overrides,
            **tenants.config(),
        )
        peers = Peers(tenants, front, back, pub)
        made.append(peers)
        return srv, peers

    yield start
    for peers in made:
        peers.close()


def request(c: zmq.Socket, queue: bytes, headers: bytes = b"reply-requested") -> bytes:
    m = mid()
    c.send_multipart([b"", V, b"REQUEST", m, queue, headers, b'"a job"'])
    return m


def schedule(c: zmq.Socket, command: bytes, queue: bytes, payload: bytes = b'"nightly"') -> bytes:
    """A SCHEDULE or UNSCHEDULE as eventmq sends it; ``nohaste`` and an hour: it never runs in a test."""
    m = mid()
    c.send_multipart([b"", V, command, m, queue, b"nohaste", b"3600", payload])
    return m


def answer(c: zmq.Socket, msgid: bytes) -> list[bytes]:
    """The ACK or REPLY that answers ``msgid`` (heartbeats and other answers are skipped)."""
    while True:
        frames = recv(c)
        if frames[2] == b"ACK" and frames[4] == msgid or frames[2] == b"REPLY" and frames[-1] == msgid:
            return frames


def refused(frames: list[bytes]) -> str:
    """The error of a refusing REPLY (the test fails on an ACK)."""
    assert frames[2] == b"REPLY", f"expected a refusal, got {frames[2]!r}"
    return json.loads(frames[4])["error"]


def test_a_key_may_request_serve_schedule_and_publish_on_the_queues_its_rights_name(emqp):
    srv, peers = emqp()
    c = peers.client("orders")
    w = peers.worker("orders", b'[[10, "orders.jobs"]]')
    next_command(w, b"ACK")
    w.send_multipart([b"", V, b"READY", mid()])
    m = request(c, b"orders.jobs")
    assert answer(c, m)[2] == b"ACK"
    job = next_command(w, b"REQUEST")
    w.send_multipart([b"", V, b"REPLY", mid(), b'{"done": true}', job[3]])
    assert answer(c, m)[4] == b'{"done": true}', "the worker's REPLY reached the client"
    assert answer(c, schedule(c, b"SCHEDULE", b"orders.nightly"))[2] == b"ACK"
    assert srv.stats()["emqp"]["schedules"] == 1
    assert answer(c, schedule(c, b"UNSCHEDULE", b"orders.nightly"))[2] == b"ACK"
    assert srv.stats()["emqp"]["schedules"] == 0
    sub = peers.socket(zmq.SUB, "stranger", peers.pub)
    sub.subscribe(b"")
    for _ in range(100):  # (a subscription takes a moment to reach the publisher)
        c.send_multipart([b"", V, b"PUBLISH", mid(), b"orders.news", b"hello"])
        if sub.poll(100):
            break
    assert sub.recv_multipart() == [b"orders.news", b"hello"]
    stats = settled_stats(srv)
    assert stats["queues"]["orders.jobs"]["depth"] == 0, "the job completed"
    assert stats["permissions"]["refused_total"] == 0


def test_a_key_is_refused_requests_and_schedules_on_queues_it_may_not_touch_and_nothing_changes(emqp):
    srv, peers = emqp()
    orders = peers.client("orders")
    m = request(orders, b"payroll")
    assert refused(answer(orders, m)) == "request refused: not permitted: this client may not produce to 'payroll'"
    assert "not permitted" in refused(answer(orders, schedule(orders, b"SCHEDULE", b"payroll")))
    stranger = peers.client("stranger")  # no section of its own, and no [default]: nothing
    assert "not permitted" in refused(answer(stranger, request(stranger, b"orders.jobs")))
    stats = settled_stats(srv)
    assert "payroll" not in stats["queues"] and "orders.jobs" not in stats["queues"], "no queue was made"
    assert stats["emqp"]["schedules"] == 0
    assert stats["emqp"]["requests_total"] == 0
    assert stats["permissions"]["refused"] == {
        "orders": {"manage": 1, "produce": 1},
        "stranger": {"produce": 1},
    }


def test_another_tenants_schedule_can_be_neither_replaced_nor_removed(emqp):
    srv, peers = emqp()
    payroll = peers.client("payroll")
    assert answer(payroll, schedule(payroll, b"SCHEDULE", b"payroll", b'"pay"'))[2] == b"ACK"
    orders = peers.client("orders")
    # A schedule is found by its job alone: the same job into a queue of orders' own would replace it.
    for command, queue in ((b"SCHEDULE", b"orders.pay"), (b"UNSCHEDULE", b"orders.pay"), (b"UNSCHEDULE", b"payroll")):
        error = refused(answer(orders, schedule(orders, command, queue, b'"pay"')))
        assert error.endswith("this client may not manage 'payroll'"), error
    assert settled_stats(srv)["permissions"]["refused"] == {"orders": {"manage": 3}}
    assert srv.stats()["emqp"]["schedules"] == 1
    # Still payroll's, into payroll: its owner removes it naming payroll (orders.pay would be refused).
    assert answer(payroll, schedule(payroll, b"UNSCHEDULE", b"payroll", b'"pay"'))[2] == b"ACK"
    assert srv.stats()["emqp"]["schedules"] == 0


def test_a_worker_may_not_serve_a_queue_its_key_may_not_consume(emqp):
    srv, peers = emqp()
    payroll = peers.client("payroll")
    m = request(payroll, b"payroll")
    assert answer(payroll, m)[2] == b"ACK"
    thief = peers.worker("orders", b'[[10, "orders.jobs"], [5, "payroll"]]')  # one queue of the two is not its
    thief.send_multipart([b"", V, b"INFORM", mid(), b"", b"worker"])  # no queues: --emqp-default-queues
    wait_until(lambda: srv.stats()["permissions"]["refused"].get("orders") == {"consume": 2})
    thief.send_multipart([b"", V, b"READY", mid()])
    stats = settled_stats(srv)
    assert stats["emqp"]["workers"] == 0, "the worker was not registered"
    assert stats["queues"]["payroll"]["inflight"] == 0
    assert not thief.poll(200), "no ACK and no job reached the refused worker"
    honest = peers.worker("payroll", b'[[10, "payroll"]]')
    next_command(honest, b"ACK")
    honest.send_multipart([b"", V, b"READY", mid()])
    job = next_command(honest, b"REQUEST")
    honest.send_multipart([b"", V, b"REPLY", mid(), b'{"paid": true}', job[3]])
    assert answer(payroll, m)[4] == b'{"paid": true}'


def test_a_publish_to_a_topic_the_key_may_not_produce_to_is_dropped(emqp):
    srv, peers = emqp()
    orders = peers.client("orders")
    sub = peers.socket(zmq.SUB, "stranger", peers.pub)
    sub.subscribe(b"")
    for _ in range(100):  # (a subscription takes a moment to reach the publisher)
        orders.send_multipart([b"", V, b"PUBLISH", mid(), b"orders.news", b"warm"])
        if sub.poll(100):
            break
    orders.send_multipart([b"", V, b"PUBLISH", mid(), b"payroll", b"forged"])
    orders.send_multipart([b"", V, b"PUBLISH", mid(), b"orders.news", b"after"])
    # One socket's messages leave in order: had the refused one gone out, it would come before "after".
    while (frames := recv(sub))[1] == b"warm":
        pass
    assert frames == [b"orders.news", b"after"]
    assert settled_stats(srv)["permissions"]["refused"] == {"orders": {"produce": 1}}


def test_a_sighup_that_narrows_a_key_drops_its_workers_at_once_and_requeues_their_jobs(emqp):
    srv, peers = emqp()
    orders = peers.client("orders")
    w = peers.worker("orders", b'[[10, "orders.jobs"]]')
    next_command(w, b"ACK")
    other = peers.worker("payroll", b'[[10, "payroll"]]')
    next_command(other, b"ACK")
    w.send_multipart([b"", V, b"READY", mid()])
    m = request(orders, b"orders.jobs")
    assert answer(orders, m)[2] == b"ACK"
    job = next_command(w, b"REQUEST")
    assert srv.stats()["queues"]["orders.jobs"]["inflight"] == 1
    tenants = peers.tenants
    tenants.write(ORDERS_PRODUCE_ONLY)
    reload(srv)
    stats = srv.stats()
    assert stats["emqp"]["workers"] == 1, "the orders worker was dropped, payroll's kept"
    assert stats["queues"]["orders.jobs"]["inflight"] == 0, "its job was requeued"
    w.send_multipart([b"", V, b"REPLY", mid(), b'{"late": true}', job[3]])
    w.send_multipart([b"", V, b"READY", mid()])
    # A new INFORM is refused too; once it is counted, the REPLY and READY before it were read.
    w.send_multipart([b"", V, b"INFORM", mid(), b'[[10, "orders.jobs"]]', b"worker"])
    wait_until(lambda: srv.stats()["permissions"]["refused"].get("orders") == {"consume": 1})
    stats = settled_stats(srv)
    assert stats["emqp"]["workers"] == 1
    assert stats["emqp"]["replies_refused_total"] == 1, "the dropped worker's REPLY completed nothing"
    assert stats["queues"]["orders.jobs"]["depth"] == 1 and stats["queues"]["orders.jobs"]["inflight"] == 0
    assert not [f for f in _drain(w) if f[2] in (b"REQUEST", b"ACK")], "no job and no ACK reached it"
    assert not [f for f in _drain(orders) if f[2] == b"REPLY"], "no REPLY reached the client"
    assert answer(orders, request(orders, b"orders.jobs"))[2] == b"ACK", "producing is still its right"


def test_a_departed_worker_whose_key_lost_its_right_is_not_taken_back(emqp):
    # Heartbeats every 0.2 s, dead after 2 silent: a worker that stops talking is dropped within ~0.4 s
    # and remembered as departed, to be taken back by its next HEARTBEAT, READY or REPLY.
    srv, peers = emqp(emqp_heartbeat_interval=0.2, emqp_heartbeat_liveness=2)
    orders = peers.client("orders")
    w = peers.worker("orders", b'[[10, "orders.jobs"]]')
    next_command(w, b"ACK")
    wait_until(lambda: srv.stats()["emqp"]["dead_workers_total"] == 1)
    peers.tenants.write(ORDERS_PRODUCE_ONLY)
    reload(srv)
    assert answer(orders, request(orders, b"orders.jobs"))[2] == b"ACK"
    w.send_multipart([b"", V, b"READY", mid()])  # (without the check, this takes it back with a slot)
    w.send_multipart([b"", V, b"INFORM", mid(), b'[[10, "orders.jobs"]]', b"worker"])
    # (the READY is counted too if its departed entry outlived the SIGHUP: it is refused there instead)
    wait_until(lambda: srv.stats()["permissions"]["refused"].get("orders", {}).get("consume", 0) >= 1)
    stats = settled_stats(srv)
    assert stats["emqp"]["workers"] == 0 and stats["queues"]["orders.jobs"]["inflight"] == 0
    assert not [f for f in _drain(w) if f[2] == b"REQUEST"], "no job reached the departed worker"


def _drain(sock: zmq.Socket, quiet_ms: int = 200) -> list[list[bytes]]:
    """Everything waiting on ``sock`` until it has been quiet for ``quiet_ms``."""
    out = []
    while sock.poll(quiet_ms):
        out.append(sock.recv_multipart())
    return out


KEYLESS = """
[default]
produce = ["default", "public.*"]
consume = ["default"]
"""


def test_the_real_eventmq_client_without_a_key_gets_the_default_rights_and_a_readable_refusal(make_server, tmp_path):
    pytest.importorskip("eventmq", reason="eventmq is installed by scripts/test")
    from eventmq.client.messages import defer_job
    from eventmq.sender import Sender

    rules = tmp_path / "permissions.toml"
    rules.write_text(KEYLESS)  # (no CURVE: every client is keyless, and [default] is what it may do)
    front, _ = free_tcp_endpoint()
    back, _ = free_tcp_endpoint()
    srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back, permissions=str(rules))
    sender = Sender()
    sender.connect(front)
    try:
        allowed = defer_job(sender, "myapp.jobs.add", args=[1, 2], queue="public.jobs", reply_requested=True)
        forbidden = defer_job(sender, "myapp.jobs.add", args=[1, 2], queue="payroll", reply_requested=True)
        answers: dict[str, list[str]] = {}
        while forbidden not in answers or allowed not in answers:
            assert sender.zsocket.poll(5000), f"answers so far: {answers}"
            frames = sender.recv_multipart()  # (eventmq decodes every frame: text)
            answers[frames[-1]] = frames
        assert answers[allowed][2] == "ACK"
        assert answers[forbidden][2] == "REPLY"
        assert json.loads(answers[forbidden][4]) == {
            "error": "request refused: not permitted: this client may not produce to 'payroll'"
        }
    finally:
        sender.zsocket.close(linger=0)
    stats = srv.stats()
    assert stats["queues"]["public.jobs"]["depth"] == 1 and "payroll" not in stats["queues"]
    assert stats["permissions"]["refused"] == {"anonymous": {"produce": 1}}


def test_a_worker_whose_key_lost_its_right_across_a_restart_is_not_given_back_its_jobs(tmp_path):
    # The gateway on a real store, restarted: a job handed out before is held for its JobManager,
    # which speaks again without an INFORM; the rules read at the restart no longer let it consume.
    from pzq.permissions import Permissions
    from pzq.store import Store

    from test_emqp_gateway import T0, gateway_on, given_a_job, request, worker

    store = Store(tmp_path / "db")
    gateway = gateway_on(store)
    request(gateway, b"req-1")
    job = given_a_job(gateway)
    store.commit()
    store.close()
    rules = tmp_path / "permissions.toml"
    rules.write_text('[default]\nproduce = ["jobs"]\n')  # (no key: [default]; it may produce, not consume)
    store = Store(tmp_path / "db")
    try:
        gateway = gateway_on(store, permissions=Permissions(str(rules)))
        assert gateway.broker.ready_count("jobs") == 0, "held for its worker, as after any restart"
        worker(gateway, b"w1", b"REPLY", b'{"done": true}', job[3], now=T0 + 1)
        assert b"w1" not in gateway.workers
        assert gateway.counters["replies_refused_total"] == 1
        assert gateway.broker.ready_count("jobs") == 1, "its job went back at once, not after the grace"
        assert gateway.permissions is not None and gateway.permissions.stats()["refused"] == {
            "anonymous": {"consume": 1}
        }
    finally:
        store.close()
