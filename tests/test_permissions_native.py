"""Permissions on the native sockets: the CURVE handshake admits a key onto the receive socket only if
it may produce to the native queue, and onto the send socket only if it may consume from it; a SIGHUP
that narrows a key cuts its open connections at once."""

from __future__ import annotations

import signal

import pytest
import zmq

from pzq.clients.native import monitor_request
from pzq.curve import secure_client
from pzq.errors import ConfigError, NotPermitted

from conftest import free_tcp_endpoint, recv, wait_until
from permission_keys import ORDERS_PRODUCE_ONLY, handshake, reload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def native(make_server, tenants):
    receive, _ = free_tcp_endpoint()
    send, _ = free_tcp_endpoint()
    srv = make_server(
        receive_dsn=receive,
        send_dsn=send,
        consume_dsn="",
        queue="orders.native",
        unauthenticated="monitor",
        **tenants.config(),
    )
    return srv, receive, send


def client(sockets, kind: int, tenants, name: str) -> zmq.Socket:
    sock = sockets(kind, None)
    secure_client(sock, *tenants.curve(name))
    return sock


def test_a_key_may_connect_to_the_receive_socket_only_if_it_may_produce_to_the_native_queue(
    native,
    tenants,
    sockets,
):
    srv, receive, _ = native
    orders = client(sockets, zmq.DEALER, tenants, "orders")
    assert handshake(orders, receive)
    orders.send_multipart([b"1", b"", b"an order"])
    assert recv(orders) == [b"1", b"1", b""]
    for name in ("payroll", "stranger"):  # payroll's rights name other queues; the stranger has none
        assert not handshake(client(sockets, zmq.DEALER, tenants, name), receive)
    assert srv.stats()["queues"]["orders.native"]["depth"] == 1
    permissions = srv.stats()["permissions"]
    assert permissions["file"] == str(tenants.permissions)
    # (libzmq may retry a refused handshake: at least one refusal each, counted by key name and right)
    assert permissions["refused"]["payroll"]["produce"] >= 1 and permissions["refused"]["stranger"]["produce"] >= 1
    assert "orders" not in permissions["refused"]
    text = monitor_request(srv.monitor)
    assert "permissions.refused.payroll.produce: " in text


def test_a_key_may_connect_to_the_send_socket_only_if_it_may_consume_the_native_queue(
    native,
    tenants,
    sockets,
):
    srv, receive, send = native
    producer = client(sockets, zmq.DEALER, tenants, "orders")
    assert handshake(producer, receive)
    producer.send_multipart([b"1", b"", b"an order"])
    assert recv(producer) == [b"1", b"1", b""]
    payroll = client(sockets, zmq.ROUTER, tenants, "payroll")
    assert not handshake(payroll, send)
    assert not payroll.poll(300), "no delivery reaches a key that may not consume"
    orders = client(sockets, zmq.ROUTER, tenants, "orders")
    assert handshake(orders, send)
    frames = recv(orders)
    assert frames[-1] == b"an order"


def test_a_sighup_that_narrows_a_key_cuts_its_consumer_off_at_once(native, tenants, sockets):
    srv, receive, send = native
    orders = client(sockets, zmq.ROUTER, tenants, "orders")
    assert handshake(orders, send)
    producer = client(sockets, zmq.DEALER, tenants, "orders")
    assert handshake(producer, receive)
    producer.send_multipart([b"1", b"", b"before"])
    assert recv(producer) == [b"1", b"1", b""]
    frames = recv(orders)
    assert frames[-1] == b"before"
    tenants.write(ORDERS_PRODUCE_ONLY)
    reload(srv)
    producer.send_multipart([b"2", b"", b"after"])  # producing is still allowed
    assert recv(producer) == [b"2", b"1", b""]
    assert not orders.poll(1000), "the narrowed key's consumer got a delivery after the SIGHUP"
    wait_until(lambda: srv.stats()["queues"]["orders.native"]["depth"] >= 1)


def test_a_batched_consumer_needs_the_consume_right_at_its_handshake_too(make_server, tenants, sockets):
    consume, _ = free_tcp_endpoint()
    make_server(consume_dsn=consume, queue="orders.native", unauthenticated="monitor", **tenants.config())
    assert not handshake(client(sockets, zmq.DEALER, tenants, "payroll"), consume)
    assert handshake(client(sockets, zmq.DEALER, tenants, "orders"), consume)


def test_a_native_socket_without_keys_needs_the_default_to_grant_its_right_or_the_server_does_not_start(
    tmp_path, tenants
):
    from pzq.server import Server

    from conftest import make_config

    # Without CURVE every native client is keyless: [default] names them, and TENANTS has no [default].
    refused = Server(make_config(tmp_path, queue="orders.native", permissions=str(tenants.permissions)))
    try:
        with pytest.raises(ConfigError, match="--receive-dsn serves clients without a CURVE key"):
            refused.start()
    finally:
        refused.close()
    tenants.write('[default]\nproduce = ["orders.*"]\nconsume = ["orders.*"]\n')
    srv = Server(make_config(tmp_path, queue="orders.native", permissions=str(tenants.permissions)))
    try:
        srv.start()
    finally:
        srv.close()


def test_a_real_sighup_that_narrows_a_key_cuts_its_native_and_batched_consumers_and_the_log_says_so(
    process_server, tenants
):
    from pzq.clients.native import Consumer, Producer
    from pzq.clients.native_consume import BatchConsumer

    srv = process_server(
        "--queue", "orders.native", "--unauthenticated", "monitor",
        "--curve-secret-key", tenants.config()["curve_secret_key"],
        "--curve-clients", tenants.config()["curve_clients"],
    )  # fmt: skip
    assert f"permissions: {tenants.permissions}: 3 key(s)" not in srv.log.read_text()
    assert f"permissions: {tenants.permissions}: 2 key(s), 0 network(s), default nothing" in srv.log.read_text()
    orders = tenants.curve("orders")
    with (
        Producer(srv.receive, curve=orders, timeout_s=5) as producer,
        Consumer(srv.send, curve=orders) as legacy,
        BatchConsumer(srv.consume, curve=orders) as batched,
    ):
        producer.produce([b"one"])
        producer.produce([b"two"])
        got: list = []  # (which consumer gets which is the server's choice)

        def both_delivered() -> bool:
            delivery = legacy.receive(timeout_s=0.05)
            got.extend([delivery.body] if delivery is not None else [])
            got.extend(body for _, body in batched.receive(1, timeout_s=0.05))
            return len(got) == 2

        wait_until(both_delivered)
        assert sorted(got) == [[b"one"], [b"two"]]
        tenants.write(ORDERS_PRODUCE_ONLY)
        srv.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "lost their right: cut off" in srv.log.read_text())
        producer.produce([b"three"])  # still allowed to produce
        try:  # (the send socket is re-bound: its reconnection is refused, which the client may hear first)
            assert legacy.receive(timeout_s=1) is None, "the narrowed key's legacy consumer still gets deliveries"
        except NotPermitted:
            pass
        assert batched.receive(1, timeout_s=1) == [], "the narrowed key's batched consumer still gets deliveries"
    assert srv.stats()["queues"]["orders.native"]["depth"] >= 1
