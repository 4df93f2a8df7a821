"""The monitor's admin reads over a real server on real sockets, as the console process and the CLI use
them: STATS's new figures, QUEUE with its consumers, PEEK and DEAD paged by after-id, CLIENTS paged
with each raw-TCP connection's peer address; and what a hostile client sends them."""

from __future__ import annotations

import base64
import json
import re
import socket
import time

import pytest
import zmq

from pzq.clients import native as client
from pzq.clients.mqks import MqksClient
from pzq.protocols.phpmq import encode

from admin_asks import ask, produce, refusal
from conftest import free_tcp_endpoint, recv, wait_until

pytestmark = pytest.mark.timeout(120)


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def raw(srv, frames: list[bytes], sockets) -> str:
    """One request of any frames over a bare REQ socket: the reply's text."""
    sock = sockets(zmq.REQ, srv.monitor)
    sock.send_multipart(frames)
    return recv(sock, 10_000)[0].decode()


def test_stats_adds_deliveries_the_last_commit_the_server_clock_and_each_queues_head_age(server):
    produce(server, [b"old"])
    before = time.time_ns() // 1000
    figures = wait_until(lambda: (s := server.stats())["queues"]["default"]["oldest_age_s"] > 0 and s, timeout_s=10)
    assert isinstance(figures["delivered_total"], int) and isinstance(figures["commit_ms_last"], float)
    assert figures["commit_ms_last"] > 0
    assert abs(figures["server_time_us"] - before) < 60e6
    with client.Consumer(server.send) as consumer:
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None
        consumer.ack(delivery)
    assert wait_until(lambda: server.stats()["delivered_total"] == 1)
    assert wait_until(lambda: server.stats()["queues"]["default"]["oldest_age_s"] == 0.0, timeout_s=10)


def test_queue_answers_its_figures_and_consumers_and_404s_an_unknown_queue(server):
    produce(server, [b"a", b"b"])
    answer = ask(server, "QUEUE", "default")
    assert answer["name"] == "default" and answer["consumers"] == [] and answer["consumers_total"] == 0
    assert answer["figures"]["depth"] == 2 and set(answer["figures"]) == {
        "depth",
        "inflight",
        "dead_letters",
        "bytes",
        "oldest_age_s",
        "in_per_s",
        "out_per_s",
    }
    assert refusal(server, "QUEUE", "nope") == "there is no queue 'nope'"
    assert refusal(server, "QUEUE").startswith("usage: QUEUE")
    assert refusal(server, "QUEUE", "default", "extra").startswith("usage: QUEUE")


def test_queue_lists_a_phpmq_consumer_with_its_address_connection_time_and_held_messages(make_server):
    dsn, addr = free_tcp_endpoint()
    srv = make_server(phpmq_dsn=dsn)
    produce(srv, [b"x", b"y"])
    since = time.time_ns() // 1000
    with socket.create_connection(addr, timeout=5) as conn:
        conn.sendall(encode(2, [(1, b"default"), (4, b"1")]))  # consume, a window of one
        assert wait_until(lambda: ask(srv, "QUEUE", "default")["consumers"] and srv.stats()["messages_inflight"])
        [row] = ask(srv, "QUEUE", "default")["consumers"]
        local = address(conn)
        assert row["protocol"] == "phpmq" and row["address"] == local and row["held"] == 1
        assert since - 1_000_000 <= row["connected_us"] <= time.time_ns() // 1000
        assert len(row["client"]) <= 40


def test_queue_lists_mqks_consumers_with_their_addresses(make_server):
    dsn, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=dsn)
    produce(srv, [b"x"])  # (the queue "default" exists)
    with MqksClient(dsn) as conn:
        conn.consume("default")
        [row] = wait_until(lambda: ask(srv, "QUEUE", "default")["consumers"])
        assert row["protocol"] == "mqks" and row["address"] == address(conn.sock)


def test_peek_pages_2500_ready_messages_by_after_id_without_the_ones_in_flight(server):
    produce(server, [b"m%04d" % i + b"." * 2000 for i in range(2500)])
    with client.Consumer(server.send) as consumer:
        held = consumer.receive(timeout_s=5)  # the head, in flight: not what a consumer would be given next
        assert held is not None and held.body[0].startswith(b"m0000")
        # (all it will be handed first, --max-inflight of them: what pages skip must not move meanwhile)
        assert wait_until(lambda: server.stats()["messages_inflight"] == 1000)
        seen: list[bytes] = []
        after: list[str] = []
        while True:
            page = ask(server, "PEEK", "default", "1000", *after)
            assert page["queue"] == "default" and len(page["messages"]) <= 1000
            for row in page["messages"]:
                head = base64.b64decode(row["head_b64"])
                assert len(head) == 1024 and row["size"] == 2005 and row["size_exact"] is True
                assert row["enqueued_us"] > 0 and row["deliveries"] == 0
                seen.append(head[:5])
            if not page["more"]:
                break
            after = [page["messages"][-1]["id"]]
        inflight = server.stats()["messages_inflight"]
        assert len(seen) == 2500 - inflight and len(set(seen)) == len(seen)
        assert seen == sorted(seen) and b"m0000" not in seen
        first = ask(server, "PEEK", "default")
        assert len(first["messages"]) == 50 and first["more"]


