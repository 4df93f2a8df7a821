"""The web console: its pages rendered from figures, and a real server's console read over HTTP."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest

from pzq.clients import native as client
from pzq.config import Limits
from pzq.console import pages
from pzq.console.history import History

from conftest import free_tcp_endpoint, make_config, wait_until


def get(url: str) -> tuple[int, str, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def test_rates_are_the_counters_differences_over_the_seconds_between_samples():
    history = History()
    history.add(100.0, {"produced_total": 0, "acked_total": 0}, 0.5)
    history.add(101.0, {"produced_total": 500, "acked_total": 100}, 0.7)
    history.add(103.0, {"produced_total": 900, "acked_total": 100}, 0.9)
    series = history.series()
    assert series["produced_total"] == [(2.0, 500.0), (0.0, 200.0)]
    assert series["acked_total"] == [(2.0, 100.0), (0.0, 0.0)]
    assert series["commit_ms"] == [(2.0, 0.7), (0.0, 0.9)]


def test_the_history_keeps_fifteen_minutes_of_samples_and_no_more():
    history = History()
    for second in range(2000):
        history.add(float(second), {"produced_total": second}, 0.1)
    points = history.series()["produced_total"]
    assert len(points) == 900 and points[0][0] == 899.0


def test_a_hostile_queue_name_is_shown_as_text_never_as_markup():
    name = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    stats = {"queues": {name: {"depth": 3, "inflight": 0, "dead_letters": 0, "bytes": 10}}}
    page = pages.queues(stats, {}, {}, "name", False)
    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page


def test_a_body_shows_as_text_when_printable_else_as_hex_and_is_cut_short():
    assert pages.show_body(b"<b>hi</b>") == "&lt;b&gt;hi&lt;/b&gt;"
    assert pages.show_body(b"\x00\xff") == "hex 00 ff"
    long = pages.show_body(b"x" * 1000)
    assert long.startswith("x" * 200) and long.endswith("(1,000 bytes)") and "x" * 201 not in long


def test_the_clients_page_shows_each_gateways_figures_and_each_groups_lease_range_and_lag():
    stats = {
        "queues": {"q": {"depth": 10}},
        "mqks": {"connections": 2, "bindings": 7, "note": "text is left out"},
        "api": {"requests": 3, "groups": {"q/<g>": {"base": 2, "end": 6, "held": 4}}},
    }
    page = pages.clients(stats)
    assert re.search(r'data-figure="connections">2<', page) and "text is left out" not in page
    assert re.search(r'data-group="q/&lt;g&gt;">q/&lt;g&gt;</td><td>2 \.\. 6</td><td>4</td><td>6</td>', page)


def test_the_queues_table_sorts_by_the_column_asked_for_and_ignores_unknown_ones():
    stats = {"queues": {q: {"depth": d} for q, d in (("a", 5), ("b", 50), ("c", 1))}}
    order = re.compile(r'data-queue="(\w)"')
    assert order.findall(pages.queues(stats, {}, {}, "depth", True)) == ["b", "a", "c"]
    assert order.findall(pages.queues(stats, {}, {}, "__class__", False)) == ["a", "b", "c"]


@pytest.mark.slow
def test_a_servers_console_shows_the_figures_the_monitor_reports(make_server):
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    srv = make_server(http_dsn=url)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(10)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(4):
            consumer.ack(consumer.receive(5000))

    def settled() -> dict | None:  # the loop publishes its figures once a second
        figures = json.loads(get(url + "/api/stats")[1])
        return figures if figures.get("queues", {}).get("default", {}).get("depth") == 6 else None

    figures = wait_until(settled, timeout_s=10, interval_s=0.1)  # (HTTP: under the 20 a second one address may open)
    monitor = client.stats(srv.monitor)
    assert (figures["messages"], figures["produced_total"], figures["acked_total"]) == (6, 10, 4)
    assert (monitor["messages"], monitor["produced_total"], monitor["acked_total"]) == (6, 10, 4)
    status, overview, headers = get(url + "/")
    assert status == 200 and "script-src 'none'" in headers["Content-Security-Policy"]
    assert re.search(r'data-figure="messages stored">6<', overview)
    status, table, _ = get(url + "/queues?sort=depth&order=desc")
    assert status == 200 and re.search(
        r'data-queue="default"><a href="/queue\?name=default">default</a></td>'
        r'<td data-column="depth">6<',
        table,
    )
    status, queue_page, _ = get(url + "/queue?name=default")
    assert status == 200 and re.search(r'data-figure="depth">6<', queue_page)
    assert re.findall(r"<td class=body>(m\d)</td>", queue_page) == ["m4", "m5", "m6", "m7", "m8", "m9"]
    assert get(url + "/queue?name=nosuch")[0] == 404
    request = urllib.request.Request(url + "/queues", data=b"purge=default", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 405
    assert get(url + "/../../etc/passwd")[0] == 404


@pytest.mark.slow
def test_connections_that_send_nothing_take_at_most_sixteen_threads_eight_per_address(make_server):
    import socket

    from pzq.console.listener import MAX_CONNECTIONS, MAX_PER_ADDRESS

    tcp, (host, port) = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    make_server(http_dsn=url)

    def connect(source: str) -> socket.socket:
        return socket.create_connection((host, port), timeout=5, source_address=(source, 0))

    def closed_at_once(sock: socket.socket) -> bool:
        try:
            return wait_until(lambda: sock.recv(1) == b"", timeout_s=5)
        except ConnectionResetError:
            return True
        finally:
            sock.close()

    idle = [connect("127.0.0.1") for _ in range(MAX_PER_ADDRESS)]
    try:
        assert closed_at_once(connect("127.0.0.1")), "one address holds at most eight"
        idle += [connect("127.0.0.2") for _ in range(MAX_CONNECTIONS - MAX_PER_ADDRESS)]
        assert closed_at_once(connect("127.0.0.3")), "one past the limit is closed at once"
    finally:
        for sock in idle:
            sock.close()
    assert wait_until(lambda: get(url + "/queues")[0] == 200, timeout_s=10, interval_s=0.1)


@pytest.mark.slow
def test_a_client_that_sends_its_request_a_byte_at_a_time_is_cut_off_at_the_connections_deadline(make_server):
    import socket
    import time

    tcp, (host, port) = free_tcp_endpoint()
    make_server(http_dsn=tcp.replace("tcp://", "http://"), limits=Limits(console_connection_s=1.0))
    with socket.create_connection((host, port), timeout=5) as slow:
        started = time.monotonic()
        cut = False
        for byte in b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"x" * 100:
            try:
                slow.sendall(bytes([byte]))
                if slow.recv(1, socket.MSG_DONTWAIT) == b"":
                    cut = True
                    break
            except BlockingIOError:
                pass
            except OSError:  # (reset: cut off too)
                cut = True
                break
            time.sleep(0.05)  # (the slow client's pace: well under the per-read timeout of 10 s)
    assert cut and time.monotonic() - started < 4, "cut off at its deadline, not at its pace"


@pytest.mark.slow
def test_a_query_string_of_too_many_fields_gets_400_and_a_flood_of_connections_is_cut_at_the_rate(make_server):
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    # (100 a second by default: a flood of 120 would take long to show)
    make_server(http_dsn=url, limits=Limits(console_connections_per_s=20))
    assert get(url + "/queue?a=1&b=2&c=3")[0] == 400
    assert get(url + "/queues?a&b&c&d&e&f")[0] == 200  # (sorting by name, as for any unknown query)
    outcomes = []
    started = time.monotonic()
    for _ in range(120):
        try:
            outcomes.append(get(url + "/static/console.css")[0])
        except (urllib.error.URLError, ConnectionError):
            outcomes.append("closed")
    refilled = int((time.monotonic() - started) * 20) + 1
    assert outcomes.count(200) <= 20 + refilled and outcomes.count("closed") >= 120 - 20 - refilled
    assert outcomes.count(200) >= 10


def test_a_queue_page_viewed_again_within_a_second_is_not_read_again_unless_it_was_changed():
    import threading

    from pzq.console.web import Console

    tcp, _ = free_tcp_endpoint()
    console = Console(tcp.replace("tcp://", "http://"), ".")
    reads, stop = [], threading.Event()

    def loop() -> None:  # (the server's loop, reduced to answering the console)
        while not stop.is_set():
            for request in console.take(8):
                if request.claim():
                    reads.append(request.args["name"])
                    request.result = {"read": len(reads)}
                request.done.set()
            stop.wait(0.005)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        assert console.look("q") == {"read": 1} and console.look("q") == {"read": 1}
        assert console.look("other") == {"read": 2}
        console.changed("q")
        assert console.look("q") == {"read": 3} and reads == ["q", "other", "q"]
    finally:
        stop.set()
        thread.join(5)
        console.close()


def test_the_queues_table_shows_two_hundred_queues_a_page_with_links_to_the_others():
    stats = {"queues": {f"q{i:04d}": {"depth": i} for i in range(450)}}
    first = pages.queues(stats, {}, {}, "depth", True)
    assert re.findall(r'data-queue="(q\d+)"', first)[:2] == ["q0449", "q0448"] and first.count("data-queue=") == 200
    assert "page 1 of 3 (450 queues)" in first and 'page=2" rel=next' in first and "rel=prev" not in first
    last = pages.queues(stats, {}, {}, "depth", True, page=99)  # (past the end: the last page)
    assert last.count("data-queue=") == 50 and "page 3 of 3" in last and 'page=2" rel=prev' in last
    assert pages.query_sort("sort=depth&order=desc&page=2") == ("depth", True, 2)
    assert pages.query_sort("sort=__class__&page=-1") == ("name", False, 1)


def test_a_body_of_a_million_empty_frames_is_previewed_by_its_first_frames_only(store):
    store.put("q", [b"start"] + [b""] * 1_000_000, now_us=1)
    store.commit()
    (preview,) = store.preview("q", 50, 1024)
    assert preview.body_head == b"start" and not preview.size_exact and preview.body_size > 1_000_000
    assert pages.show_body(preview.body_head, preview.body_size, preview.size_exact).startswith("start … (about ")


@pytest.mark.slow
def test_a_flood_of_connections_from_one_address_leaves_another_served(make_server):
    import socket

    tcp, (host, port) = free_tcp_endpoint()
    make_server(http_dsn=tcp.replace("tcp://", "http://"))

    def status(source: str) -> str:
        try:
            with socket.create_connection((host, port), timeout=5, source_address=(source, 0)) as sock:
                sock.sendall(b"GET /static/console.css HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                return sock.recv(12).decode() or "closed"
        except ConnectionError:
            return "closed"

    from pzq.console.listener import SOURCE_PER_S

    started = time.monotonic()
    flood = [status("127.0.0.1") for _ in range(200)]
    allowed = 2 * SOURCE_PER_S + (time.monotonic() - started) * SOURCE_PER_S + 1  # (its burst, then its rate)
    assert flood.count("HTTP/1.0 200") <= allowed and flood.count("closed") >= 200 - allowed
    assert all(status("127.0.0.2") == "HTTP/1.0 200" for _ in range(10))


def test_the_queues_table_shows_each_queues_rates_over_its_last_ten_seconds_and_sorts_by_them():
    history = History()
    for at, produced in ((0.0, 0), (10.0, 500), (20.0, 2500)):
        stats = {"queues": {"slow": {"depth": 1}, "busy": {"depth": 1}}}
        history.add(at, stats, 0.1, {"slow": {"produced": produced // 100}, "busy": {"produced": produced}})
    rates = history.queue_rates()
    assert rates == {"slow": (2.0, 0.0), "busy": (200.0, 0.0)}
    table = pages.queues({"queues": {"slow": {}, "busy": {}}}, {}, {}, "produce_rate", True, rates=rates)
    assert re.findall(r'data-queue="(\w+)"', table) == ["busy", "slow"] and ">produced/s<" in table
    assert re.search(r'data-queue="busy">.*?<td data-column="produce_rate">200<', table)


def test_a_server_built_without_a_console_refuses_an_http_dsn_with_a_clear_error(tmp_path):
    import zmq

    from pzq.errors import ConfigError
    from pzq.server import Server

    tcp, _ = free_tcp_endpoint()
    server = Server(make_config(tmp_path, http_dsn=tcp.replace("tcp://", "http://")), context=zmq.Context.instance())
    try:
        with pytest.raises(ConfigError, match="--http-dsn: this server was built without the web console"):
            server.start()
    finally:
        server.close()
