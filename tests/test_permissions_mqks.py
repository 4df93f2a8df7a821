"""Permissions on the MQKS gateway, per source network (MQKS carries no identity): a connection from
127.0.0.1 has the rights of 127.0.0.0/8 (``orders.*``), one from 127.0.0.2 those of 127.0.0.2/32
(``payroll.*``: the most specific network decides). publish needs produce on the event's name; consume,
ack and reject consume on the queue; rebind and delete_queue manage on it; binding an event (consume's
or rebind's events and --add) consume on the event's name. A refusal is answered ``{id} error {eid}``,
changes nothing and is counted; a SIGHUP that narrows a network closes its consumers' connections."""

from __future__ import annotations

import re
import socket

import pytest

from pzq.broker import Broker
from pzq.clients.mqks import MqksClient
from pzq.clients.sockets import tcp_address
from pzq.clock import Now
from pzq.errors import ClientError
from pzq.gateways.mqks import MqksGateway
from pzq.permissions import Permissions
from pzq.store.bindings import Bindings

from conftest import free_tcp_endpoint, mqks_barrier, wait_until
from permission_keys import networks, reload

pytestmark = pytest.mark.timeout(60)

ORDERS, PAYROLL = "127.0.0.1", "127.0.0.2"  # source addresses: the orders network, the payroll one

NETWORKS = networks(payroll="payroll.*")

ORDERS_PRODUCE_ONLY = NETWORKS.replace('consume = ["orders.*"]\n', "")
ORDERS_NET = "network 127.0.0.0/8"  # the refusal counters' name of the orders network
SALARIES = "pc ok {} event=payroll.paid salaries"  # payroll's consumer gets its publish


@pytest.fixture
def mqks(make_server, tmp_path):
    """(server, connect(source), the permissions file) with MQKS on a free port under NETWORKS."""
    dsn, _ = free_tcp_endpoint()
    path = tmp_path / "permissions.toml"
    path.write_text(NETWORKS)
    srv = make_server(mqks_dsn=dsn, permissions=str(path))
    made: list[MqksClient] = []

    def connect(source: str = ORDERS) -> MqksClient:
        conn = MqksClient(dsn)
        conn.sock.close()  # (the client connects from the default address: reconnect from ``source``)
        conn.sock = socket.create_connection(tcp_address(dsn), timeout=5, source_address=(source, 0))
        made.append(conn)
        return conn

    yield srv, connect, path
    for conn in made:
        conn.close()


def ask(conn: MqksClient, line: str) -> list[str]:
    """Send ``line``; every line the server sends back before a barrier."""
    conn.send(line)
    return mqks_barrier(conn)


def is_error(lines: list[str], request_id: str) -> bool:
    return len(lines) == 1 and re.fullmatch(rf"{request_id} error [0-9a-f]{{24}}", lines[0]) is not None


def queue(srv, name: str) -> dict:
    return srv.stats()["queues"].get(name, {})


def refused(srv) -> dict:
    return srv.stats()["permissions"]["refused"]


def test_a_network_publishes_consumes_settles_rebinds_and_deletes_its_own_queues(mqks):
    srv, connect, _ = mqks
    consumer, producer = connect(), connect()
    assert ask(consumer, "c1 consume --confirm orders.eu orders.created --manual-ack") == ["c1 ok "]
    assert ask(producer, "p1 publish --confirm orders.created first") == ["p1 ok "]
    assert consumer.read_line() == "c1 ok p1 event=orders.created first"
    assert ask(consumer, "r1 reject --confirm c1 p1") == ["r1 ok ", "c1 ok p1 event=orders.created,retry=1 first"]
    assert ask(consumer, "a1 ack --confirm c1 p1") == ["a1 ok "]
    assert ask(producer, "b1 rebind --confirm orders.eu --add orders.paid") == ["b1 ok "]
    assert consumer.read_line() == "c1 ok --update orders.eu orders.created orders.paid --manual-ack"
    assert ask(producer, "d1 delete_queue --confirm orders.eu") == ["d1 ok "]
    assert "orders.eu" not in srv.stats()["queues"]
    assert refused(srv) == {}


def test_publishing_an_event_the_network_may_not_produce_is_refused_and_stores_nothing(mqks):
    srv, connect, _ = mqks
    payroll, orders = connect(PAYROLL), connect()
    assert ask(payroll, "pc consume --confirm payroll.runs payroll.paid") == ["pc ok "]
    assert is_error(ask(orders, "x1 publish --confirm payroll.paid forged"), "x1")
    assert is_error(ask(orders, "x2 publish payroll.paid forged"), "x2"), "answered even without --confirm"
    assert mqks_barrier(payroll) == [], "the refused publish reached payroll's consumer"
    assert queue(srv, "payroll.runs")["depth"] == 0 and srv.stats()["mqks"]["published_total"] == 0
    assert refused(srv) == {ORDERS_NET: {"produce": 2}}


