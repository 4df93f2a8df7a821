"""Real `pzq serve` subprocesses, stopped with SIGTERM or killed with SIGKILL, restarted on the same data."""

from __future__ import annotations

import signal
import threading

import pytest
import zmq

from pzq.clients import native as client

from conftest import recv, wait_connected, wait_until


def drain(sockets, server, expected: int, timeout_ms: int = 5000) -> list[bytes]:
    """Consume and ack ``expected`` messages; returns their bodies (single-frame)."""
    c = wait_connected(sockets(zmq.ROUTER, None), server.send)
    bodies = []
    while len(bodies) < expected:
        peer, key, *_, body = recv(c, timeout_ms)
        bodies.append(body)
        c.send_multipart([peer, key, b"1"])
    return bodies


def test_every_acked_message_survives_a_kill_9_in_the_middle_of_a_stream(process_server, sockets):
    server = process_server()
    acked: list[bytes] = []
    d = sockets(zmq.DEALER, server.receive)
    stop = threading.Event()

    def produce_until_killed():
        sent = 0
        pending = 0
        while not stop.is_set() or pending:
            if not stop.is_set() and pending < 50:
                d.send_multipart([b"%d" % sent, b"", b"body-%d" % sent])
                sent += 1
                pending += 1
                continue
            if not d.poll(1000):
                return  # the server died: what was not acked does not count
            mid, status, *_ = d.recv_multipart()
            pending -= 1
            if status == b"1":
                acked.append(b"body-" + mid)

    producer = threading.Thread(target=produce_until_killed, daemon=True)  # (never outlives a failed test)
    producer.start()
    while len(acked) < 2000 and producer.is_alive():
        threading.Event().wait(0.01)
    server.stop(signal.SIGKILL)
    stop.set()
    producer.join(10)
    assert len(acked) >= 2000
    server.start()
    stored = server.stats()["messages"]
    assert stored >= len(acked)
    bodies = set(drain(sockets, server, stored))
    assert set(acked) <= bodies


def test_sigterm_stops_the_server_cleanly_with_exit_0_and_keeps_messages(process_server, sockets):
    server = process_server()
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"%d" % i] for i in range(100)]))
    assert server.stop(signal.SIGTERM) == 0
    server.start()
    assert sorted(drain(sockets, server, 100), key=int) == [b"%d" % i for i in range(100)]


def test_messages_in_flight_at_a_crash_are_delivered_again_at_once_after_restart(process_server, sockets):
    server = process_server(ack_timeout=60_000_000)
    c = wait_connected(sockets(zmq.ROUTER, None), server.send)
    with client.Producer(server.receive) as producer:
        producer.produce_many([[b"a"], [b"b"]])
    assert {recv(c)[-1], recv(c)[-1]} == {b"a", b"b"}
    c.close(linger=0)
    server.restart(signal.SIGKILL)
    # Long ack timeout: only "in flight at restart means ready" can bring them back this fast.
    assert sorted(drain(sockets, server, 2, timeout_ms=3000)) == [b"a", b"b"]


def test_delivery_counts_and_dead_letters_survive_restarts(process_server, sockets):
    server = process_server("--max-deliveries", "2", ack_timeout=60_000_000)
    with client.Producer(server.receive) as producer:
        producer.produce_many([[b"poison"]])
    for _ in range(2):  # each delivery is counted durably, even though each ends in a crash
        c = wait_connected(sockets(zmq.ROUTER, None), server.send)
        syncs = server.stats()["syncs"]
        assert recv(c)[-1] == b"poison"
        # The count is committed within --commit-interval (10 ms), not with the send: wait for it.
        wait_until(lambda syncs=syncs: server.stats()["syncs"] > syncs)
        c.close(linger=0)
        server.restart(signal.SIGKILL)
    c = wait_connected(sockets(zmq.ROUTER, None), server.send)
    wait_until(lambda: server.stats()["queues"]["default"]["dead_letters"] == 1)
    assert server.stats()["messages"] == 0
    # A barrier, not a quiet wait: a marker produced now reaches the only consumer through the same
    # ordered pipe as a third delivery would have.
    with client.Producer(server.receive) as producer:
        producer.produce_many([[b"marker"]])
    peer, key, *frames = recv(c)
    assert frames[-1] == b"marker", "a third delivery passed --max-deliveries 2"
    c.send_multipart([peer, key, b"1"])
    wait_until(lambda: server.stats()["messages"] == 0)
    server.restart(signal.SIGTERM)
    assert '"reason":"max-deliveries"' in client.monitor_request(server.monitor, "DEADLETTERS default")


def test_syncs_count_durable_commits(process_server):
    server = process_server()
    before = server.stats()["syncs"]
    with client.Producer(server.receive) as producer:
        producer.produce_many([[b"x"]] * 10, window=1)
    assert server.stats()["syncs"] >= before + 10


@pytest.mark.parametrize("removed", [(), ("lock.mdb", "pzq.lock")])
def test_a_second_server_on_the_same_store_is_refused_with_one_clear_line(process_server, removed):
    import subprocess
    import sys

    server = process_server()
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"m%d" % i] for i in range(100)]))
    for name in removed:  # whatever an operator deletes, short of the data itself, the lock holds
        if (server.database / name).exists():
            (server.database / name).unlink()
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            str(server.database),
            "--receive-dsn",
            "ipc://" + str(server.tmp_path / "r2"),
            "--send-dsn",
            "ipc://" + str(server.tmp_path / "s2"),
            "--monitor-dsn",
            "ipc://" + str(server.tmp_path / "m2"),
            "--phpmq-dsn",
            "",
            "--emqp-frontend-dsn",
            "",
            "--emqp-backend-dsn",
            "",
            "--emqp-publish-dsn",
            "",
            "--mqks-dsn",
            "",
            "--api-dsn",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert second.returncode == 2
    assert "in use by another pzq process" in second.stderr and "Traceback" not in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"n%d" % i] for i in range(100)]))
    assert server.stats()["messages"] == 200, "the first server still serves, and alone"
    server.restart()
    assert server.stats()["messages"] == 200
