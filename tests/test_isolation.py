"""A client settles only what was delivered to it: hostile clients of every protocol, over real sockets,
try to ack, requeue, dead-letter or complete other clients' messages, and the victims' messages stay."""

from __future__ import annotations

import pytest
import zmq

from pzq.clients import native as client
from pzq.clients.api import ApiClient
from pzq.clock import Now
from pzq.store import message_id

from conftest import free_tcp_endpoint, recv, wait_connected, wait_until
from test_emqp import V, before_barrier, mid, next_command
from test_phpmq import Client as PhpmqClient

GUESSES = [message_id(qid, seq) for qid in range(1, 5) for seq in range(1, 6)]  # small sequential numbers


def queues(srv) -> dict:
    return srv.stats()["queues"]


def test_a_native_consumer_that_received_nothing_cannot_ack_guessed_keys(make_server, tmp_path, sockets):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.produce([("orders", b"o1"), ("orders", b"o2"), ("orders", b"o3")])
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"d1"]).ok
    mallory = sockets(zmq.ROUTER, None)
    wait_connected(mallory, srv.send)
    peer = recv(mallory)[0]  # the native queue's one message comes to the only consumer: it is held
    mallory.send_multipart([peer, b"x", b"1"])  # (a junk key: ignored, not counted)
    for guess in GUESSES:  # "0|" and any timestamp: the key's id is what names the message
        mallory.send_multipart([peer, b"0|" + guess.encode(), b"1"])
        mallory.send_multipart([peer, b"0|" + guess.encode(), b"0"])
    wait_until(lambda: srv.stats()["refused_not_held_total"] == 2 * len(GUESSES) - 1)
    assert queues(srv)["orders"]["depth"] == 3 and queues(srv)["orders"]["dead_letters"] == 0
    # The two guesses that named the delivered message were its holder's own answers: ack, then a
    # nack that comes too late to mean anything. Nothing else changed.
    assert queues(srv)["default"]["depth"] == 0


def test_a_native_consumer_may_ack_what_it_was_delivered_even_late(make_server, sockets):
    srv = make_server(ack_timeout=0.1)
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"slow"]).ok
    consumer = sockets(zmq.ROUTER, None)
    wait_connected(consumer, srv.send)
    first = recv(consumer)
    again = recv(consumer)  # the ack timeout gave it out again: the same key
    assert first[1] == again[1]
    consumer.send_multipart([first[0], first[1], b"1"])  # late, but its holder's
    wait_until(lambda: queues(srv)["default"]["depth"] == 0)
    assert srv.stats()["refused_not_held_total"] == 0


def test_a_phpmq_connection_that_never_consumed_cannot_ack_or_dead_letter_guessed_ids(make_server):
    dsn, addr = free_tcp_endpoint()
    srv = make_server(phpmq_dsn=dsn)
    producer = PhpmqClient(addr)
    for i in range(3):
        producer.send(1, (1, b"jobs"), (2, b"job%d" % i))
    wait_until(lambda: queues(srv).get("jobs", {}).get("depth") == 3)
    mallory = PhpmqClient(addr)
    for guess in GUESSES:
        mallory.send(4, (1, b"jobs"), (3, guess.encode()))  # ack
        mallory.send(6, (1, b"jobs"), (3, guess.encode()))  # dead letter
        mallory.send(5, (1, b"jobs"), (3, guess.encode()), (5, b"60"))  # re-queue with a TTL
    mallory.send(2, (1, b"jobs"), (4, b"1"))  # then consume: answered only after all of the above
    assert mallory.read()[1][2] == b"job0"
    jobs = queues(srv)["jobs"]
    assert (jobs["depth"], jobs["dead_letters"], jobs["inflight"]) == (3, 0, 1)
    producer.sock.close()
    mallory.sock.close()


