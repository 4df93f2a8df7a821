"""The eMQP gateway with raw pyzmq DEALER peers speaking like eventmq's client and JobManager."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import zmq

from pzq.clients import native as client

from conftest import free_tcp_endpoint, recv, wait_connected, wait_until

V = b"eMQP/1.0"


def mid() -> bytes:
    return str(uuid.uuid4()).encode()


@pytest.fixture
def emqp(make_server):
    """start(**config) -> (server, client(), worker(queues)) with the eMQP gateway on free ports."""
    ctx = zmq.Context.instance()
    made = []

    def start(**overrides):
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back, **overrides)

        def peer(endpoint):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.identity = mid()
            s.connect(endpoint)
            made.append(s)
            return s

        def worker(queues=b'[[10, "jobs"]]', ready=1):
            w = peer(back)
            inform = mid()
            w.send_multipart([b"", V, b"INFORM", inform, queues, b"worker"])
            assert next_command(w, b"ACK")[4] == inform
            for _ in range(ready):
                w.send_multipart([b"", V, b"READY", mid()])
            return w

        return srv, (lambda: peer(front)), worker

    yield start
    for s in made:
        s.close(linger=0)


def next_command(sock, command: bytes, timeout_ms: int = 5000) -> list[bytes]:
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0:
            pytest.fail(f"no {command!r} within {timeout_ms} ms")
        frames = recv(sock, left)
        if frames[2] == command:
            return frames


def before_barrier(c) -> list[list[bytes]]:
    """Every command the server sends client ``c`` before a barrier: "nothing more arrives" without
    a fixed wait. The ACK of a REQUEST sent now leaves after its commit, in a later turn than anything
    asked before, on the same ordered pipe to ``c``. (Its queue has no worker: it is never handed out.)"""
    barrier = mid()
    c.send_multipart([b"", V, b"REQUEST", barrier, b"test-barrier", b"", b'"barrier"'])
    before = []
    while (frames := recv(c))[2:] != [b"ACK", frames[3], barrier]:
        before.append(frames)
    return before


def settled_stats(srv) -> dict:
    """The server's counters including everything its previous turns handed out: a monitor request
    is answered in the turn that reads it, before that turn's deliveries; the second one, sent after
    the first's answer, is read in a later turn."""
    srv.stats()
    return srv.stats()


def request(c, queue=b"jobs", headers=b"", payload=b'["run", {"callable": "f", "path": "m"}]') -> bytes:
    m = mid()
    c.send_multipart([b"", V, b"REQUEST", m, queue, headers, payload])
    return m


def test_a_request_is_acked_once_stored_and_survives_in_its_named_queue(emqp):
    srv, client_of, _ = emqp()
    c = client_of()
    m = request(c, queue=b"emails")
    assert next_command(c, b"ACK")[4] == m
    assert srv.stats()["queues"]["emails"]["depth"] == 1


def test_jobs_go_to_the_heaviest_queue_first_and_fifo_within_it(emqp):
    srv, client_of, worker = emqp()
    c = client_of()
    light = [request(c, queue=b"light") for _ in range(2)]
    heavy = [request(c, queue=b"heavy") for _ in range(2)]
    for _ in range(4):
        next_command(c, b"ACK")
    w = worker(b'[[1, "light"], [50, "heavy"]]', ready=4)
    got = [next_command(w, b"REQUEST")[3] for _ in range(4)]
    assert got == heavy + light


def test_each_ready_is_one_slot(emqp):
    srv, client_of, worker = emqp()
    c = client_of()
    for _ in range(3):
        request(c)
    w = worker(ready=1)
    next_command(w, b"REQUEST")
    assert settled_stats(srv)["queues"]["jobs"]["inflight"] == 1, "a second job went to a worker with one slot"
    assert not w.poll(0)
    w.send_multipart([b"", V, b"READY", mid()])
    next_command(w, b"REQUEST")


def test_jobs_reach_workers_with_reply_requested_and_a_reply_is_kept_from_clients_that_did_not_ask(emqp):
    srv, client_of, worker = emqp()
    c = client_of()
    m = request(c, headers=b"guarantee")
    w = worker()
    job = next_command(w, b"REQUEST")
    assert job[5] == b"guarantee,reply-requested"
    w.send_multipart([b"", V, b"REPLY", mid(), b'{"value": 1}', m])
    wait_until(lambda: srv.stats()["queues"]["jobs"]["depth"] == 0)
    assert not [f for f in before_barrier(c) if f[2] == b"REPLY"]


