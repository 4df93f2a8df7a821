"""Permissions on the eMQP PUB socket: it hands every topic to every subscriber, so it admits at its
CURVE handshake only keys that may consume every topic, and a SIGHUP that takes that right away cuts
the subscriber off at once (the socket is re-bound, as on a revocation)."""

from __future__ import annotations

import time
import uuid

import pytest
import zmq

from pzq.curve import secure_client

from conftest import free_tcp_endpoint
from permission_keys import TENANTS, handshake, reload

pytestmark = pytest.mark.timeout(60)
V = b"eMQP/1.0"
WATCHER = TENANTS + '\n[keys.stranger]\nconsume = ["*"]\n'  # the stranger may read every topic


@pytest.fixture
def publishing(make_server, tenants):
    front, _ = free_tcp_endpoint()
    back, _ = free_tcp_endpoint()
    pub, _ = free_tcp_endpoint()
    tenants.write(WATCHER)
    srv = make_server(
        emqp_frontend_dsn=front, emqp_backend_dsn=back, emqp_publish_dsn=pub, unauthenticated="monitor",
        **tenants.config(),
    )  # fmt: skip
    return srv, front, pub


def curve_socket(sockets, kind: int, tenants, name: str) -> zmq.Socket:
    sock = sockets(kind, None)
    secure_client(sock, *tenants.curve(name))
    return sock


def published(publisher: zmq.Socket, sub: zmq.Socket, topic: bytes, timeout_s: float = 5.0) -> list[bytes] | None:
    """Publish until ``sub`` hears it (a SUB learns of its subscription asynchronously); None if it never does.
    Only what this call published counts: one an earlier call sent may still be on its way (a busy machine)."""
    deadline, sent = time.monotonic() + timeout_s, set()
    while time.monotonic() < deadline:
        body = b'{"x": "%s"}' % str(uuid.uuid4()).encode()
        sent.add(body)
        publisher.send_multipart([b"", V, b"PUBLISH", str(uuid.uuid4()).encode(), topic, body])
        if sub.poll(100) and (got := sub.recv_multipart())[-1] in sent:
            return got
    return None


def test_a_key_that_may_not_consume_every_topic_cannot_subscribe(publishing, tenants, sockets):
    srv, front, pub = publishing
    orders = curve_socket(sockets, zmq.SUB, tenants, "orders")  # orders.* only: not every topic
    orders.setsockopt(zmq.SUBSCRIBE, b"")
    assert not handshake(orders, pub)
    watcher = curve_socket(sockets, zmq.SUB, tenants, "stranger")
    watcher.setsockopt(zmq.SUBSCRIBE, b"orders.")
    assert handshake(watcher, pub)
    publisher = curve_socket(sockets, zmq.DEALER, tenants, "orders")
    assert handshake(publisher, front)
    got = published(publisher, watcher, b"orders.news")
    assert got is not None and got[0] == b"orders.news" and got[1].startswith(b'{"x": "')
    assert not orders.poll(0)
    assert srv.stats()["permissions"]["refused"]["orders"]["consume"] >= 1


def test_a_sighup_that_takes_the_right_away_cuts_the_subscriber_off_at_once(publishing, tenants, sockets):
    srv, front, pub = publishing
    watcher = curve_socket(sockets, zmq.SUB, tenants, "stranger")
    watcher.setsockopt(zmq.SUBSCRIBE, b"orders.")
    assert handshake(watcher, pub)
    publisher = curve_socket(sockets, zmq.DEALER, tenants, "orders")
    assert handshake(publisher, front)
    assert published(publisher, watcher, b"orders.news") is not None
    tenants.write(TENANTS)
    reload(srv)
    assert published(publisher, watcher, b"orders.news", timeout_s=1.5) is None