def test_a_phpmq_connection_cannot_ack_a_message_dispatched_to_another(make_server):
    dsn, addr = free_tcp_endpoint()
    srv = make_server(phpmq_dsn=dsn)
    alice, bob = PhpmqClient(addr), PhpmqClient(addr)
    alice.send(1, (1, b"jobs"), (2, b"first"))
    alice.send(1, (1, b"jobs"), (2, b"second"))
    alice.send(2, (1, b"jobs"), (4, b"1"))
    _, given, _ = alice.read()
    assert given[2] == b"first"
    bob.send(4, (1, b"jobs"), (3, given[3]))  # Alice's message id
    bob.send(6, (1, b"jobs"), (3, given[3]))
    bob.send(2, (1, b"jobs"), (4, b"1"))
    assert bob.read()[1][2] == b"second"
    jobs = queues(srv)["jobs"]
    assert (jobs["depth"], jobs["dead_letters"], jobs["inflight"]) == (2, 0, 2)
    assert srv.stats()["refused_not_held_total"] == 2
    alice.send(4, (1, b"jobs"), (3, given[3]))
    wait_until(lambda: queues(srv)["jobs"]["depth"] == 1)
    for c in (alice, bob):
        c.sock.close()


@pytest.fixture
def emqp(make_server, sockets):
    """(server, client(), worker(ready=...), stranger()) on the eMQP gateway: a client on the frontend, an
    INFORM'd worker on the backend, or a backend peer that never said INFORM."""
    front, _ = free_tcp_endpoint()
    back, _ = free_tcp_endpoint()
    srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back)

    def peer(endpoint):
        s = sockets(zmq.DEALER, None)
        s.identity = mid()
        s.connect(endpoint)
        return s

    def worker(ready: int = 0):
        w = peer(back)
        w.send_multipart([b"", V, b"INFORM", mid(), b'[[10, "jobs"]]', b"worker"])
        next_command(w, b"ACK")
        for _ in range(ready):
            w.send_multipart([b"", V, b"READY", mid()])
        return w

    def requester():
        c = peer(front)
        c.send_multipart([b"", V, b"REQUEST", mid(), b"jobs", b"reply-requested", b'"payload"'])
        next_command(c, b"ACK")
        return c

    return srv, requester, worker, lambda: peer(back)


def test_an_emqp_peer_completes_only_a_job_it_holds(emqp):
    srv, requester, worker, stranger_of = emqp
    c = requester()
    honest = worker(ready=1)
    job = next_command(honest, b"REQUEST")
    stranger = stranger_of()  # never sent INFORM
    stranger.send_multipart([b"", V, b"REPLY", mid(), b'{"stolen": 1}', job[3]])
    other = worker()  # registered, live, serves the queue, but was not given the job
    other.send_multipart([b"", V, b"REPLY", mid(), b'{"stolen": 2}', job[3]])
    wait_until(lambda: srv.stats()["emqp"]["replies_refused_total"] == 2)
    assert (queues(srv)["jobs"]["depth"], queues(srv)["jobs"]["inflight"]) == (1, 1)
    assert before_barrier(c) == [], "the client got a REPLY nobody who ran its job sent"
    honest.send_multipart([b"", V, b"REPLY", mid(), b'{"done": true}', job[3]])
    assert next_command(c, b"REPLY")[4] == b'{"done": true}'
    wait_until(lambda: queues(srv)["jobs"]["depth"] == 0)


def test_a_jobmanager_that_reconnects_under_a_new_identity_may_finish_its_jobs(emqp):
    # eventmq's JobManager rebuilds its socket with a fresh uuid identity on a reset: its REPLYs for the
    # jobs it still runs then come from the new connection, which INFORMs again with the same queues.
    srv, requester, worker, _ = emqp
    c = requester()
    old = worker(ready=1)
    job = next_command(old, b"REQUEST")
    old.send_multipart([b"", V, b"KBYE", mid()])  # draining: gets nothing new
    new = worker()
    new.send_multipart([b"", V, b"REPLY", mid(), b'{"done": true}', job[3]])
    assert next_command(c, b"REPLY")[4] == b'{"done": true}'
    wait_until(lambda: queues(srv)["jobs"]["depth"] == 0)


