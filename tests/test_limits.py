"""Limits of a real server process: oversized messages are refused before they are buffered, whatever
the protocol, and a consumer that stops reading does not make the server's memory grow."""

from __future__ import annotations

import socket

import pytest
import zmq

from pzq.clients import native as client
from pzq.clients.api import ApiClient

from conftest import start_every_gateway, wait_until

pytestmark = pytest.mark.timeout(120)
LIMIT = "1M"
HUGE = 40 << 20  # what a hostile client sends: 40 times the limit


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):  # private memory: LMDB's mapped file pages are the kernel's
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def closed_by_server(raw: socket.socket, more: bytes) -> bool:
    """Send ``more`` (the server may close midway), then True if the server closed the connection."""
    try:
        raw.sendall(more)
        return raw.recv(100) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_oversized_messages_are_refused_before_buffering_in_every_protocol(process_server, tmp_path):
    every = start_every_gateway(process_server, tmp_path, "--max-message-size", LIMIT)
    srv, phpmq_addr, mqks_addr, front, api_dsn = every.server, every.phpmq, every.mqks, every.emqp_front, every.api
    before = rss_mb(srv.proc.pid)
    ctx = zmq.Context.instance()
    for endpoint, frames in (
        (srv.receive, [b"1", b"", b"x" * HUGE]),
        (api_dsn, [b"", b"1", b"PRODUCE", b"x" * HUGE]),
        (front, [b"", b"eMQP/1.0", b"REQUEST", b"m1", b"q", b"", b"x" * HUGE]),
    ):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # The server's answer is to drop the connection: the socket's monitor says when, instead of
        # a wait for silence. Nothing sent before the drop can still be on its way after it.
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            sock.connect(endpoint)
            sock.send_multipart(frames)  # libzmq drops the connection at the announced size (ZMQ_MAXMSGSIZE)
            assert monitor.poll(10_000), f"the connection to {endpoint} was not dropped within 10 s"
            assert not sock.poll(0), f"an oversized message to {endpoint} was answered: {sock.recv_multipart()[:4]}"
        finally:
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
    # PHPMQ: a packet header announcing a huge content closes the connection before any content is read.
    with socket.create_connection(phpmq_addr, timeout=5) as raw:
        raw.sendall(b"H0100102" + b"P01" + b"%032d" % 1 + b"q" + b"P02" + b"%032d" % 10**12)
        assert closed_by_server(raw, b"x" * (1 << 20))
    # MQKS: a line without an end, longer than the limit, closes the connection.
    with socket.create_connection(mqks_addr, timeout=5) as raw:
        assert closed_by_server(raw, b"x1 publish e " + b"y" * (3 << 20))
    assert "messages:" in client.monitor_request(srv.monitor)
    assert rss_mb(srv.proc.pid) - before < 30, "oversized input was buffered"
    with ApiClient(api_dsn, timeout_s=10) as api:
        assert api.produce([("q", b"still fine")])["count"] == 1


def test_a_consumer_that_stops_reading_does_not_grow_the_servers_memory(process_server, capsys):
    srv = process_server("--max-inflight", "1000")
    stalled = zmq.Context.instance().socket(zmq.ROUTER)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.RCVHWM, 10)
    stalled.connect(srv.send)  # connects, never reads
    body = b"z" * 1024
    with client.Producer(srv.receive) as producer:
        producer.produce_many(([body] for _ in range(2000)), window=200)
        start = rss_mb(srv.proc.pid)
        for _ in range(20):  # 100 MB more through a server whose only consumer is stalled
            results = producer.produce_many(([body] for _ in range(5000)), window=200)
            assert all(r.ok for r in results)
    wait_until(lambda: srv.stats()["messages"] == 102_000, timeout_s=30)
    end = rss_mb(srv.proc.pid)
    with capsys.disabled():
        print(f"\nstalled consumer: server RSS {start:.1f} MB -> {end:.1f} MB with 100 MB more stored")
    assert end - start < 40
    stalled.close(0)


def test_a_message_of_a_million_empty_frames_is_dropped_answered_and_honest_producers_go_on(server, caplog):
    import logging

    from pzq.protocols.native import TOO_MANY_FRAMES

    hostile = zmq.Context.instance().socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.connect(server.receive)
    try:
        with caplog.at_level(logging.WARNING):
            hostile.send_multipart([b"m1", b""] + [b""] * 1_000_000)
            with client.Producer(server.receive) as producer:
                assert producer.produce([b"honest"]).ok
            assert hostile.poll(20_000), "answered once its frames are drained"
            answer = hostile.recv_multipart()
            assert answer == [b"m1", b"0", b"", TOO_MANY_FRAMES.format(limit=1024, sent=1023).encode()]
            assert "too-many-frames" in caplog.text
        stats = server.stats()
        assert stats["messages"] == 1 and stats["produced_total"] == 1
    finally:
        hostile.close()