def test_messages_from_other_protocols_reach_workers_as_text_jobs(emqp, sockets):
    srv, _, worker = emqp()
    d = sockets(zmq.DEALER, srv.receive)
    d.send_multipart([b"n", b"", b'{"from": ', b'"native"}'])
    assert recv(d)[1] == b"1"
    w = worker(b'[[10, "default"]]')
    job = next_command(w, b"REQUEST")
    assert json.loads(job[6]) == {"from": "native"}
    assert len(job[3]) == 32 and job[5] == b"reply-requested"
    w.send_multipart([b"", V, b"REPLY", mid(), b'{"value": null}', job[3]])
    wait_until(lambda: srv.stats()["messages"] == 0)


def test_a_request_is_consumable_by_a_native_consumer(emqp, sockets):
    srv, client_of, _ = emqp()
    consumer = wait_connected(sockets(zmq.ROUTER, None), srv.send)
    c = client_of()
    request(c, queue=b"default", payload=b'["run", {}]')
    assert recv(consumer)[5:] == [b'["run", {}]']


def test_publish_fans_out_to_subscribers_as_topic_and_payload(emqp):
    pub, _ = free_tcp_endpoint()
    srv, client_of, _ = emqp(emqp_publish_dsn=pub)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"news")
    sub.connect(pub)
    try:
        c = client_of()
        deadline = time.monotonic() + 5
        while not sub.poll(100):  # a SUB learns of its subscription asynchronously: publish until heard
            assert time.monotonic() < deadline, "no publication arrived"
            c.send_multipart([b"", V, b"PUBLISH", mid(), b"news", b'{"x": 1}'])
        assert sub.recv_multipart() == [b"news", b'{"x": 1}']
    finally:
        sub.close(linger=0)


def test_the_monitor_shows_workers_and_slots(emqp):
    srv, _, worker = emqp()
    worker(ready=3)
    stats = wait_until(lambda: (s := srv.stats())["emqp"]["slots"] == 3 and s)
    assert stats["emqp"]["workers"] == 1
    assert "emqp.workers: 1" in client.monitor_request(srv.monitor)


def test_bad_frames_are_counted_and_never_stop_the_broker(emqp):
    srv, client_of, worker = emqp()
    c = client_of()
    for frames in (
        [b"x"],
        [b"", V, b"REQUEST", mid(), b"q", b"timeout:soon", b"p"],
        [b"", V, b"REQUEST", mid(), b"", b"", b"p"],
        [b"", V, b"REPLY", mid(), b"\xff"],
        [b"", V, b"REQUEST", mid(), b"q" * 300, b"", b"p"],
    ):
        c.send_multipart(frames)
    w = client_of()  # a worker socket on the frontend is just a client
    w.send_multipart([b"", V, b"INFORM", mid(), b"[[true, 1]]", b"worker"])
    wait_until(lambda: srv.stats()["emqp"]["bad_input_total"] >= 5)
    m = request(c)
    assert next_command(c, b"ACK")[4] == m


def test_a_schedule_is_acked_its_job_reaches_a_worker_and_unschedule_removes_it(emqp):
    # (its timing rules are tested on an injected clock in test_emqp_gateway.py)
    srv, client_of, worker = emqp()
    c = client_of()
    payload = json.dumps(
        ["run", {"callable": "tick", "path": "m", "args": [], "kwargs": {}, "class_args": [], "class_kwargs": {}}]
    ).encode()
    m = mid()
    c.send_multipart([b"", V, b"SCHEDULE", m, b"ticks", b"", b"60", payload, b""])
    assert next_command(c, b"ACK")[4] == m
    w = worker(b'[[10, "ticks"]]', ready=3)
    first = next_command(w, b"REQUEST")
    assert first[6] == payload and first[5] == b"reply-requested"
    assert srv.stats()["emqp"]["schedules"] == 1
    c.send_multipart([b"", V, b"UNSCHEDULE", mid(), b"ticks", b"", b"-1", payload, b""])
    next_command(c, b"ACK")
    wait_until(lambda: srv.stats()["emqp"]["schedules"] == 0)


def test_schedules_survive_a_restart(process_server):
    front, _ = free_tcp_endpoint()
    back, _ = free_tcp_endpoint()
    server = process_server("--emqp-frontend-dsn", front, "--emqp-backend-dsn", back)
    c = zmq.Context.instance().socket(zmq.DEALER)
    c.linger = 0
    c.connect(front)
    try:
        c.send_multipart([b"", V, b"SCHEDULE", mid(), b"s", b"nohaste", b"3600", b'["run", {}]', b""])
        next_command(c, b"ACK")
        server.restart()
        assert server.stats()["emqp"]["schedules"] == 1
    finally:
        c.close(linger=0)


def test_a_refused_request_and_a_disconnect_get_an_error_reply_naming_them(emqp):
    srv, client_of, _ = emqp()
    c = client_of()
    bad = mid()
    c.send_multipart([b"", V, b"REQUEST", bad, b"q", b"timeout:soon", b"p"])
    reply = next_command(c, b"REPLY")
    assert reply[5] == bad and "timeout:soon" in json.loads(reply[4])["error"]
    stop = mid()
    c.send_multipart([b"", V, b"DISCONNECT", stop])
    reply = next_command(c, b"REPLY")
    assert reply[5] == stop and "signal" in json.loads(reply[4])["error"]
    m = request(c)
    assert next_command(c, b"ACK")[4] == m, "the broker still serves after a DISCONNECT"


