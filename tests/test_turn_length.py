"""The length of a whole turn (issue 26): the commit and the flush that follow a turn's work cost what
the work touched, which the budget's clock does not see, so a turn also counts records
(``Limits.turn_records``): deliveries, take-backs, ack timeouts and requests. These tests give the turn an
hour of clock, so only the counts can stop it, and run the turns themselves."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import time

import zmq

from pzq.config import DEFAULT_LIMITS
from pzq.endpoints.base import TurnBudget
from pzq.protocols import native as wire
from pzq.server import Server
from pzq.server.collector import Collector

from conftest import make_config

_inproc = itertools.count()


def _server(tmp_path, **overrides) -> tuple[Server, str, str]:
    """A started server on inproc endpoints whose turns the test runs (``_turn``)."""
    n = next(_inproc)
    receive, send = f"inproc://turnl-receive-{n}", f"inproc://turnl-send-{n}"
    cfg = make_config(
        tmp_path, receive_dsn=receive, send_dsn=send, monitor_dsn=f"inproc://turnl-monitor-{n}", **overrides
    )
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    return server, receive, send


def _socket(kind: int, endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(endpoint)
    return sock


def _drain(sock: zmq.Socket, timeout_ms: int = 0) -> int:
    got = 0
    while sock.poll(timeout_ms if not got else 0):
        sock.recv_multipart()
        got += 1
    return got


def test_a_budget_counts_records_and_gives_a_run_no_more_than_the_turn_has_left():
    budget = TurnBudget.start(3600.0, 1 << 30, 300)
    assert budget.records_for(128) == 128, "the first run of a turn: a whole chunk"
    budget.take(records=250)
    assert budget.records_for(128) == 50, "no more than the records left"
    budget.take(records=50)
    assert budget.spent() and budget.records_for(128) == 0, "the turn's records are used up"
    empty = TurnBudget.start(3600.0, 1 << 30, 0)
    assert empty.records_for(128) == 1, "a turn's first work always goes through"


def test_no_turn_touches_more_records_than_its_share_beside_a_consumer_that_never_acks(tmp_path):
    # Hostile: a producer pipelines 3,000 messages, a consumer takes every delivery and never acks, and
    # the credit (max_inflight 2,000) would hand out 2,000 in one dispatch, then time them all out at once.
    limits = dataclasses.replace(DEFAULT_LIMITS, turn_budget_s=3600.0, turn_records=300, turn_chunk=64)
    server, receive, send = _server(tmp_path, limits=limits, max_inflight=2000, ack_timeout=0.3)
    producer, consumer = _socket(zmq.DEALER, receive), _socket(zmq.DEALER, send)
    counters = server.broker.counters
    per_turn: list[tuple[int, int, int]] = []
    try:
        for i in range(3000):
            producer.send_multipart(wire.produce(b"%d" % i, [b"x" * 100]))
        taken_back_by = time.monotonic() + 10
        while time.monotonic() < taken_back_by and counters.expired < 3000:
            before = (counters.produced, counters.delivered, counters.expired)
            server._turn(0)
            per_turn.append(
                (counters.produced - before[0], counters.delivered - before[1], counters.expired - before[2])
            )
            _drain(producer)
            _drain(consumer, timeout_ms=5)  # (read, never acked: their ack timeouts pass as the turns go)
        assert counters.produced == 3000, "every message stored"
        assert counters.expired >= 3000, "every delivery timed out (or was taken back) and went back"
        records = [sum(turn) for turn in per_turn]
        assert max(records) <= 300, f"a turn stored, delivered and timed out {max(records)} (the share is 300)"
        assert max(d for _, d, _ in per_turn) >= 200, "the share is what stopped the dispatch (credit was 2,000)"
        assert max(e for _, _, e in per_turn) >= 200, "and what stopped the ack timeouts"
    finally:
        producer.close(0)
        consumer.close(0)
        server.close()


def test_the_collector_freezes_what_survives_a_full_collection_and_walks_everything_when_due():
    collector = Collector(whole_s=3600.0)
    collector.start(now=0.0)
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0, "what start-up made is frozen"
        kept = [[i] for i in range(10_000)]  # (long-lived objects made while serving)
        gc.collect()  # a full collection, as the interpreter runs one by itself
        collector.turn_ends(now=1.0)
        assert gc.get_freeze_count() >= frozen + len(kept), "what survived it is frozen after the turn"
        collector.turn_ends(now=3600.0)
        assert collector.whole_total == 1, "everything walked once its time came"
        assert gc.get_freeze_count() >= len(kept), "and frozen again"
    finally:
        collector.stop()
    assert gc.get_freeze_count() == 0, "a stopped collector leaves nothing frozen"
