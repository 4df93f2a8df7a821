"""eMQP workers and clients that read nothing, with real peers on loopback TCP: a worker holds at most its
byte share of jobs, one that reads nothing is cut off and its jobs run elsewhere, one whose connection
closes gives its jobs back at once, and REPLYs a client leaves unread are counted once."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import zmq

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits
from pzq.endpoints.emqp_kept import KeptJobs
from pzq.gateways.emqp import EmqpGateway
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

from conftest import free_tcp_endpoint, recv, wait_until

V = b"eMQP/1.0"
KIB = 1 << 10


def mid() -> bytes:
    return str(uuid.uuid4()).encode()


@pytest.fixture
def emqp_tcp(make_server, sockets):
    """start(limits) -> (server, client(deaf), worker(deaf, ready)) on loopback TCP, whose deaf peers
    read nothing (libzmq stops reading their connections at once)."""

    def start(limits: Limits, **overrides):
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back, limits=limits, **overrides)
        made.append(srv)

        def peer(endpoint: str, deaf: bool) -> zmq.Socket:
            s = sockets(zmq.DEALER, None)
            s.identity = mid()
            if deaf:
                s.setsockopt(zmq.RCVHWM, 1)
                s.setsockopt(zmq.RCVBUF, 4 * KIB)
            s.connect(endpoint)
            return s

        def worker(deaf: bool = False, ready: int = 1) -> zmq.Socket:
            w = peer(back, deaf)
            w.send_multipart([b"", V, b"INFORM", mid(), b'[[10, "jobs"]]', b"worker"])
            if not deaf:
                assert recv(w)[2] == b"ACK"
            for _ in range(ready):
                w.send_multipart([b"", V, b"READY", mid()])
            return w

        return srv, (lambda deaf=False: peer(front, deaf)), worker

    made: list = []
    yield start
    for srv in made:  # before its peers close (conftest's ``sockets``: libzmq 4.3 may abort otherwise)
        srv.stop()


def request(client: zmq.Socket, payload: bytes) -> bytes:
    msgid = mid()
    client.send_multipart([b"", V, b"REQUEST", msgid, b"jobs", b"reply-requested", payload])
    return msgid


def serve(worker: zmq.Socket, jobs: int, reply: bytes = b'{"value": 1}', timeout_s: float = 20) -> list[bytes]:
    """Run ``jobs`` jobs as an honest JobManager: a REPLY and a READY for each; their payloads."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < jobs and time.monotonic() < deadline:
        if not worker.poll(100):
            worker.send_multipart([b"", V, b"HEARTBEAT", mid(), str(time.time()).encode()])
            continue
        frames = worker.recv_multipart()
        if frames[2] == b"REQUEST":
            got.append(frames[-1])
            worker.send_multipart([b"", V, b"REPLY", mid(), reply, frames[3]])
            worker.send_multipart([b"", V, b"READY", mid()])
    return got


def emqp_stats(srv) -> dict:
    return srv.stats()["emqp"]


def test_a_worker_that_reads_nothing_holds_its_share_then_is_cut_off_and_another_runs_its_jobs(emqp_tcp):
    share = 1 << 20
    srv, client_of, worker = emqp_tcp(Limits(delivery_share=share, stuck_reader_s=0.5, stuck_check_s=0.1))
    worker(deaf=True, ready=100)
    wait_until(lambda: emqp_stats(srv)["slots"] == 100)
    client = client_of()
    payloads = [b'"%02d%s"' % (i, b"x" * (256 * KIB)) for i in range(30)]
    for payload in payloads:
        request(client, payload)
    held = wait_until(lambda: emqp_stats(srv)["jobs_inflight"] or None)
    assert held <= share // (256 * KIB) + 1, "past its share and one job"
    wait_until(lambda: emqp_stats(srv)["workers_cut_total"] == 1, timeout_s=10)
    wait_until(lambda: emqp_stats(srv)["worker_connections_closed_total"] == 1, timeout_s=3)  # (its end)
    assert sorted(serve(worker(), 30)) == payloads, "every job runs, those it held included"