def test_a_reset_jobmanager_inherits_its_jobs_once_its_old_connection_missed_two_heartbeats(store):
    from pzq.broker import Broker
    from pzq.gateways.emqp import EmqpGateway
    from pzq.store.emqp_jobs import EmqpJobs
    from pzq.store.schedules import Schedules

    broker = Broker(store, ack_timeout_s=5)
    gateway = EmqpGateway(
        broker, EmqpJobs(store), Schedules(store), default_queues=["default"], heartbeat_s=3, liveness=3
    )

    def command(peer, name, *args, now):
        return gateway.from_worker([peer, b"", V, name, mid(), *args], now=Now(now, 1))

    gateway.from_client([b"client", b"", V, b"REQUEST", b"req-1", b"jobs", b"", b'"x"'], now=Now(0, 1))
    command(b"old", b"INFORM", b'[[10, "jobs"]]', b"worker", now=0)
    command(b"old", b"READY", now=0)
    [(_, job, _, _)] = gateway.hand_out(now=Now(0, 1))
    command(b"new", b"INFORM", b'[[10, "jobs"]]', b"worker", now=1)
    command(b"elsewhere", b"INFORM", b'[[10, "other"]]', b"worker", now=1)
    command(b"new", b"REPLY", b"{}", b"req-1", now=5)  # the old connection is still live: not yet
    command(b"elsewhere", b"REPLY", b"{}", b"req-1", now=7)  # another queue's worker: never
    assert store.queue("jobs").count == 1 and gateway.counters["replies_refused_total"] == 2
    command(b"new", b"REPLY", b"{}", b"req-1", now=7)  # old silent for more than two heartbeat intervals
    assert store.queue("jobs").count == 0 and gateway.counters["replies_total"] == 1


def test_mqks_delete_queue_cannot_settle_what_other_protocols_hold(make_server):
    from pzq.clients.mqks import MqksClient
    from pzq.errors import ClientError

    mqks_dsn, _ = free_tcp_endpoint()
    phpmq_dsn, phpmq_addr = free_tcp_endpoint()
    srv = make_server(mqks_dsn=mqks_dsn, phpmq_dsn=phpmq_dsn)
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"native"]).ok
    with MqksClient(mqks_dsn) as mq:
        with pytest.raises(ClientError, match="refused"):
            mq.wait_ok(mq.request("delete_queue", "default", confirm=True))  # never bound through MQKS
        mq.wait_ok(mq.request("delete_consumer", mq.consume("jobs", ["e"]), confirm=True))  # bound, no consumer
        php = PhpmqClient(phpmq_addr)
        php.send(1, (1, b"jobs"), (2, b"held by php"))
        php.send(2, (1, b"jobs"), (4, b"1"))
        _, held, _ = php.read()
        with pytest.raises(ClientError, match="refused"):
            mq.wait_ok(mq.request("delete_queue", "jobs", confirm=True))
        assert queues(srv)["jobs"]["depth"] == 1 and queues(srv)["default"]["depth"] == 1
        php.send(4, (1, b"jobs"), (3, held[3]))
        wait_until(lambda: queues(srv)["jobs"]["depth"] == 0)
        mq.wait_ok(mq.request("delete_queue", "jobs", confirm=True))  # nothing of it is held any more
        php.sock.close()


def test_mqks_cannot_delete_a_queue_it_did_not_make_by_binding_it_first(make_server):
    from pzq.clients.mqks import MqksClient
    from pzq.errors import ClientError

    mqks_dsn, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=mqks_dsn)
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"native"]).ok
    with MqksClient(mqks_dsn) as mq:
        mq.wait_ok(mq.request("rebind", "default e", confirm=True))  # binds `default` to an event
        with pytest.raises(ClientError, match="refused"):
            mq.wait_ok(mq.request("delete_queue", "default", confirm=True))
    assert queues(srv)["default"]["depth"] == 1


def test_a_schedules_payload_stays_in_the_store_and_each_run_reads_it(store):
    from test_emqp_gateway import gateway_on

    gateway = gateway_on(store)
    big = "p" * 100_000
    out = gateway.from_client(
        [b"client", b"", V, b"SCHEDULE", b"s-1", b"jobs", b"run_count:2", b"60", big.encode()], now=Now(0, 1_000_000)
    )
    assert out[0][1][3] == b"ACK"
    assert all("payload" not in record for record in gateway.schedules.values())
    assert gateway.run_schedules(1_000_000) == 1 and gateway.run_schedules(61_000_000) == 1
    assert [m.frames for m in store.scan("jobs")] == [[big.encode()], [big.encode()]]
    assert gateway.schedules == {}, "run_count:2 spent"
