"""Permissions on the native sockets: the CURVE handshake admits a key onto the receive socket only if
it may produce to the native queue, and onto the send socket only if it may consume from it; a SIGHUP
that narrows a key cuts its open connections at once."""

from __future__ import annotations

import pytest
import zmq

from pzq.curve import secure_client

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
    refused = srv.stats()["permissions"]
    assert refused["file"] == str(tenants.permissions)


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