def test_dead_pages_dead_letters_by_after_id_with_when_and_why_each_died(make_server):
    srv = make_server(max_deliveries=1, ack_timeout=0.2)
    count = 2500
    produce(srv, [b"dead %d" % i for i in range(count)])
    with client.Consumer(srv.send) as consumer:
        for _ in range(count):  # (never acknowledged: back after the ack timeout, then dead)
            assert consumer.receive(timeout_s=5) is not None
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == count, timeout_s=60)
    letters: list[dict] = []
    after: list[str] = []
    while True:
        page = ask(srv, "DEAD", "default", "1000", *after)
        assert page["total"] == count and len(page["letters"]) <= 1000
        letters += page["letters"]
        if not page["more"]:
            break
        after = [page["letters"][-1]["id"]]
    assert len(letters) == count and len({d["id"] for d in letters}) == count
    first = letters[0]
    assert first["reason"] and first["dead_at_us"] >= first["enqueued_us"] > 0
    assert base64.b64decode(first["head_b64"]).startswith(b"dead ")


def test_peek_and_dead_refuse_bad_ids_and_limits_and_cut_a_huge_limit_to_1000(make_server):
    from pzq.config import Limits

    server = make_server(limits=Limits(admin_read_s=60.0))  # (a whole page, whatever the machine's speed)
    produce(server, [b"%d" % i for i in range(1200)])
    assert len(ask(server, "PEEK", "default", "99999999999")["messages"]) == 1000
    assert refusal(server, "PEEK", "nope") == "there is no queue 'nope'"
    assert refusal(server, "DEAD", "nope", "5") == "there is no queue 'nope'"
    assert "not a message id of queue 'default'" in refusal(server, "PEEK", "default", "5", "garbage")
    assert "not a message id" in refusal(server, "DEAD", "default", "5", "0000000000000099-0000000000000001")
    for bad in ("0", "-3", "ten", "1e3", "9" * 40):
        assert refusal(server, "PEEK", "default", bad).startswith("limit must be a whole number")
    assert refusal(server, "PEEK", "default", "1", "2", "3").startswith("usage: PEEK")
    # an id of the queue past its end: an empty page, not an error
    last = ask(server, "PEEK", "default", "1000", ask(server, "PEEK", "default", "1000")["messages"][-1]["id"])
    assert len(last["messages"]) == 200 and not last["more"]
    assert ask(server, "PEEK", "default", "5", last["messages"][-1]["id"]) == {
        "queue": "default",
        "messages": [],
        "more": False,
        "next_after": None,
    }


def test_clients_pages_phpmq_connections_with_their_peer_addresses(make_server):
    dsn, addr = free_tcp_endpoint()
    srv = make_server(phpmq_dsn=dsn)
    conns = [socket.create_connection(addr, timeout=5) for _ in range(5)]
    try:
        assert wait_until(lambda: srv.stats()["phpmq"]["connections"] == 5)
        answer = ask(srv, "CLIENTS", "2", "1")
        [table] = [t for t in answer["tables"] if t["gateway"] == "phpmq"]
        assert answer["figures"]["phpmq"]["connections"] == 5
        assert table["total"] == 5 and table["offset"] == 1 and len(table["rows"]) == 2
        assert table["columns"][-2:] == ["address", "connected_us"]
        every = ask(srv, "CLIENTS")["tables"][0]["rows"]
        assert {row[-2] for row in every} == {address(c) for c in conns}
        assert [row[0] for row in every[1:3]] == [row[0] for row in table["rows"]]
        assert ask(srv, "CLIENTS", "5", "10")["tables"][0]["rows"] == []
        assert len(ask(srv, "CLIENTS", "100000")["tables"][0]["rows"]) == 5
        assert refusal(srv, "CLIENTS", "x").startswith("limit must be a whole number")
        assert refusal(srv, "CLIENTS", "1", "-1").startswith("offset must be a whole number")
        assert refusal(srv, "CLIENTS", "1", "2", "3").startswith("usage: CLIENTS")
    finally:
        for conn in conns:
            conn.close()


