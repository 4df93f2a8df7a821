"""STATS and MONITOR over many queues, built a slice a turn (pzq/admin/figures.py), and the monitor's
unread answers charged to their clients (pzq/endpoints/monitor.py): the same text as built at once,
figures never read before their request came, one buffer for every client a pass answers, and clients
that pipeline STATS and never read them answered `busy` past their share, within a bound of their own
that leaves a reader served and never raises the memory alarm (issue 39)."""

from __future__ import annotations

import json
import time

import pytest
import zmq

from pzq.admin import Admin
from pzq.admin.figures import CHUNK, Figures
from pzq.broker import Broker
from pzq.clients import native as client
from pzq.config import Limits
from pzq.endpoints.memory import PipeEstimate
from pzq.endpoints.monitor import BIG_REPLY, MonitorEndpoint
from pzq.protocols import monitor as monitor_proto
from pzq.store import Store

from admin_asks import produce
from conftest import recv, wait_until

pytestmark = pytest.mark.timeout(120)

CLOCKS = ("uptime_seconds", "server_time_us")  # (the two figures that move between two answers)


def long_names(n: int) -> list[str]:
    return [f"q{i:05d}-" + "x" * 248 for i in range(n)]  # (255 bytes each, the longest a name may be)


def admin_with_queues(tmp_path, n: int) -> Admin:
    store = Store(tmp_path / "db", max_size=256 << 20, max_queues=n + 10)
    broker = Broker(store, ack_timeout_s=5)
    for name in long_names(n):
        broker.produce(name, [b"m"], now_us=1)
    store.commit()
    return Admin(broker, store, store_limit=256 << 20, gateways=lambda: {"phpmq": {"connections": 2}})


def without_clocks(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if k not in CLOCKS}


def test_an_answer_in_its_three_parts_is_the_same_text_as_rendered_whole():
    queues = {'a"\u00e9': {"depth": 1, "age": 0.5}, "b": {"depth": 2, "age": 1.0}, "c": {"depth": 0, "age": 0.0}}
    head = {name: i for i, name in enumerate(monitor_proto.PZQ_FIELDS)}
    rest = {"uptime_seconds": 1.5, "phpmq": {"connections": 2, "deep": {"x": 1}}}
    whole = {**head, "queues": queues, **rest}
    slices = [dict(list(queues.items())[:1]), {}, dict(list(queues.items())[1:])]
    for opening, part, closing, render in (
        (
            monitor_proto.stats_opening,
            monitor_proto.stats_queues,
            monitor_proto.stats_closing,
            monitor_proto.render_json,
        ),
        (
            monitor_proto.monitor_opening,
            monitor_proto.monitor_queues,
            monitor_proto.monitor_closing,
            monitor_proto.render_text,
        ),
    ):
        written = opening(head)
        for i, rows in enumerate(slices):
            written += part(rows, not any(slices[:i]))
        assert written + closing(rest) == render(whole)
        assert opening(head) + closing({}) == render({**head, "queues": {}})


def test_stats_and_monitor_built_a_slice_at_a_time_say_what_they_say_built_at_once(tmp_path):
    admin = admin_with_queues(tmp_path, 3 * CHUNK + 5)
    try:
        whole = admin.stats()
        figures = admin.figures
        ticket = figures.ticket("STATS")
        calls = 0
        while (answer := figures.ready("STATS", ticket)) is None:
            figures.work(0.0)  # (a deadline long past: one slice a call)
            calls += 1
        assert calls == 4, "a slice of CHUNK queues a call"
        assert without_clocks(json.loads(bytes(answer))) == without_clocks(whole)
        ticket = figures.ticket("MONITOR")
        figures.work(time.perf_counter() + 60)  # (time enough: the whole pass in one call)
        lines = bytes(figures.ready("MONITOR", ticket) or b"").decode().splitlines()
        expected = monitor_proto.render_text(whole).splitlines()
        assert [ln for ln in lines if not ln.startswith(CLOCKS)] == [ln for ln in expected if not ln.startswith(CLOCKS)]
        assert sum(line.startswith("queue.") for line in lines) == 7 * (3 * CHUNK + 5)  # (with in_per_s, out_per_s)
    finally:
        admin.store.close()


def test_a_request_made_while_a_pass_is_under_way_is_answered_by_the_next_pass_which_sees_what_came_since(
    tmp_path,
):
    admin = admin_with_queues(tmp_path, 2 * CHUNK)
    try:
        figures = admin.figures
        first = figures.ticket("STATS")
        figures.work(0.0)  # (half way through the first pass)
        name = long_names(1)[0]
        admin.broker.produce(name, [b"another"], now_us=2)  # (its queue was already rendered)
        second = figures.ticket("STATS")
        figures.work(0.0)
        answered = figures.ready("STATS", first)
        assert answered is not None and json.loads(bytes(answered))["queues"][name]["depth"] == 1
        assert figures.ready("STATS", second) is None, "the pass under way began before it was asked"
        figures.work(0.0)
        figures.work(0.0)
        again = figures.ready("STATS", second)
        assert again is not None and json.loads(bytes(again))["queues"][name]["depth"] == 2
        assert not figures.pending() and figures.held_bytes() == 0, "nothing kept once every request had its answer"
    finally:
        admin.store.close()


def test_a_queue_deleted_while_its_pass_is_under_way_is_left_out_and_the_rest_is_valid_json(tmp_path):
    admin = admin_with_queues(tmp_path, 2 * CHUNK + 1)
    try:
        figures = admin.figures
        ticket = figures.ticket("STATS")
        figures.work(0.0)
        gone = long_names(2 * CHUNK + 1)[-1]
        admin.broker.drop_queue(gone)
        while (answer := figures.ready("STATS", ticket)) is None:
            figures.work(0.0)
        queues = json.loads(bytes(answer))["queues"]
        assert gone not in queues and len(queues) == 2 * CHUNK
    finally:
        admin.store.close()


