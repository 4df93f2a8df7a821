"""Raw-TCP peers that read nothing (PHPMQ, MQKS; r10-hostile-tcp): once the deliveries they were handed
have gone back at their ack timeout, a connection whose peer acknowledges none of the bytes waiting for
it for ``stuck_reader_s`` is closed, so that what it was charged is released; one that reads, however
slowly, and one that still holds deliveries in time, are left alone. (14 PHPMQ consumers that read
nothing had held the memory bound's whole room for deliveries for good, and every other consumer was
handed one message at a time.)"""

from __future__ import annotations

import dataclasses
import socket
import time

import pytest

from pzq.clients import native as client
from pzq.config import DEFAULT_LIMITS
from pzq.protocols.phpmq import encode

from conftest import free_tcp_endpoint, wait_until

pytestmark = pytest.mark.timeout(60)

KIB = 1 << 10
LIMITS = dataclasses.replace(DEFAULT_LIMITS, delivery_share=256 * KIB, stuck_reader_s=0.5, stuck_check_s=0.1)
BODY = b"b" * (64 * KIB)


def deaf_socket(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KIB)  # (a reader that never reads: little room)
    sock.connect(("127.0.0.1", port))
    return sock


def produce(srv, count: int) -> None:
    with client.Producer(srv.receive) as producer:
        for _ in range(count):
            assert producer.produce([BODY]).ok


@pytest.mark.parametrize("door", ["phpmq", "mqks"])
def test_a_peer_that_reads_nothing_is_closed_once_its_deliveries_went_back_and_what_it_held_is_released(
    make_server, door
):
    dsn = free_tcp_endpoint()[0]
    srv = make_server(queue="q", limits=LIMITS, ack_timeout=0.5, **{f"{door}_dsn": dsn})
    produce(srv, 40)  # (2.5 MiB: ten times its share)
    deaf = deaf_socket(int(dsn.rsplit(":", 1)[1]))
    if door == "phpmq":
        deaf.sendall(encode(2, [(1, b"q"), (4, b"1000")]))
    else:
        deaf.sendall(b"c1 consume q --manual-ack\n")
    wait_until(lambda: srv.stats()["memory"]["deliveries_bytes"] >= 256 * KIB, 10)
    wait_until(lambda: srv.stats()[door]["connections"] == 0, 20)
    assert srv.stats()[door]["stuck_readers_cut_total"] == 1
    wait_until(lambda: srv.stats()["memory"]["deliveries_bytes"] == 0, 10)
    assert srv.stats()["queues"]["q"]["depth"] == 40, "nothing it was handed is lost"
    deaf.close()


def test_a_peer_that_reads_slowly_or_holds_deliveries_within_their_ack_timeout_is_not_closed(make_server):
    dsn = free_tcp_endpoint()[0]
    # (a quarter of a second stuck is cut: watched for four times that, the slow reader reading 5 times as often)
    limits = dataclasses.replace(LIMITS, stuck_reader_s=0.25, stuck_check_s=0.05)
    srv = make_server(queue="q", limits=limits, ack_timeout=30.0, phpmq_dsn=dsn)
    produce(srv, 40)
    port = int(dsn.rsplit(":", 1)[1])
    holder, slow = deaf_socket(port), deaf_socket(port)
    holder.sendall(encode(2, [(1, b"q"), (4, b"1000")]))  # (reads nothing, its deliveries still in time)
    slow.sendall(encode(2, [(1, b"q"), (4, b"1000")]))
    got = 0
    deadline = time.monotonic() + 1  # (four times stuck_reader_s)
    while time.monotonic() < deadline:
        slow.settimeout(1)
        got += len(slow.recv(2 * KIB))  # (a few KiB a twentieth of a second: far slower than it is sent)
        time.sleep(0.05)
    assert got > 0
    assert srv.stats()["phpmq"]["connections"] == 2 and srv.stats()["phpmq"]["stuck_readers_cut_total"] == 0
    holder.close()
    slow.close()
