"""Fair shares of the pools every connection draws on (pzq/endpoints/shares.py), tried over real sockets
as a hostile client would: a flood on one endpoint never takes another endpoint's reserve, and the
client past its share is the one refused or closed, never the honest one."""

from __future__ import annotations

import socket

import pytest
import zmq

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
        assert ended(flood, 2).count(True) == 4, "PHPMQ holds its reserve and the shared part: 34"
        more += [socket.create_connection(mqks_addr, timeout=5) for _ in range(10)]
        assert ended(more, 2).count(True) == 7, "MQKS keeps its reserve of 3"
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
        assert ended(parked, 0.5).count(True) == 5
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
