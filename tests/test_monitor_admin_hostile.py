"""The monitor's admin requests against a hostile client and an unlucky operator, over a real server on
real sockets: numbers that are digits to Python's str but not to int(), floods of big pages never read,
forged ids, purges raced by consumers and deletions, writes of a turn that rolls back, and requests in
raw DEALER framing."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import shutil
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import zmq
from click.testing import CliRunner
from test_failing_commits import plant_a_foreign_record

from pzq.cli import cli
from pzq.clients import native as client
from pzq.clients.admin import admin_request
from pzq.clients.sockets import tcp_address
from pzq.clock import Now
from pzq.config import Limits
from pzq.endpoints.monitor import READ_BATCH, MonitorEndpoint
from pzq.errors import NotPermitted

from admin_asks import ask, produce, refusal
from conftest import ThreadServer, free_tcp_endpoint, make_config, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "words",
    [
        ("PEEK", "default", "²"),
        ("DEAD", "default", "³"),
        ("CLIENTS", "¹"),
        ("CLIENTS", "1", "²"),
        ("PEEK", "default", "١٠"),  # (Arabic-Indic digits: int() takes them, the request's syntax does not)
    ],
)
def test_a_limit_or_offset_of_unicode_digits_is_refused_with_one_line_and_rolls_back_no_turn(make_server, words):
    srv = make_server()
    produce(srv, [b"before"])
    assert "must be a whole number" in refusal(srv, *words)
    produce(srv, [b"after"])  # (the loop is still there, and nothing it stored was rolled back)
    assert srv.stats()["queues"]["default"]["depth"] == 2


def flood(endpoint: str, request: bytes, stop: threading.Event, sent: list[int], connections: int = 8) -> None:
    """DEALERs that send ``request`` as fast as the server takes it and never read a reply (``sent[0]``
    counts the requests sent)."""
    ctx = zmq.Context.instance()
    socks = [ctx.socket(zmq.DEALER) for _ in range(connections)]
    try:
        for sock in socks:
            sock.setsockopt(zmq.RCVHWM, 1)
            sock.setsockopt(zmq.RCVBUF, 4096)
            sock.connect(endpoint)
        while not stop.is_set():
            for sock in socks:
                try:
                    sock.send_multipart([b"", request], zmq.NOBLOCK)
                    sent[0] += 1
                except zmq.Again:
                    pass
            stop.wait(0.001)
    finally:
        for sock in socks:  # (a short linger, not 0: see conftest's ``sockets``)
            sock.close(linger=100)


@contextlib.contextmanager
def flooding(endpoint: str, request: bytes, connections: int = 8) -> Iterator[list[int]]:
    """``flood`` in a thread for as long as the block runs; yields its count of requests sent."""
    stop, sent = threading.Event(), [0]
    flooder = threading.Thread(target=flood, args=(endpoint, request, stop, sent, connections), daemon=True)
    flooder.start()
    try:
        yield sent
    finally:
        stop.set()
        flooder.join(10)


def test_a_flood_of_big_peeks_never_read_leaves_few_requests_waiting_and_an_honest_stats_is_answered(make_server):
    srv = make_server(ack_timeout=600.0)
    produce(srv, [bytes(4096)] * 1000)
    monitor = next(e for e in srv.server.endpoints if isinstance(e, MonitorEndpoint))
    most = 0
    flush = monitor.flush

    def counted(now: Now) -> None:
        nonlocal most
        most = max(most, len(monitor._requests))
        flush(now)

    monitor.flush = counted  # (counts what waits to be answered at each turn's end)
    with flooding(srv.monitor, b"PEEK default 1000") as sent:
        assert wait_until(lambda: sent[0] > 2000, timeout_s=30)  # (the flood is on: far more than is answered)
        started = time.monotonic()
        assert "queues" in ask(srv, "STATS")  # (before: behind thousands of PEEKs, minutes)
        answered_s = time.monotonic() - started
        produce(srv, [b"honest"])
    assert most <= READ_BATCH, f"{most} requests waited to be answered"
    assert answered_s < 10


def test_big_pages_for_clients_that_never_read_them_are_refused_before_they_raise_the_memory_alarm(make_server):
    srv = make_server(ack_timeout=600.0, memory_high_water=8 << 20, memory_low_water=6 << 20)
    produce(srv, [bytes(4096)] * 1000)  # (a page of 1,000 rows: about 1.5 MB of JSON)
    with flooding(srv.monitor, b"PEEK default 1000", 4) as sent:
        assert wait_until(lambda: sent[0] > 500, timeout_s=30)
        alarm = srv.server.alarm
        assert wait_until(lambda: alarm.refused_replies_total > 0 or alarm.raised_total > 0, timeout_s=30)
        produce(srv, [b"honest"])  # (before: "queue full: memory alarm", the monitor's backlogs past 8 MiB)
        assert "busy" in refusal(srv, "PEEK", "default", "1000")  # (one line; the small requests still go)
        assert "queues" in ask(srv, "STATS") and ask(srv, "PEEK", "default", "1")["messages"]
    assert srv.server.alarm.raised_total == 0


def test_pages_read_by_one_request_clients_that_went_are_no_longer_counted_against_the_memory_bound(make_server):
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(monitor_dsn=endpoint, memory_high_water=8 << 20, memory_low_water=6 << 20)
    produce(srv, [bytes(4096)] * 1000)
    for _ in range(8):  # (12 MB of pages: past the low-water mark, and answered busy, had they stayed counted)
        assert ask(srv, "PEEK", "default", "1000")["messages"]
        assert wait_until(lambda: srv.server.alarm.parts.get("monitor_pipes") == 0, timeout_s=10)


def test_a_publish_whose_write_fails_the_turn_is_answered_store_failure_once_and_not_tried_every_turn(tmp_path):
    cfg = make_config(tmp_path, ack_timeout=600.0)
    plant_a_foreign_record(tmp_path / "db", cfg.queue, 3)  # (the 5th message's record is another writer's)
    srv = ThreadServer(cfg)
    try:
        assert ask(srv, "PUBLISH", "default", body=b"fourth")["queue"] == "default"
        turns = srv.server.turns
        assert refusal(srv, "PUBLISH", "default", body=b"fifth") == "store failure: nothing was changed, try again"
        assert srv.server.turns - turns < 1000  # (before: carried out again each turn, 9,000 turns a second)
        assert srv.stats()["queues"]["default"]["depth"] == 4
        heads = [base64.b64decode(m["head_b64"]) for m in ask(srv, "PEEK", "default")["messages"]]
        assert b"fourth" in heads and b"fifth" not in heads
    finally:
        srv.stop()


def test_a_purge_raced_by_an_acking_consumer_deletes_nothing_it_holds_and_nothing_twice(make_server):
    srv = make_server(ack_timeout=600.0, max_inflight=50, limits=Limits(admin_purge_share=200))
    produce(srv, [b"m%d" % i for i in range(5000)])
    received: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        with client.Consumer(srv.send) as consumer:
            while not stop.is_set():
                delivery = consumer.receive(timeout_s=0.2)
                if delivery is not None:
                    received.append(delivery.key)
                    consumer.ack(delivery)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        assert wait_until(lambda: len(received) > 100, timeout_s=20)
        assert ask(srv, "PURGE", "default")["more"] is True
        assert ask(srv, "PURGE", "default") == {"purged": 0, "more": True}  # (under way: adds nothing)
        assert wait_until(lambda: not srv.server.admin.purging(), timeout_s=30)
    finally:
        stop.set()
        consumer.join(10)
    stats = srv.stats()
    assert wait_until(lambda: srv.stats()["acked_total"] == len(received), timeout_s=10)
    assert len(set(received)) == len(received) < 5000
    assert stats["refused_not_held_total"] == 0  # (every ack found its message: none held was purged)
    # (what is left was in flight when the purge passed it, kept, at most --max-inflight 50)
    assert srv.stats()["queues"]["default"]["depth"] <= 50


def test_a_restart_stops_a_purge_under_way_leaving_the_rest_which_a_second_purge_deletes(tmp_path):
    cfg = make_config(tmp_path, ack_timeout=600.0, limits=Limits(admin_purge_share=100, turn_records=100))
    srv = ThreadServer(cfg)
    try:
        produce(srv, [b"m%d" % i for i in range(2_000)])
        srv.server.admin.work = lambda budget: None  # (the loop cut off before its next share, as by a crash)
        first = ask(srv, "PURGE", "default")
        assert first["more"] is True and 0 < first["purged"] <= 100
    finally:
        srv.stop()
    srv = ThreadServer(cfg)
    try:
        assert srv.stats()["queues"]["default"]["depth"] == 2_000 - first["purged"]
        assert ask(srv, "PURGE", "default")["more"] is True
        assert wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == 0, timeout_s=60)
    finally:
        srv.stop()


def test_with_curve_an_unlisted_key_gets_no_answer_and_changes_nothing_and_a_listed_ones_purge_names_it(
    make_server, tmp_path, caplog
):
    for name in ("server", "alice", "mallory"):
        assert CliRunner().invoke(cli, ["keygen", str(tmp_path / name), name]).exit_code == 0
    (tmp_path / "clients").mkdir()
    shutil.copy(tmp_path / "alice" / "alice.key", tmp_path / "clients")  # (mallory's key is a key, not listed)
    srv = make_server(
        curve_secret_key=str(tmp_path / "server" / "server.key_secret"), curve_clients=str(tmp_path / "clients")
    )
    server_key = str(tmp_path / "server" / "server.key")
    alice = (str(tmp_path / "alice" / "alice.key_secret"), server_key)
    mallory = (str(tmp_path / "mallory" / "mallory.key_secret"), server_key)
    assert admin_request(srv.monitor, "PUBLISH default", b"kept", curve=alice, timeout_s=10)["queue"] == "default"
    for words, body in (("PUBLISH default", b"forged"), ("PURGE default", None), ("PEEK default", None)):
        # (no answer comes: the client hears the refused handshake through its socket monitor, at once)
        with pytest.raises(NotPermitted, match="refused this client's CURVE key"):
            admin_request(srv.monitor, words, body, curve=mallory, timeout_s=10)
    figures = admin_request(srv.monitor, "QUEUE default", curve=alice, timeout_s=10)["figures"]
    assert figures["depth"] == 1
    with caplog.at_level(logging.INFO, logger="pzq.admin"):
        purged = admin_request(srv.monitor, "PURGE default", curve=alice, timeout_s=10)
    assert purged == {"purged": 1, "more": False}
    assert "purged 1 ready message(s) of queue 'default' (by alice)" in caplog.text


def test_a_bare_dealers_publish_of_an_empty_body_is_stored_and_answered_with_an_empty_first_frame(server, sockets):
    dealer = sockets(zmq.DEALER, server.monitor)
    dealer.send_multipart([b"PUBLISH default", b""])  # (no delimiter: the empty frame is the body)
    assert dealer.poll(10_000)
    empty, text = dealer.recv_multipart()  # (before: the request words came back as an envelope, refused)
    assert empty == b"" and json.loads(text)["queue"] == "default"
    dealer.send_multipart([b"", b"PUBLISH default", b""])  # (a REQ's framing by hand: the same)
    assert dealer.poll(10_000) and json.loads(dealer.recv_multipart()[1])["queue"] == "default"
    assert server.stats()["queues"]["default"]["depth"] == 2


def dead_letters(srv, count: int) -> None:
    """``count`` messages of "default" dead: delivered once, never acked, out of deliveries (--max-deliveries 1)."""
    produce(srv, [b"dead %d" % i for i in range(count)])
    with client.Consumer(srv.send) as consumer:
        for _ in range(count):
            assert consumer.receive(timeout_s=5) is not None
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == count, timeout_s=60)


def test_requeue_and_deletedead_of_one_dead_letter_in_one_turn_do_one_thing_each_in_their_order(make_server, sockets):
    srv = make_server(max_deliveries=1, ack_timeout=0.2)
    dead_letters(srv, 2)
    first, second = (row["id"] for row in ask(srv, "DEAD", "default")["letters"])
    dealer = sockets(zmq.DEALER, srv.monitor)
    for text in (f"REQUEUE default {first}", f"DELETEDEAD default {first}", f"DELETEDEAD default {second}"):
        dealer.send_multipart([b"", text.encode()])  # (pipelined: read in one turn, carried out in order)
    for text in (f"REQUEUE default {second}", f"DELETEDEAD default {second}"):
        dealer.send_multipart([b"", text.encode()])
    answers = []
    for _ in range(5):
        assert dealer.poll(10_000)
        answers.append(json.loads(dealer.recv_multipart()[1]))
    assert [a.get("requeued", a.get("deleted")) for a in answers] == [1, 0, 1, 0, 0]
    with client.Consumer(srv.send) as consumer:  # (the requeued one is delivered once more, and only it)
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None and delivery.body == [b"dead 0"]
        consumer.ack(delivery)
    stats = srv.stats()["queues"]["default"]
    assert stats["dead_letters"] == 0 and stats["depth"] == 0


def test_a_publish_whose_client_went_before_its_answer_is_stored_once_and_the_monitor_goes_on(server):
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.connect(server.monitor)
    sock.send_multipart([b"PUBLISH default", b"orphan"])
    sock.close(linger=1000)  # (gone before its answer: the message goes out, the answer finds nobody)
    assert wait_until(lambda: server.stats()["queues"]["default"]["depth"] == 1)
    heads = [base64.b64decode(m["head_b64"]) for m in ask(server, "PEEK", "default")["messages"]]
    assert heads == [b"orphan"]


@pytest.mark.parametrize(
    "after",
    [
        "0000000000000001ffffffffffffffff",  # (the last seq there could be: an empty page, no overflow)
        "0000000000000001" + "f" * 15 + "e",
    ],
)
def test_a_forged_after_id_at_the_end_of_the_seqs_pages_nothing(server, after):
    produce(server, [b"x"])
    for command, rows in (("PEEK", "messages"), ("DEAD", "letters")):
        page = ask(server, command, "default", "1000", after)
        assert page[rows] == [] and page["more"] is False


@pytest.mark.parametrize(
    "after",
    ["00000000000000020000000000000001", "0000000000000000ffffffffffffffff", "-1", "1e3", "F" * 33, "\u0661" * 32],
)
def test_an_after_id_of_another_queue_or_no_id_at_all_is_refused_with_one_line(server, after):
    produce(server, [b"x"])
    for command in ("PEEK", "DEAD", "DELETEDEAD", "REQUEUE"):
        words = (command, "default", "5", after) if command in ("PEEK", "DEAD") else (command, "default", after)
        assert "is not a" in refusal(server, *words)
    assert server.stats()["queues"]["default"]["depth"] == 1


def test_a_page_refused_busy_is_refused_before_it_is_read_so_a_flood_of_them_costs_no_reading(make_server, sockets):
    # (pages whole, whatever the machine's speed: cut at the reads' share of a turn, as on a loaded CI
    # machine, 40 of them were too small to fill the client's share, and none was refused)
    server = make_server(limits=Limits(admin_read_s=10.0))
    produce(server, [bytes(4096)] * 1000)
    admin, read, unanswered = server.server.admin, [], []
    endpoint = next(e for e in server.server.endpoints if isinstance(e, MonitorEndpoint))
    answer, refuses = admin.answer, endpoint.replies.refuses

    def counted(request):  # (counts the pages the loop reads)
        read.append(request.command)
        return answer(request)

    def counted_refusal(peer, what):  # (counts the requests left unanswered: their client reads nothing)
        refused = refuses(peer, what)
        if refused:
            unanswered.append(peer)
        return refused

    admin.answer, endpoint.replies.refuses = counted, counted_refusal
    dealer = sockets(zmq.DEALER, server.monitor)
    for _ in range(40):  # (~60 MB of pages, and no reply read until the last was sent)
        dealer.send_multipart([b"", b"PEEK default 1000"])
    # Every request has been dealt with once each was read and answered, refused busy, or left unanswered
    # because its client's replies backed up (on a busy machine the loop reads the flood over several
    # turns, and a later part of it finds the first pages still waiting in the client's pipe).
    assert wait_until(lambda: len(read) + endpoint.busy_total + len(unanswered) == 40, timeout_s=60)
    replies = []
    for _ in range(40 - len(unanswered)):
        assert dealer.poll(10_000), f"{len(replies)} replies of {40 - len(unanswered)} came"
        replies.append(dealer.recv_multipart()[1])
    pages = [r for r in replies if r.startswith(b"{")]
    assert len(pages) < 40 and len(pages) + endpoint.busy_total + len(unanswered) == 40
    assert all(r.startswith(b"error: busy") for r in replies if r[:1] != b"{")
    assert read.count("PEEK") == len(pages)  # (before: 40 read, most then thrown away as busy)
    assert not dealer.poll(0)


def test_a_publish_while_the_memory_alarm_is_raised_is_refused_as_a_producer_is_and_stored_once_it_clears(
    make_server,
):
    srv = make_server(
        mqks_dsn=free_tcp_endpoint()[0],
        memory_high_water=16 << 20,
        memory_low_water=12 << 20,
        max_message_size=16 << 20,  # (its unfinished MQKS lines are 7 MiB)
    )
    host, port = tcp_address(srv.config.mqks_dsn)
    parkers = [socket.create_connection((host, port), timeout=10) for _ in range(3)]
    try:
        for raw in parkers:  # (3 x 7 MiB of a line never finished: held, and what raises the alarm)
            raw.sendall(b"p1 publish e " + b"x" * (7 << 20))
        assert wait_until(lambda: srv.server.alarm.raised, timeout_s=20)
        text = refusal(srv, "PUBLISH", "default", body=b"refused")
        assert text.startswith("the message was refused: queue full: memory alarm")
        assert srv.stats()["queues"]["default"]["depth"] == 0
    finally:
        for raw in parkers:
            raw.close()
    assert wait_until(lambda: not srv.server.alarm.raised, timeout_s=20)
    assert ask(srv, "PUBLISH", "default", body=b"stored")["queue"] == "default"


def test_a_purge_leaves_what_an_api_group_leased_which_it_then_fetches_and_acks(make_server, tmp_path):
    from pzq.clients.api import ApiClient

    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    produce(srv, [b"m%d" % i for i in range(10)])
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        base, end = api.lease("default", "billing", 0, 3)
        assert ask(srv, "PURGE", "default") == {"purged": 7, "more": False}
        messages, gone = api.fetch("default", "billing", base, end)
        assert gone == 0 and [m[-1] for m in messages] == [b"m0", b"m1", b"m2"]
        api.ack_upto("default", "billing", end)
    assert wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == 0)


def test_a_pipelining_dealer_is_answered_in_the_order_it_asked_when_its_reads_go_over_turns(make_server, sockets):
    srv = make_server(limits=Limits(admin_read_s=0.0))  # (one read answered a turn: the rest wait for the next)
    produce(srv, [bytes(64)] * 10)
    dealer = sockets(zmq.DEALER, srv.monitor)
    asked = [[b"", b"PEEK default 5"]] * 4 + [
        [b"", b"PUBLISH default", b"x"],
        [b"", b"STATS"],
        [b"", b"PEEK default 1"],
    ]
    for frames in asked:
        dealer.send_multipart(frames)
    answers = []
    while len(answers) < len(asked) and dealer.poll(10_000):
        answers.append(json.loads(dealer.recv_multipart()[1]))
    kinds = ["messages" if "messages" in a and "queue" in a else "id" if "id" in a else "stats" for a in answers]
    assert kinds == ["messages"] * 4 + ["id", "stats", "messages"]  # (before: the PUBLISH's answer second)
    assert srv.stats()["queues"]["default"]["depth"] == 11