def test_two_clients_reusing_one_msgid_each_get_their_own_reply(emqp):
    srv, client_of, worker = emqp()
    c1, c2 = client_of(), client_of()
    same = mid()
    for c, body in ((c1, b'"one"'), (c2, b'"two"')):
        c.send_multipart([b"", V, b"REQUEST", same, b"jobs", b"reply-requested", body])
        next_command(c, b"ACK")
    w1, w2 = worker(), worker()
    job1, job2 = next_command(w1, b"REQUEST"), next_command(w2, b"REQUEST")
    assert job1[3] == job2[3] == same
    w2.send_multipart([b"", V, b"REPLY", mid(), b'{"value": ' + job2[6] + b"}", same])
    w1.send_multipart([b"", V, b"REPLY", mid(), b'{"value": ' + job1[6] + b"}", same])
    assert next_command(c1, b"REPLY")[4] == b'{"value": "one"}'
    assert next_command(c2, b"REPLY")[4] == b'{"value": "two"}'
    wait_until(lambda: srv.stats()["queues"]["jobs"]["depth"] == 0)


def test_schedules_with_a_bad_interval_or_cron_are_refused_with_an_error_reply(emqp):
    srv, client_of, _ = emqp()
    c = client_of()
    for interval, cron in (
        (b"--5", b""),
        ("\N{SUPERSCRIPT TWO}".encode(), b""),
        (b"9" * 30, b""),
        (b"-1", b"not a cron"),
        (b"-1", b"0 0 31 2 *"),
        (b"-1", b"* " * 200),
    ):
        m = mid()
        c.send_multipart([b"", V, b"SCHEDULE", m, b"s", b"", interval, b'["run", {}]', cron])
        reply = next_command(c, b"REPLY")
        assert reply[5] == m and "error" in json.loads(reply[4])
    assert srv.stats()["emqp"]["schedules"] == 0


def test_the_monitor_lists_a_worker_among_its_queues_consumers_and_in_its_clients(emqp):
    from pzq.clients.admin import AdminRefused, admin_request

    srv, front, worker = emqp()
    since = time.time_ns() // 1000
    worker(queues=b'[[10, "jobs"], [5, "other"]]', ready=2)
    request(front(), queue=b"jobs")

    def consumers() -> list | None:
        try:
            return admin_request(srv.monitor, "QUEUE jobs")["consumers"]
        except AdminRefused:  # "there is no queue 'jobs'" yet: the request is on its way on a busy machine
            return None

    [row] = wait_until(consumers)
    assert row["protocol"] == "emqp" and row["connected_us"] >= since - 1_000_000
    assert wait_until(lambda: admin_request(srv.monitor, "QUEUE jobs")["consumers"][0]["held"] == 1)
    [table] = [t for t in admin_request(srv.monitor, "CLIENTS")["tables"] if t["kind"] == "emqp-workers"]
    assert table["columns"][-1] == "connected_us" and table["rows"][0][-1] == row["connected_us"]


def test_a_worker_without_a_routing_id_of_its_own_is_listed_by_a_digest_never_by_the_id_libzmq_made(emqp, sockets):
    # (a ROUTER makes b"\x00" + a 4-byte counter; a client that read one on a page and connected with the
    # next as its own made libzmq abort the whole server at the next peer without one: socket_base.cpp:2113)
    from pzq.clients.admin import admin_request

    srv, _, worker = emqp()
    named = worker(queues=b'[[10, "default"]]')
    anonymous = sockets(zmq.DEALER, srv.config.emqp_backend_dsn)
    inform = mid()
    anonymous.send_multipart([b"", V, b"INFORM", inform, b'[[10, "default"]]', b"worker"])
    assert next_command(anonymous, b"ACK")[4] == inform

    def shown() -> list[str]:
        [table] = [t for t in admin_request(srv.monitor, "CLIENTS")["tables"] if t["kind"] == "emqp-workers"]
        return sorted(row[0] for row in table["rows"])

    first = wait_until(lambda: len(rows := shown()) == 2 and rows)
    assert named.identity.decode() in first, "an id of the client's own, printable, is shown as it is"
    [digest] = [cell for cell in first if cell != named.identity.decode()]
    assert digest.startswith("peer-") and len(digest) == 15, digest
    assert shown() == first, "the same worker, the same name"
    consumers = admin_request(srv.monitor, "QUEUE default")["consumers"]
    assert sorted(row["client"] for row in consumers) == first
