"""The PHPMQ gateway over real TCP: raw-socket clients, a real PHP process, and a kill -9 restart."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import zmq

from pzq.clients import native as client
from pzq.protocols.phpmq import encode

from conftest import free_tcp_endpoint, recv, wait_connected, wait_until

PHP_CLIENT = Path(__file__).parent / "php" / "phpmq_client.php"


class Client:
    """A PHPMQ client on a plain socket: sends bytes, reads whole messages with a timeout."""

    def __init__(self, addr, source: str | None = None):
        # (``source``: a loopback address to connect from, for rules per source network)
        self.sock = socket.create_connection(addr, timeout=5, source_address=(source, 0) if source else None)
        self.buf = b""

    def send(self, msg_type: int, *packets: tuple[int, bytes]) -> None:
        self.sock.sendall(encode(msg_type, list(packets)))

    def _need(self, n: int, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        while len(self.buf) < n:
            more = self.sock.recv(65536)
            if not more:
                raise EOFError("closed by the server")
            self.buf += more
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self, timeout: float = 5.0) -> tuple[int, dict[int, bytes], int]:
        head = self._need(8, timeout)
        msg_type, count = int(head[3:6]), int(head[6:8])
        packets = {}
        for _ in range(count):
            ph = self._need(32, timeout)
            packets[int(ph[1:3])] = self._need(int(ph[3:]), timeout)
        return msg_type, packets, count

    def nothing_for(self, seconds: float) -> bool:
        try:
            self.read(seconds)
        except TimeoutError:
            return True
        return False


@pytest.fixture
def phpmq(make_server):
    """(server, connect) with the PHPMQ gateway on a free port."""
    dsn, addr = free_tcp_endpoint()
    made = []

    def start(**overrides):
        srv = make_server(phpmq_dsn=dsn, **overrides)

        def connect() -> Client:
            c = Client(addr)
            made.append(c)
            return c

        return srv, connect, addr

    yield start
    for c in made:
        c.sock.close()


def test_a_consumer_gets_at_most_count_unacked_messages_fifo(phpmq):
    srv, connect, _ = phpmq()
    p = connect()
    for i in range(5):
        p.send(1, (1, b"w"), (2, b"%d" % i))
    c = connect()
    c.send(2, (1, b"w"), (4, b"2"))
    first, second = c.read()[1], c.read()[1]
    assert (first[2], second[2]) == (b"0", b"1")
    assert c.nothing_for(0.3), "a third message passed a credit window of 2"
    c.send(4, (1, b"w"), (3, first[3]))
    assert c.read()[1][2] == b"2"


def test_a_new_consume_request_replaces_the_old_one(phpmq):
    srv, connect, _ = phpmq()
    p = connect()
    p.send(1, (1, b"a"), (2, b"from a"))
    p.send(1, (1, b"b"), (2, b"from b"))
    c = connect()
    c.send(2, (1, b"nothing-here"), (4, b"1"))
    c.send(2, (1, b"b"), (4, b"1"))
    msg_type, packets, count = c.read()
    assert (msg_type, packets[1], packets[2]) == (3, b"b", b"from b")


def test_an_expired_message_is_never_dispatched_and_goes_to_the_dead_letters(phpmq):
    srv, connect, _ = phpmq()
    p = connect()
    p.send(1, (1, b"t"), (2, b"short-lived"), (5, b"1"))
    p.send(1, (1, b"t"), (2, b"forever"), (5, b"0"))
    wait_until(lambda: srv.stats()["queues"].get("t", {}).get("depth") == 2)
    stored = time.monotonic()  # (its TTL runs from when the server read it: by now at the latest)
    wait_until(lambda: time.monotonic() - stored > 1.05)  # the TTL is whole seconds: let one pass
    c = connect()
    c.send(2, (1, b"t"), (4, b"5"))
    assert c.read()[1][2] == b"forever"
    assert c.nothing_for(0.3)
    assert srv.stats()["queues"]["t"]["dead_letters"] == 1
    letters = client.monitor_request(srv.monitor, "DEADLETTERS t")
    assert '"reason":"expired"' in letters


def test_an_unacked_message_comes_back_after_the_ack_timeout(phpmq):
    srv, connect, _ = phpmq(ack_timeout=0.2)
    p = connect()
    p.send(1, (1, b"slow"), (2, b"x"))
    c = connect()
    c.send(2, (1, b"slow"), (4, b"1"))
    first = c.read()[1]
    again = c.read(3.0)[1]
    assert again[3] == first[3] and again[2] == b"x"
    assert srv.stats()["expired_messages"] == 1


def test_garbage_and_absurd_lengths_close_only_that_connection_and_lose_nothing(phpmq):
    srv, connect, _ = phpmq(max_message_size=1 << 20)
    p = connect()
    p.send(1, (1, b"g"), (2, b"kept"))
    for garbage in (b"GET / HTTP/1.1\r\n\r\n", b"H0100102P01" + b"9" * 29, b"H0199902"):
        bad = connect()
        bad.sock.sendall(garbage)
        with pytest.raises((EOFError, ConnectionResetError)):
            bad.read(3.0)
    wait_until(lambda: srv.stats()["phpmq"]["closed_bad_input_total"] == 3)
    c = connect()
    c.send(2, (1, b"g"), (4, b"1"))
    assert c.read()[1][2] == b"kept"


def test_a_full_store_closes_the_sending_connection_since_phpmq_has_no_error_reply(phpmq):
    srv, connect, _ = phpmq(max_store_size=1 << 20)
    p = connect()
    with pytest.raises((EOFError, ConnectionResetError, BrokenPipeError)):
        for _ in range(30):
            p.send(1, (1, b"big"), (2, b"x" * 100_000))
        p.read(3.0)
    assert 0 < srv.stats()["queues"]["big"]["depth"] < 30


def test_a_multi_frame_native_message_reaches_phpmq_as_its_frames_joined(phpmq, sockets):
    srv, connect, _ = phpmq()
    d = sockets(zmq.DEALER, srv.receive)
    d.send_multipart([b"id", b"", b"part one|", b"", b"part two"])
    assert recv(d)[1] == b"1"
    c = connect()
    c.send(2, (1, b"default"), (4, b"1"))
    assert c.read()[1][2] == b"part one|part two"


def test_a_phpmq_message_reaches_a_native_consumer_as_one_frame(phpmq, sockets):
    srv, connect, _ = phpmq()
    consumer = wait_connected(sockets(zmq.ROUTER, None), srv.send)
    connect().send(1, (1, b"default"), (2, b"\x00binary\xff"))
    frames = recv(consumer)
    assert frames[4:] == [b"", b"\x00binary\xff"]


def test_the_monitor_counts_phpmq_connections_and_consumers(phpmq):
    srv, connect, _ = phpmq()
    connect()
    c = connect()
    c.send(2, (1, b"m"), (4, b"1"))
    stats = wait_until(lambda: (s := srv.stats())["phpmq"]["consumers"] == 1 and s)
    assert stats["phpmq"]["connections"] == 2
    assert "phpmq.connections: 2" in client.monitor_request(srv.monitor)


def php(addr, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["php", str(PHP_CLIENT), addr[0], str(addr[1]), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.slow  # (a PHP runtime per run)
def test_a_real_php_client_sends_consumes_acks_requeues_and_dead_letters(phpmq):
    import base64

    srv, connect, addr = phpmq()
    assert php(addr, "send-legacy", "jobs", "legacy hello").returncode == 0
    assert php(addr, "send", "jobs", "current hello", "3600").returncode == 0
    wait_until(lambda: srv.stats()["queues"].get("jobs", {}).get("depth") == 2)
    requeued = php(addr, "consume", "jobs", "1", "requeue", "0")
    assert requeued.returncode == 0, requeued.stderr
    first = json.loads(requeued.stdout.splitlines()[0])
    assert base64.b64decode(first["body"]) == b"legacy hello" and first["packets"] == 3
    dead = php(addr, "consume", "jobs", "1", "dead")
    assert base64.b64decode(json.loads(dead.stdout)["body"]) == b"current hello"
    acked = php(addr, "consume", "jobs", "1", "ack")
    assert base64.b64decode(json.loads(acked.stdout)["body"]) == b"legacy hello", "re-queued to the end"
    stats = wait_until(lambda: (s := srv.stats())["queues"]["jobs"]["depth"] == 0 and s)
    assert stats["queues"]["jobs"]["dead_letters"] == 1
    assert php(addr, "consume", "jobs", "1", "none").returncode == 3, "nothing may be left to dispatch"


def test_phpmq_messages_survive_a_kill_9(process_server, tmp_path):
    dsn, addr = free_tcp_endpoint()
    server = process_server("--phpmq-dsn", dsn)
    sender = Client(addr)
    for i in range(300):
        sender.send(1, (1, b"durable"), (2, b"msg-%d" % i), (5, b"0"))
    wait_until(lambda: server.stats()["queues"].get("durable", {}).get("depth") == 300)
    sender.sock.close()
    server.restart(signal.SIGKILL)
    c = Client(addr)
    c.send(2, (1, b"durable"), (4, b"50"))
    got = []
    while len(got) < 300:
        packets = c.read()[1]
        got.append(packets[2])
        c.send(4, (1, b"durable"), (3, packets[3]))
    assert got == [b"msg-%d" % i for i in range(300)]
    c.sock.close()


def test_connections_past_max_connections_are_closed_at_once_and_others_go_on(phpmq):
    srv, connect, addr = phpmq(max_connections=3)
    kept = [connect() for _ in range(3)]
    for c in kept:
        c.send(1, (1, b"w"), (2, b"x"))  # every one of them is served
    wait_until(lambda: srv.stats()["queues"]["w"]["depth"] == 3)
    extra = socket.create_connection(addr, timeout=5)
    assert extra.recv(10) == b"", "the fourth connection is closed at once"
    extra.close()
    kept[0].sock.close()
    wait_until(lambda: srv.stats()["phpmq"]["connections"] == 2)
    again = connect()
    again.send(1, (1, b"w"), (2, b"y"))
    wait_until(lambda: srv.stats()["queues"]["w"]["depth"] == 4)


def test_unfinished_input_of_all_connections_together_is_bounded(phpmq):
    srv, connect, addr = phpmq(max_partial_input=1 << 20)  # 128 KiB a connection at most

    def head(size: int) -> bytes:
        return b"H0100102P01" + b"%029d" % 1 + b"w" + b"P02" + b"%029d" % size  # then only part of it

    first = connect()
    first.sock.sendall(head(90_000) + b"x" * 60_000)
    wait_until(lambda: srv.stats()["phpmq"]["partial_input_bytes_all"] >= 60_000)
    parked = [connect() for _ in range(9)]
    for other in parked:  # 9 x 120 KB more: over the 1 MiB in all
        other.sock.sendall(head(127_000) + b"y" * 120_000)
    wait_until(lambda: srv.stats()["connections"]["partial_input_closed_total"] == 1)
    assert srv.stats()["phpmq"]["connections"] == 9, "one connection holding the most is closed, not the first"
    first.sock.sendall(b"x" * 30_000)  # the first finishes its message and is served
    wait_until(lambda: srv.stats()["queues"].get("w", {}).get("depth") == 1)
