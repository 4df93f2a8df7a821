"""Permissions on the PHPMQ gateway, per source network (PHPMQ carries no identity): a connection from
127.0.0.1 has the rights of 127.0.0.0/8 (``orders.*``), one from 127.0.0.2 those of 127.0.0.2/32
(``payroll``: the most specific network decides). Sending needs produce, consuming and settling
(ack, re-queue, dead letter) consume; a refusal closes the connection (PHPMQ has no error message),
applies nothing of the request and is counted; a SIGHUP that narrows a network closes its consumers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pzq.protocols.phpmq import encode

import test_phpmq
from conftest import free_tcp_endpoint, wait_until
from permission_keys import networks, reload

pytestmark = pytest.mark.timeout(60)

PHP_CLIENT = Path(__file__).parent / "php" / "phpmq_client.php"
ORDERS, PAYROLL = "127.0.0.1", "127.0.0.2"  # source addresses: the orders network, the payroll one
SEND, CONSUME, ACK, REQUEUE, DEAD = 1, 2, 4, 5, 6
QUEUE, CONTENT, ID, COUNT = 1, 2, 3, 4

NETWORKS = networks(payroll="payroll")

ORDERS_PRODUCE_ONLY = NETWORKS.replace('consume = ["orders.*"]\n', "")
ORDERS_NET = "network 127.0.0.0/8"  # the refusal counters' name of the orders network


class Client(test_phpmq.Client):
    """test_phpmq's client, from a chosen source address, reading a message's packets alone."""

    def read(self, timeout: float = 5.0) -> dict[int, bytes]:  # type: ignore[override]
        """The packets of the next message."""
        head = self._need(8, timeout)
        packets = {}
        for _ in range(int(head[6:8])):
            ph = self._need(32, timeout)
            packets[int(ph[1:3])] = self._need(int(ph[3:]), timeout)
        return packets

    def closed(self, timeout: float = 5.0) -> bool:
        """True once the server closed the connection (nothing else arrives before); False on a message."""
        try:
            self.read(timeout)
        except EOFError:
            return True
        return False


@pytest.fixture
def phpmq(make_server, tmp_path):
    """(server, connect(source), addr) with PHPMQ on a free port and the NETWORKS permissions file."""
    dsn, addr = free_tcp_endpoint()
    path = tmp_path / "permissions.toml"
    path.write_text(NETWORKS)
    srv = make_server(phpmq_dsn=dsn, permissions=str(path))
    made: list[Client] = []

    def connect(source: str = ORDERS) -> Client:
        made.append(Client(addr, source))
        return made[-1]

    yield srv, connect, addr, path
    for c in made:
        c.sock.close()


def depth(srv, queue: str) -> int | None:
    return srv.stats()["queues"].get(queue, {}).get("depth")


def refused(srv) -> dict:
    return srv.stats()["permissions"]["refused"]


def test_a_network_sends_to_consumes_and_settles_the_queues_it_is_allowed(phpmq):
    srv, connect, _, _ = phpmq
    producer = connect()
    for body in (b"ack me", b"requeue me", b"dead-letter me"):
        producer.send(SEND, (QUEUE, b"orders.eu"), (CONTENT, body))
    wait_until(lambda: depth(srv, "orders.eu") == 3)
    consumer = connect()
    consumer.send(CONSUME, (QUEUE, b"orders.eu"), (COUNT, b"3"))
    got = [consumer.read() for _ in range(3)]
    assert [p[CONTENT] for p in got] == [b"ack me", b"requeue me", b"dead-letter me"]
    consumer.send(ACK, (QUEUE, b"orders.eu"), (ID, got[0][ID]))
    consumer.send(REQUEUE, (QUEUE, b"orders.eu"), (ID, got[1][ID]))
    consumer.send(DEAD, (QUEUE, b"orders.eu"), (ID, got[2][ID]))
    assert consumer.read()[CONTENT] == b"requeue me", "re-queued, then handed out again"
    wait_until(lambda: srv.stats()["queues"]["orders.eu"]["dead_letters"] == 1)
    assert refused(srv) == {}


def test_sending_to_a_queue_the_network_may_not_produce_to_closes_the_connection_and_stores_nothing(phpmq):
    srv, connect, _, _ = phpmq
    orders = connect()
    # One write: the allowed send before the refused one is applied, nothing after it
    orders.sock.sendall(
        encode(SEND, [(QUEUE, b"orders.eu"), (CONTENT, b"before")])
        + encode(SEND, [(QUEUE, b"payroll"), (CONTENT, b"a forged salary")])
        + encode(SEND, [(QUEUE, b"orders.eu"), (CONTENT, b"after")])
    )
    assert orders.closed()
    assert depth(srv, "orders.eu") == 1
    assert depth(srv, "payroll") is None, "the refused send made no queue"
    assert refused(srv) == {ORDERS_NET: {"produce": 1}}
    stranger = connect(PAYROLL)  # (127.0.0.2 is in 127.0.0.0/8 too: the most specific network decides)
    stranger.send(SEND, (QUEUE, b"orders.eu"), (CONTENT, b"from payroll"))
    assert stranger.closed()
    assert depth(srv, "orders.eu") == 1


def test_consuming_a_queue_the_network_may_not_consume_closes_the_connection_and_delivers_nothing(phpmq):
    srv, connect, _, _ = phpmq
    payroll = connect(PAYROLL)
    payroll.send(SEND, (QUEUE, b"payroll"), (CONTENT, b"salaries"))
    wait_until(lambda: depth(srv, "payroll") == 1)
    orders = connect()
    orders.send(CONSUME, (QUEUE, b"payroll"), (COUNT, b"10"))
    assert orders.closed(), "the refused consumer got a message or was left open"
    assert srv.stats()["phpmq"]["consumers"] == 0
    assert srv.stats()["queues"]["payroll"]["inflight"] == 0
    assert refused(srv) == {ORDERS_NET: {"consume": 1}}
    reader = connect(PAYROLL)
    reader.send(CONSUME, (QUEUE, b"payroll"), (COUNT, b"1"))
    assert reader.read()[CONTENT] == b"salaries"


@pytest.mark.parametrize("kind", [ACK, REQUEUE, DEAD], ids=["ack", "requeue", "dead-letter"])
def test_settling_a_message_of_a_queue_the_network_may_not_consume_is_refused_and_changes_nothing(phpmq, kind):
    srv, connect, _, _ = phpmq
    payroll = connect(PAYROLL)
    payroll.send(SEND, (QUEUE, b"payroll"), (CONTENT, b"salaries"))
    payroll.send(CONSUME, (QUEUE, b"payroll"), (COUNT, b"1"))
    held = payroll.read()
    orders = connect()
    orders.send(kind, (QUEUE, b"payroll"), (ID, held[ID]))
    assert orders.closed()
    stats = srv.stats()
    assert stats["queues"]["payroll"]["inflight"] == 1 and stats["queues"]["payroll"]["dead_letters"] == 0
    assert refused(srv) == {ORDERS_NET: {"consume": 1}}
    payroll.send(ACK, (QUEUE, b"payroll"), (ID, held[ID]))  # still its holder's to settle
    wait_until(lambda: depth(srv, "payroll") == 0)


def test_a_sighup_that_narrows_a_network_closes_its_consumers_at_once(phpmq):
    srv, connect, _, path = phpmq
    producer, consumer = connect(), connect()
    producer.send(SEND, (QUEUE, b"orders.eu"), (CONTENT, b"before"))
    consumer.send(CONSUME, (QUEUE, b"orders.eu"), (COUNT, b"1"))
    assert consumer.read()[CONTENT] == b"before"
    path.write_text(ORDERS_PRODUCE_ONLY)
    reload(srv)
    assert consumer.closed(), "the narrowed network's consumer was left open"
    wait_until(lambda: srv.stats()["queues"]["orders.eu"]["inflight"] == 0)  # what it held went back
    producer.send(SEND, (QUEUE, b"orders.eu"), (CONTENT, b"after"))  # producing is still allowed
    wait_until(lambda: depth(srv, "orders.eu") == 2)
    again = connect()
    again.send(CONSUME, (QUEUE, b"orders.eu"), (COUNT, b"1"))
    assert again.closed()
    assert refused(srv) == {ORDERS_NET: {"consume": 1}}


def test_a_peer_of_no_listed_network_gets_the_default_rights(make_server, tmp_path):
    dsn, addr = free_tcp_endpoint()
    path = tmp_path / "permissions.toml"
    path.write_text('[default]\nproduce = ["default", "public.*"]\nconsume = ["default"]\n\n[networks."10.0.0.0/8"]\n')
    srv = make_server(phpmq_dsn=dsn, permissions=str(path))
    allowed, refused_one = Client(addr, ORDERS), Client(addr, ORDERS)
    try:
        allowed.send(SEND, (QUEUE, b"public.news"), (CONTENT, b"hello"))
        wait_until(lambda: depth(srv, "public.news") == 1)
        refused_one.send(SEND, (QUEUE, b"orders.eu"), (CONTENT, b"hello"))
        assert refused_one.closed()
        assert depth(srv, "orders.eu") is None
        assert refused(srv) == {"default": {"produce": 1}}
    finally:
        allowed.sock.close()
        refused_one.sock.close()


def php(addr, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["php", str(PHP_CLIENT), addr[0], str(addr[1]), *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.slow  # (a PHP runtime per run)
def test_a_real_php_client_is_served_on_its_networks_queues_and_sees_the_connection_closed_elsewhere(phpmq):
    srv, connect, addr, _ = phpmq
    assert php(addr, "send", "orders.eu", "hello", "0").returncode == 0
    acked = php(addr, "consume", "orders.eu", "1", "ack")
    assert acked.returncode == 0, acked.stderr
    assert json.loads(acked.stdout)["queue"] == "orders.eu"
    payroll = connect(PAYROLL)
    payroll.send(SEND, (QUEUE, b"payroll"), (CONTENT, b"salaries"))
    wait_until(lambda: depth(srv, "payroll") == 1)
    refused_consume = php(addr, "consume", "payroll", "1", "ack")
    assert refused_consume.returncode == 4 and "connection closed" in refused_consume.stderr
    assert depth(srv, "payroll") == 1 and depth(srv, "orders.eu") == 0
