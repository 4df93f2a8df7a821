"""Pipelined MQKS lines and the turn budget (issue 26, item 1): a client that writes many lines at once
has them served while the turn's budget lasts and the rest in later turns, in order, while every other
endpoint is served in between; a single rebind's work is capped far under a turn."""

from __future__ import annotations

import dataclasses
import random
import socket
import time
from typing import Any

import pytest

from pzq.clients import native as client
from pzq.config import DEFAULT_LIMITS
from pzq.gateways.mqks_bindings import BindingIndex
from pzq.store.bindings import Binding, Bindings

from conftest import free_tcp_endpoint

pytestmark = pytest.mark.timeout(60)

ZERO = dataclasses.replace(DEFAULT_LIMITS, turn_budget_s=0.0)  # one request a turn: the order of turns shows


def read_lines(conn: socket.socket, count: int) -> list[str]:
    """The next ``count`` lines from a raw MQKS connection (its timeout bounds each read)."""
    reader = READERS.setdefault(conn, conn.makefile("rb"))
    lines = [reader.readline().decode() for _ in range(count)]
    assert all(line.endswith("\n") for line in lines), f"closed before {count} lines came"
    return [line[:-1] for line in lines]


READERS: dict[socket.socket, Any] = {}  # (one buffered reader per connection)


def test_lines_written_at_once_under_a_zero_budget_are_answered_in_order_and_another_connection_between(
    make_server,
):
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=ZERO, hard_sync=False)  # (no fsync a turn)
    port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(b"".join(b"p%d ping %d\n" % (i, i) for i in range(2000)))  # (2,000 turns)
        got = read_lines(conn, 1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as other:
            other.sendall(b"o1 ping other\n")
            assert read_lines(other, 1) == ["o1 ok other"]
            # (read while the first connection's lines waited, and served in turn with them)
            assert srv.stats()["mqks"]["lines_waiting"] > 0, "the other connection waited for the whole flood"
        got += read_lines(conn, 1999)
    assert got == [f"p{i} ok {i}" for i in range(2000)]


def test_a_producer_is_acked_while_a_pipelined_flood_of_lines_still_waits_to_be_served(make_server):
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=ZERO, hard_sync=False)  # (no fsync a turn)
    port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
    hostile = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(2)]
    try:
        for n, conn in enumerate(hostile):
            lines = (b"c%d.%d rebind --confirm q%d e%d.x --remove e%d.x\n" % (n, i, n, i, i) for i in range(1000))
            conn.sendall(b"".join(lines))
        with client.Producer(srv.receive) as producer:
            deadline = time.monotonic() + 10
            while srv.stats()["mqks"]["lines_waiting"] == 0:  # (the flood is read)
                assert time.monotonic() < deadline, "the flood was never read"
            assert producer.produce([b"honest"]).ok
            waiting = srv.stats()["mqks"]["lines_waiting"]
        assert waiting > 0, "the producer's ack came only after every pipelined line was served"
        for n, conn in enumerate(hostile):
            answers = read_lines(conn, 1000)  # (2,000 turns at least, each with its commit)
            assert answers == [f"c{n}.{i} ok " for i in range(1000)], "each line answered once, in order"
    finally:
        for conn in hostile:
            conn.close()


def test_one_rebind_of_a_queue_at_the_event_limit_costs_a_few_milliseconds_or_is_refused(make_server):
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], max_message_size=16 << 20)  # (lines of 2.5 MB below)
    port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
    events = " ".join(f"e{i}.s{i % 97}.t{i % 13}" for i in range(10_000))
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(f"b rebind --confirm q {events}\n".encode())
        assert read_lines(conn, 1) == ["b ok "]
        # Masks without a literal segment look at every bound event: 60 ms a line before the cap
        conn.sendall(b"r1 rebind --confirm q --remove-mask *.*.zz* *.*.zy* *.*.zx* *.*.zw*\n")
        assert read_lines(conn, 1)[0].startswith("r1 error "), "refused as too complex before any work"
        conn.sendall(b"r2 rebind --confirm q --remove-mask e1.*.t* e2.*.t*\n")
        assert read_lines(conn, 1) == ["r2 ok "], "masks with a literal first segment still work"
        # A line of 10,000 events of 250 bytes: parsing it alone would take tens of ms
        long_events = " ".join(f"{i}." + "a" * 240 for i in range(10_000))
        conn.sendall(f"r3 rebind --confirm q {long_events}\nr4 consume --confirm q2 {long_events}\n".encode())
        assert [line.split()[:2] for line in read_lines(conn, 2)] == [["r3", "error"], ["r4", "error"]]
        conn.sendall(b"r5 ping after\n")
        assert read_lines(conn, 1) == ["r5 ok after"]
    assert srv.stats()["mqks"]["bindings"] == 10_000 - 2, "the refused lines changed nothing"


def test_a_binding_edited_a_few_events_at_a_time_stays_sorted_indexed_and_stored_as_one_sorted_anew(store):
    index = BindingIndex(Bindings(store), DEFAULT_LIMITS)
    rng = random.Random(26)
    events = {f"e{i}.x" for i in range(2000)}
    index.set("q", Binding(list(events)), save=True)
    for _ in range(200):
        gone = set(rng.sample(sorted(events), rng.randint(0, 3)))
        added = {f"n{rng.randint(0, 10_000)}.y" for _ in range(rng.randint(0, 3))}
        changed = index.set("q", Binding([*(events - gone), *added, *added]), save=True)
        assert changed == bool(gone - added or added - events)
        events = (events - gone) | added
        assert list(index.get("q").events) == sorted(events)
        assert index.bound_total == len(events)
    assert {e for e in index.by_event if "q" in index.queues_for(e)} == events
    assert list(BindingIndex(Bindings(store), DEFAULT_LIMITS).get("q").events) == sorted(events), "as stored"