def test_pipelined_lines_are_each_checked_and_a_refused_one_does_not_stop_the_rest(mqks):
    srv, connect, _ = mqks
    orders = connect()
    assert ask(orders, "c1 consume --confirm orders.eu orders.created") == ["c1 ok "]
    orders.write(
        b"p1 publish --confirm orders.created a\n"
        b"x1 publish --confirm payroll.paid b\n"
        b"x2 delete_queue --confirm payroll.runs\n"
        b"p2 publish --confirm orders.created c\n"
    )
    lines = mqks_barrier(orders)
    replies = [line for line in lines if not line.startswith("c1 ")]  # (deliveries may come in between)
    assert replies[0] == "p1 ok " and replies[3:] == ["p2 ok "]
    assert is_error(replies[1:2], "x1") and is_error(replies[2:3], "x2")
    delivered = [line for line in lines if line.startswith("c1 ")]
    assert delivered == ["c1 ok p1 event=orders.created a", "c1 ok p2 event=orders.created c"]
    assert srv.stats()["mqks"]["published_total"] == 2
    assert refused(srv) == {ORDERS_NET: {"produce": 1, "manage": 1}}


def test_consuming_a_queue_the_network_may_not_consume_is_refused_and_registers_nothing(mqks):
    srv, connect, _ = mqks
    payroll, orders = connect(PAYROLL), connect()
    assert ask(payroll, "pp publish --confirm payroll.paid salaries") == ["pp ok "]  # (unbound: dropped)
    assert ask(payroll, "pc consume --confirm payroll.runs payroll.paid") == ["pc ok "]
    assert is_error(ask(orders, "x1 consume --confirm payroll.runs --manual-ack"), "x1")
    assert is_error(ask(orders, "x2 consume payroll.runs orders.created"), "x2")
    assert srv.stats()["mqks"]["consumers"] == 1
    assert ask(payroll, "p2 publish --confirm payroll.paid salaries") == ["p2 ok ", SALARIES.format("p2")]
    assert mqks_barrier(orders) == []
    assert refused(srv) == {ORDERS_NET: {"consume": 2}}


def test_binding_an_event_the_network_may_not_consume_to_its_own_queue_is_refused(mqks):
    srv, connect, _ = mqks
    payroll, orders = connect(PAYROLL), connect()
    assert ask(payroll, "pc consume --confirm payroll.runs payroll.paid") == ["pc ok "]
    bound = srv.stats()["mqks"]["bound_queues"]
    assert is_error(ask(orders, "x1 consume --confirm orders.spy payroll.paid"), "x1")
    assert "orders.spy" not in srv.stats()["queues"], "the refused consume made its queue"
    assert ask(orders, "c1 consume --confirm orders.spy orders.created") == ["c1 ok "]
    assert is_error(ask(orders, "x2 consume --confirm orders.spy --add payroll.paid"), "x2")
    assert is_error(ask(orders, "x3 rebind --confirm orders.spy payroll.paid"), "x3")
    assert is_error(ask(orders, "x4 rebind --confirm orders.spy --add payroll.paid"), "x4")
    # One refused event refuses the whole request: orders.paid is not bound either
    assert is_error(ask(orders, "x5 consume --confirm orders.spy orders.paid payroll.paid"), "x5")
    assert ask(orders, "o1 publish --confirm orders.paid unbound") == ["o1 ok "]
    assert srv.stats()["mqks"]["bound_queues"] == bound + 1
    assert ask(payroll, "p1 publish --confirm payroll.paid salaries") == ["p1 ok ", SALARIES.format("p1")]
    assert mqks_barrier(orders) == [], "payroll's event reached the orders network"
    assert queue(srv, "orders.spy")["depth"] == 0
    assert refused(srv) == {ORDERS_NET: {"consume": 5}}


