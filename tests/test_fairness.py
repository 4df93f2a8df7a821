"""Native consumers share the send socket's DEALER, which cannot tell them apart: a consumer that reads
without acking must not starve the honest ones, and a lone slow consumer still gets at most
--max-inflight at once."""

from __future__ import annotations

import time

import zmq

from pzq.clients import native as client
from pzq.credit import HOARD, MIN_WINDOW_S, NativeCredit

from conftest import wait_connected


def test_young_deliveries_count_while_acks_flow_and_all_count_when_none_do():
    credit = NativeCredit(max_inflight=10, ack_timeout_s=5.0)
    for i in range(10):
        credit.sent(i, now=0.0)
    assert credit.available(0.0, held=10) == 0
    assert credit.available(1.0, held=10) == 0, "nobody answered: a plain pool, old or not"
    credit.answered(0, sent_at=0.0, now=1.0)  # someone answers: the others' old deliveries stop blocking
    assert credit.available(1.0, held=9) == 10
    for i in range(10, 10 + HOARD * 10):
        credit.sent(i, now=2.0)
    assert credit.overdue(held=9 + HOARD * 10, holds=lambda ref: ref != 0)[:3] == [1, 2, 3]


def test_an_honest_consumer_is_not_starved_by_one_that_reads_without_acking(make_server, sockets):
    server = make_server(max_inflight=100, ack_timeout=30.0)
    greedy = wait_connected(sockets(zmq.ROUTER, None), server.send)
    honest = wait_connected(sockets(zmq.ROUTER, None), server.send)
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"m%d" % i] for i in range(5000)]))
    got, deadline = 0, time.monotonic() + 10
    while got < 2000 and time.monotonic() < deadline:
        if honest.poll(100):
            frames = honest.recv_multipart()
            honest.send_multipart([frames[0], frames[1], b"1"])
            got += 1
        while greedy.poll(0):
            greedy.recv_multipart()  # reads, never acks
    # One plain pool of 100 would have given the honest consumer about 50 before the greedy one held
    # all of it for the 30 s ack timeout.
    assert got >= 2000, f"the honest consumer got {got} messages in 10 s"
    assert server.stats()["messages_inflight"] <= HOARD * 100
    assert MIN_WINDOW_S <= server.stats()["native"]["consumer_window_ms"] / 1000 <= 30