def test_a_worker_whose_connection_closes_gives_its_jobs_back_at_once(emqp_tcp):
    srv, client_of, worker = emqp_tcp(Limits(), emqp_heartbeat_interval=60.0)  # (silence alone: minutes)
    first = worker()
    request(client_of(), b'"once"')
    wait_until(lambda: emqp_stats(srv)["jobs_inflight"] == 1)
    first.close(linger=0)
    wait_until(lambda: emqp_stats(srv)["worker_connections_closed_total"] == 1, timeout_s=3)
    assert serve(worker(), 1) == [b'"once"']


def test_replies_a_client_reads_none_of_are_charged_to_it_or_counted_as_its_backlog_once(emqp_tcp):
    share = 1 << 20
    srv, client_of, worker = emqp_tcp(Limits(delivery_share=share))
    client = client_of(deaf=True)
    for _ in range(24):
        request(client, b'"job"')
    reply = json.dumps({"value": "y" * (256 * KIB)}).encode()
    assert len(serve(worker(), 24, reply=reply)) == 24
    stats = wait_until(lambda: (s := emqp_stats(srv))["replies_forwarded_total"] == 24 and s)
    memory = srv.stats()["memory"]
    assert 0 < stats["replies_held_bytes"] <= share + len(reply) + 1024, "in libzmq: its share and one REPLY"
    assert memory["emqp_backlogs_bytes"] > 0, "the rest waits, counted as its backlog"
    assert memory["deliveries_bytes"] >= stats["replies_held_bytes"]
    waiting = memory["emqp_backlogs_bytes"] + stats["replies_held_bytes"]
    assert waiting <= 24 * (len(reply) + 1024), "nothing counted twice"


@pytest.fixture
def gateway(store):
    gw = EmqpGateway(
        Broker(store, ack_timeout_s=5), EmqpJobs(store), Schedules(store), default_queues=[], heartbeat_s=3, liveness=3
    )
    gw.restore_jobs(0.0)
    return gw


def test_jobs_a_full_pipe_cannot_take_are_kept_for_their_worker_then_given_back(gateway, sockets, tmp_path):
    router = sockets(zmq.ROUTER, None)
    router.setsockopt(zmq.SNDHWM, 1)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(f"ipc://{tmp_path}/back")
    deaf = sockets(zmq.DEALER, None)
    deaf.identity = b"w1"
    deaf.setsockopt(zmq.RCVHWM, 1)
    deaf.setsockopt(zmq.RCVBUF, 4 * KIB)
    deaf.connect(f"ipc://{tmp_path}/back")
    deaf.send_multipart([b"", V, b"INFORM", mid(), b'[[10, "jobs"]]', b"worker"])
    assert router.poll(5000)
    for frames in (router.recv_multipart(), *([b"w1", b"", V, b"READY", mid()] for _ in range(20))):
        gateway.received("back", frames, now=Now(0.0, 0), user=None)
    for i in range(20):
        gateway.broker.produce("jobs", [b'"%02d%s"' % (i, b"x" * (256 * KIB))], now_us=0)
    kept = KeptJobs(router, gateway, Limits(reply_stale_s=1.0))
    for send in gateway.hand_out(now=Now(0.0, 0)):
        kept.send(send, now=0.0)
    assert kept.kept_total > 0 and kept.blocked() == {b"w1"}
    assert gateway.hand_out(now=Now(0.0, 0), blocked=kept.blocked()) == [], "nothing new while jobs wait"
    before = gateway.broker.ready_count("jobs")
    kept.flush(now=2.0)
    assert gateway.broker.ready_count("jobs") == before + kept.kept_total, "never sent: back in their queue"
    assert gateway.stats()["jobs_given_back_total"] == kept.kept_total and not kept.blocked()