def test_hostile_frames_get_one_error_line_and_the_monitor_goes_on(server, sockets):
    produce(server, [b"x"])
    monitor = server.monitor
    assert "only PUBLISH has a second frame" in raw(server, [b"PEEK default", b"body"], sockets)
    assert "PUBLISH carries its body as a second frame" in raw(server, [b"PUBLISH default"], sockets)
    assert "one frame of at most" in raw(server, [b"PUBLISH default", b"a", b"b"], sockets)
    assert "UTF-8" in raw(server, [b"PEEK \xff\xfe"], sockets)
    assert raw(server, [b"QUEUE " + b"q" * 5000], sockets).startswith("error: a request is one frame of at most")
    for text in (raw(server, [b"PEEK default", b"body"], sockets), raw(server, [b"HELLO"], sockets)):
        assert text.startswith("error: ") and text.count("\n") == 1
    assert client.stats(monitor)["queues"]["default"]["depth"] == 1


def test_a_page_ends_early_with_more_at_the_reads_share_of_the_turn_and_pages_on(make_server):
    from pzq.config import Limits

    srv = make_server(limits=Limits(admin_read_s=0.0))  # (every page stops at its floor of 100 rows)
    produce(srv, [b"%04d" % i for i in range(350)])
    first = ask(srv, "PEEK", "default", "1000")
    assert len(first["messages"]) == 100 and first["more"]
    seen = [base64.b64decode(r["head_b64"]) for r in first["messages"]]
    page = first
    while page["more"]:
        page = ask(srv, "PEEK", "default", "1000", page["messages"][-1]["id"])
        seen += [base64.b64decode(r["head_b64"]) for r in page["messages"]]
    assert seen == [b"%04d" % i for i in range(350)]


def test_reads_past_a_turns_share_of_reading_are_answered_in_later_turns(make_server, sockets):
    from pzq.config import Limits

    srv = make_server(limits=Limits(admin_read_s=0.0))  # (one read a turn: the first is always answered)
    produce(srv, [b"x"] * 10)
    dealer = sockets(zmq.DEALER, srv.monitor)
    for i in range(20):
        dealer.send_multipart([b"", b"PEEK default %d" % (i + 1)])
    answers = [recv(dealer, 10_000)[1] for _ in range(20)]
    assert sorted(len(json.loads(a)["messages"]) for a in answers) == sorted(min(i + 1, 10) for i in range(20))


def test_queue_lists_an_api_consumer_group_with_the_messages_its_lease_holds(make_server, tmp_path):
    from pzq.clients.api import ApiClient

    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    produce(srv, [b"a", b"b", b"c"])
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.lease("default", "billing", 0, 2)
        answer = ask(srv, "QUEUE", "default")
    assert answer["consumers_total"] == 1
    assert answer["consumers"] == [
        {"protocol": "api", "client": "group billing", "address": "", "connected_us": 0, "held": 2}
    ]


def test_queue_names_each_native_consumers_address_and_when_it_connected_legacy_and_batched(make_server):
    send, _ = free_tcp_endpoint()
    consume, _ = free_tcp_endpoint()
    srv = make_server(send_dsn=send, consume_dsn=consume)
    started_us = time.time_ns() // 1000
    with client.BatchConsumer(consume) as batched:
        produce(srv, [b"m"])
        assert batched.receive(1, timeout_s=5)
        with client.Consumer(send) as legacy:  # (after: the DEALER would have taken every message)
            produce(srv, [b"n"])
            assert legacy.receive(timeout_s=5) is not None

            def listed() -> list[dict] | None:
                rows = ask(srv, "QUEUE", "default")["consumers"]
                return rows if len(rows) == 2 and all(r["address"] for r in rows) else None

            rows = {r["protocol"]: r for r in wait_until(listed, timeout_s=10)}
            assert set(rows) == {"native", "native batch"}
            for row in rows.values():
                assert re.fullmatch(r"127\.0\.0\.1:\d+", row["address"]), row
                assert started_us - 5_000_000 <= row["connected_us"] <= time.time_ns() // 1000, row
            assert rows["native"]["held"] is None, "the send socket's consumers hold their messages together"
            assert rows["native batch"]["held"] == 1
            [table] = [t for t in ask(srv, "CLIENTS")["tables"] if t["kind"] == "zmq"]
            assert table["columns"] == ["address", "endpoint", "connected_us"] and table["total"] >= 2
            listed = {row[0] for row in table["rows"]}
            assert {r["address"] for r in rows.values()} <= listed, "the clients page lists them too"
    wait_until(lambda: ask(srv, "QUEUE", "default")["consumers"] == [], timeout_s=10)
