"""Fair shares of the pools every connection draws on (pzq/endpoints/shares.py), tried over real sockets
as a hostile client would: a flood on one endpoint never takes another endpoint's reserve, and the
client past its share is the one refused or closed, never the honest one."""

from __future__ import annotations

import socket

import pytest
import zmq

from pzq.endpoints.shares import ConnectionLimit
from pzq.protocols.phpmq import encode

from conftest import ended, free_tcp_endpoint, recv, wait_until

pytestmark = pytest.mark.timeout(60)


def test_a_phpmq_and_mqks_flood_leaves_a_native_producer_its_reserve_and_every_refusal_is_counted(make_server, sockets):
    receive, _ = free_tcp_endpoint()
    phpmq, phpmq_addr = free_tcp_endpoint()
    mqks, mqks_addr = free_tcp_endpoint()
    # Three counted endpoints: a quarter of 40 is their reserves (3 each), 31 are shared.
    srv = make_server(receive_dsn=receive, phpmq_dsn=phpmq, mqks_dsn=mqks, max_connections=40)
    assert srv.stats()["connections"]["reserve_per_endpoint"] == 3
    flood = [socket.create_connection(phpmq_addr, timeout=5) for _ in range(38)]
    more: list[socket.socket] = []
    try:
        # (a barrier: once the server counts 4 refused of the 38, it has seen them all and ends no more)
        wait_until(lambda: srv.stats()["connections"]["refused_total"] >= 4)
        assert ended(flood, 5, count=4).count(True) == 4, "PHPMQ holds its reserve and the shared part: 34"
        more += [socket.create_connection(mqks_addr, timeout=5) for _ in range(10)]
        wait_until(lambda: srv.stats()["connections"]["refused_total"] >= 11)
        assert ended(more, 5, count=7).count(True) == 7, "MQKS keeps its reserve of 3"
        stats = srv.stats()
        assert stats["connections"]["refused_total"] == 11
        assert stats["phpmq"]["connections"] == 34 and stats["mqks"]["connections"] == 3
        producer = sockets(zmq.DEALER, receive)  # the native endpoint's reserve is untouched
        producer.send_multipart([b"id-1", b"", b"hello"])
        assert recv(producer) == [b"id-1", b"1", b""]  # stored and acked
        assert srv.stats()["connections"]["refused_total"] == 11
    finally:
        for raw in flood + more:
            raw.close()


def test_an_honest_phpmq_message_is_stored_while_mqks_connections_park_unfinished_lines(make_server):
    phpmq, phpmq_addr = free_tcp_endpoint()
    mqks, mqks_addr = free_tcp_endpoint()
    # 1 MiB in all: 128 KiB a connection, 128 KiB kept for each endpoint, 768 KiB shared.
    srv = make_server(phpmq_dsn=phpmq, mqks_dsn=mqks, max_partial_input=1 << 20)
    parked = [socket.create_connection(mqks_addr, timeout=5) for _ in range(12)]
    try:
        for raw in parked:
            raw.sendall(b"x" * 120_000)  # a line never finished, under one connection's share
        # MQKS may hold its reserve and the shared part (896 KiB: 7 lines); the one holding most goes.
        wait_until(lambda: srv.stats()["connections"]["partial_input_closed_total"] == 5)
        assert ended(parked, 5, count=5).count(True) == 5  # (the server counted 5 closed: no more end)
        assert srv.stats()["mqks"]["partial_input_bytes"] == 7 * 120_000
        honest = socket.create_connection(phpmq_addr, timeout=5)
        message = encode(1, [(1, b"jobs"), (2, b"b" * 100_000)])
        honest.sendall(message[:60_000])  # unfinished for a moment: its endpoint's reserve holds it
        wait_until(lambda: srv.stats()["phpmq"]["partial_input_bytes"] == 60_000)
        honest.sendall(message[60_000:])
        wait_until(lambda: srv.stats()["queues"].get("jobs", {}).get("depth") == 1)
        honest.sendall(encode(1, [(1, b"jobs"), (2, b"again")]))  # still open, still served
        wait_until(lambda: srv.stats()["queues"]["jobs"]["depth"] == 2)
        assert srv.stats()["mqks"]["connections"] == 7, "the parked lines under their shares stay"
        honest.close()
    finally:
        for raw in parked:
            raw.close()


def test_a_connection_holding_more_than_its_share_is_closed_and_the_others_stay(make_server):
    phpmq, phpmq_addr = free_tcp_endpoint()
    mqks, mqks_addr = free_tcp_endpoint()
    srv = make_server(phpmq_dsn=phpmq, mqks_dsn=mqks, max_partial_input=1 << 20)
    # One connection's share: an eighth of 1 MiB, less than one message of 16 MiB (and 64 KiB of slack).
    assert srv.stats()["connections"]["partial_input_per_connection"] == 128 << 10
    honest = socket.create_connection(phpmq_addr, timeout=5)
    greedy = socket.create_connection(mqks_addr, timeout=5)
    try:
        honest.sendall(encode(1, [(1, b"jobs"), (2, b"b" * 60_000)])[:50_000])
        greedy.sendall(b"x" * 200_000)  # a line the pool (1 MiB) would hold, its share does not
        assert ended([greedy], 5) == [True]
        assert srv.stats()["connections"]["partial_input_closed_total"] == 1
        honest.sendall(encode(1, [(1, b"jobs"), (2, b"b" * 60_000)])[50_000:])
        wait_until(lambda: srv.stats()["queues"].get("jobs", {}).get("depth") == 1)
    finally:
        honest.close()
        greedy.close()


class _Gateway:
    """A gateway's one part that ConnectionLimit reads: its connections."""

    def __init__(self) -> None:
        self.sessions: dict[bytes, object] = {}


def test_the_pool_closes_the_largest_holder_past_its_reserve_and_the_grower_on_a_tie():
    closed: list[tuple[str, bytes]] = []
    pool = ConnectionLimit(100, partial_limit=800, message_size=1000)  # 100 a connection, 100 reserved each
    for name in ("phpmq", "mqks"):
        pool.join(name, _Gateway(), lambda conn, name=name: closed.append((name, conn)))
    assert (pool.connection_share, pool.partial_reserve) == (100, 100)
    assert pool.hold("phpmq", b"honest", 60) == []
    for i in range(8):  # mqks: its reserve of 100 and the shared 600
        assert pool.hold("mqks", b"p%d" % i, [100, 100, 100, 100, 100, 90, 100, 10][i]) == []
    assert pool.hold("mqks", b"p8", 10) == [("mqks", b"p0")], "the largest of the endpoint past its reserve"
    assert pool.hold("mqks", b"p9", 100) == [("mqks", b"p9")], "a tie: the one that grew"
    assert pool.hold("phpmq", b"honest", 100) == [], "its own reserve"
    assert pool.hold("mqks", b"big", 101) == [("mqks", b"big")], "over one connection's share"
    assert pool.partial_closed_total == 3 and pool.partial_of("mqks") == 5 * 100 + 90 + 10 + 10
