"""Connections libzmq accepts on the ZeroMQ endpoints count toward --max-connections: a flood of idle
ones is cut off at once, the server keeps serving, and each endpoint leaves the others room."""

from __future__ import annotations

import socket

import pytest
import zmq

from conftest import ended, free_tcp_endpoint, recv, wait_until

pytestmark = pytest.mark.timeout(60)


def test_idle_zeromq_connections_past_the_limit_are_closed_and_the_server_serves_on(make_server, sockets):
    endpoint, addr = free_tcp_endpoint()
    srv = make_server(receive_dsn=endpoint, max_connections=10)  # one endpoint may hold 9 of them
    flood = [socket.create_connection(addr, timeout=5) for _ in range(15)]
    try:
        # (a barrier: once the server counts 6 refused of the 15, it has seen them all and ends no more)
        wait_until(lambda: srv.stats()["connections"]["refused_total"] >= 6)
        cut = ended(flood, 5, count=6)
        assert cut.count(False) == 9, cut
        stats = srv.stats()  # the monitor (another endpoint) is still reachable
        assert stats["connections"]["refused_total"] == 6
        for raw in flood[:3]:
            raw.close()
        wait_until(lambda: srv.stats()["connections"]["open"] <= 7)
        producer = sockets(zmq.DEALER, endpoint)  # room again: a real producer is served
        producer.send_multipart([b"id-1", b"", b"hello"])
        assert recv(producer) == [b"id-1", b"1", b""]  # stored and acked
        wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == 1)
    finally:
        for raw in flood:
            raw.close()


def test_closed_connections_are_counted_out(make_server):
    endpoint, addr = free_tcp_endpoint()
    srv = make_server(receive_dsn=endpoint, max_connections=10)
    for _ in range(5):  # 45 connections made and closed, never more than 9 at once
        batch = [socket.create_connection(addr, timeout=5) for _ in range(9)]
        wait_until(lambda: (c := srv.stats()["connections"])["open"] >= 9 or c["refused_total"])
        assert srv.stats()["connections"]["refused_total"] == 0 and not any(ended(batch, 0))
        for raw in batch:
            raw.close()
        wait_until(lambda: srv.stats()["connections"]["open"] <= 1)
    assert srv.stats()["connections"]["refused_total"] == 0