def test_rebinding_or_deleting_a_queue_the_network_may_not_manage_is_refused_and_changes_nothing(mqks):
    srv, connect, _ = mqks
    payroll, orders = connect(PAYROLL), connect()
    assert ask(payroll, "pc consume --confirm payroll.runs payroll.paid --manual-ack") == ["pc ok "]
    assert ask(payroll, "p1 publish --confirm payroll.paid salaries") == ["p1 ok ", SALARIES.format("p1")]
    assert is_error(ask(orders, "x1 rebind --confirm payroll.runs --remove payroll.paid"), "x1")
    assert is_error(ask(orders, "x2 rebind --confirm payroll.runs orders.created"), "x2")
    assert is_error(ask(orders, "x3 delete_queue --confirm payroll.runs"), "x3")
    assert mqks_barrier(payroll) == [], "payroll's consumer was told of a change"
    figures = queue(srv, "payroll.runs")
    assert (figures["depth"], figures["inflight"]) == (1, 1)
    assert ask(payroll, "a1 ack --confirm pc p1") == ["a1 ok "]
    assert ask(payroll, "p2 publish --confirm payroll.paid more") == ["p2 ok ", "pc ok p2 event=payroll.paid more"]
    assert refused(srv) == {ORDERS_NET: {"manage": 3}}


def test_a_sighup_that_narrows_a_network_closes_its_consumers_and_their_messages_go_back(mqks):
    srv, connect, path = mqks
    consumer, producer = connect(), connect()
    assert ask(consumer, "c1 consume --confirm orders.eu orders.created --manual-ack") == ["c1 ok "]
    assert ask(producer, "p1 publish --confirm orders.created held") == ["p1 ok "]
    assert consumer.read_line() == "c1 ok p1 event=orders.created held"
    path.write_text(ORDERS_PRODUCE_ONLY)
    reload(srv)
    with pytest.raises(ClientError, match="closed"):
        consumer.read_line()
    wait_until(lambda: queue(srv, "orders.eu")["inflight"] == 0 and srv.stats()["mqks"]["consumers"] == 0)
    assert ask(producer, "p2 publish --confirm orders.created after") == ["p2 ok "], "producing still allowed"
    assert queue(srv, "orders.eu")["depth"] == 2
    assert is_error(ask(producer, "c2 consume --confirm orders.eu"), "c2")
    assert refused(srv) == {ORDERS_NET: {"consume": 1}}


def test_a_peer_of_no_listed_network_gets_the_default_rights(make_server, tmp_path):
    dsn, _ = free_tcp_endpoint()
    path = tmp_path / "permissions.toml"
    path.write_text('[default]\nproduce = ["default"]\nconsume = ["default", "public.*"]\n\n[networks."10.0.0.0/8"]\n')
    srv = make_server(mqks_dsn=dsn, permissions=str(path))
    with MqksClient(dsn) as conn:
        assert ask(conn, "c1 consume --confirm public.news public.news") == ["c1 ok "]
        assert is_error(ask(conn, "p1 publish --confirm public.news hello"), "p1"), "[default] has no produce there"
        assert is_error(ask(conn, "c2 consume --confirm orders.eu"), "c2")
    assert refused(srv) == {"default": {"produce": 1, "consume": 1}}


def test_an_ack_or_reject_after_the_rules_narrowed_is_refused_even_before_the_consumer_is_closed(store, tmp_path):
    # (on a server the SIGHUP closes such a consumer at once; the per-request check holds all the same)
    path = tmp_path / "permissions.toml"
    path.write_text(NETWORKS)
    permissions = Permissions(str(path), required=True)
    broker = Broker(store, ack_timeout_s=5)
    gateway = MqksGateway(
        broker, Bindings(store), max_line=1 << 16, window=10, drop_queue=broker.drop_queue, permissions=permissions
    )
    gateway.connected(b"c", "127.0.0.1:4000")
    gateway.received(b"c", b"c1 consume orders.eu orders.created --manual-ack\n", now=Now(0.0, 1))
    gateway.received(b"c", b"p1 publish orders.created held\n", now=Now(0.0, 2))
    assert [s.frames[1] for s in gateway.dispatch(now=Now(0.0, 3))] == [b"c1 ok p1 event=orders.created held\n"]
    path.write_text(ORDERS_PRODUCE_ONLY)
    assert permissions.reload()
    for line in (b"a1 ack --confirm c1 p1\n", b"r1 reject --confirm c1 --all\n"):
        sends = gateway.received(b"c", line, now=Now(0.0, 4))
        assert [s.frames[1].split()[:2] for s in sends] == [[line.split()[0], b"error"]]
    assert broker.held_count(gateway.consumers.get(b"c", "c1").key) == 1, "the message is still held"
    assert gateway.narrowed() == [b"c"]
    assert permissions.stats()["refused"] == {ORDERS_NET: {"consume": 2}}