def test_a_pass_of_a_few_queues_is_one_slice_answered_at_once(tmp_path):
    admin = admin_with_queues(tmp_path, 10)
    try:
        figures = Figures(admin)
        ticket = figures.ticket("STATS")
        figures.work(0.0)
        assert figures.ready("STATS", ticket) is not None and figures.slices_total == 1
    finally:
        admin.store.close()


def test_a_buffer_sent_to_many_peers_counts_in_full_against_each_and_once_in_what_the_pipes_hold():
    pipes = PipeEstimate(depth=3)
    for peer in (b"a", b"b", b"c"):
        pipes.read(peer)
        pipes.sent(peer, 1000, key=("STATS", 1))
    assert [pipes.of(p) for p in (b"a", b"b", b"c")] == [1000] * 3 and pipes.total == 1000
    pipes.sent(b"a", 10)  # (a reply of its own: counted as ever)
    assert pipes.total == 1010
    pipes.read(b"b")  # (lock-step: b read what it was sent)
    pipes.gone(b"c")
    assert pipes.total == 1010, "a still holds the buffer"
    pipes.gone(b"a")
    assert pipes.total == 0 and pipes.of(b"b") == 0


# -- over real sockets --------------------------------------------------------------------------------


def store_with_queues(tmp_path, n: int) -> None:
    """A store of ``n`` queues of 255-byte names, each holding a message, for a server to open."""
    store = Store(tmp_path / "db", max_size=256 << 20, max_queues=n + 10)
    broker = Broker(store, ack_timeout_s=5)
    for name in long_names(n):
        broker.produce(name, [b"m"], now_us=1)
    store.commit()
    store.close()


def test_stats_over_many_queues_is_built_over_turns_and_is_fresh_for_the_request(make_server, tmp_path):
    store_with_queues(tmp_path, 2000)
    server = make_server(max_queues=2100, limits=Limits(admin_figures_s=0.0005))
    produce(server, [b"one"])  # (to the default queue, just before STATS is asked)
    slices = server.server.admin.figures.slices_total
    figures = server.stats()
    assert len(figures["queues"]) == 2001 and figures["queues"]["default"]["depth"] == 1
    assert figures["messages"] == 2001
    assert server.server.admin.figures.slices_total - slices >= 2000 // CHUNK, "built a slice at a time"
    # (asked over the monitor socket: answered in the test's thread, its reading of the store began a write
    # transaction there that the server's thread then committed at its stop, and LMDB aborted the process)
    text = client.monitor_request(server.monitor, timeout_s=10)
    assert text.splitlines()[0] == "messages: 2001"


def test_dealers_that_pipeline_stats_and_read_none_get_busy_past_their_share_and_leave_a_reader_served(
    make_server, tmp_path, sockets
):
    store_with_queues(tmp_path, 2000)  # (STATS of ~670 KB)
    limits = Limits(memory_peer_share=2 << 20, monitor_answers_bytes=8 << 20)
    server = make_server(max_queues=2100, limits=limits)
    size = len(json.dumps(server.stats(), separators=(",", ":")))
    dealers = []
    for _ in range(10):
        dealer = sockets(zmq.DEALER, server.monitor)
        dealer.setsockopt(zmq.RCVHWM, 1)
        dealer.setsockopt(zmq.RCVBUF, 4096)
        dealers.append(dealer)
    for dealer in dealers:
        for _ in range(20):
            dealer.send_multipart([b"", b"STATS"])
    monitor = next(e for e in server.server.endpoints if isinstance(e, MonitorEndpoint))
    # (every request dealt with: answered, refused busy, or, once a client's pipe is full, left unread)
    wait_until(lambda: not monitor._requests and monitor.stats()["busy_total"] >= 10, timeout_s=30)
    pipes = monitor.replies.pipes
    assert pipes is not None and all(p.held <= limits.memory_peer_share + BIG_REPLY for p in pipes._peers.values())
    reader = sockets(zmq.REQ, server.monitor)
    for _ in range(3):  # (a lock-step reader, as the console's: served each time)
        # (over ipc:// pzq learns a client read its answer when it asks again, or, gone, after
        # reply_stale_s: one-request clients each holding a page would fill the readers' reserve)
        reader.send(b"STATS")
        assert recv(reader, 10_000)[0].startswith(b"{")
    figures = server.stats()
    assert figures["memory"]["alarm"] == 0 and figures["memory"]["alarms_total"] == 0
    unread = figures["monitor"]["answers_unread_bytes"]
    assert unread <= limits.monitor_answers_bytes + size, "within the monitor's bound"
    assert unread < 10 * 2 * size, "each pass's answer is held once, however many clients it went to"


def test_a_dealer_that_pipelines_stats_and_reads_them_all_gets_every_one_in_order(make_server, tmp_path, sockets):
    store_with_queues(tmp_path, 300)
    server = make_server(max_queues=400)
    dealer = sockets(zmq.DEALER, server.monitor)
    for request in (b"STATS", b"MONITOR", b"STATS", b"QUEUE default"):
        dealer.send_multipart([b"", request])
    answers = [recv(dealer, 10_000)[1] for _ in range(4)]
    assert answers[0].startswith(b"{") and answers[1].startswith(b"messages: ") and answers[2].startswith(b"{")
    assert json.loads(answers[3])["name"] == "default"
