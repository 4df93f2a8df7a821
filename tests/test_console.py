"""The web console: its pages rendered from figures, and a real server's console read over HTTP."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from pzq.clients import native as client
from pzq.console import pages
from pzq.console.history import History

from conftest import free_tcp_endpoint, wait_until


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

    figures = wait_until(settled, timeout_s=10)
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
def test_connections_that_send_nothing_take_at_most_sixteen_threads_and_the_console_answers_after(make_server):
    import socket

    from pzq.console.web import MAX_CONNECTIONS

    tcp, (host, port) = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    make_server(http_dsn=url)
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(MAX_CONNECTIONS)]
    try:
        extra = socket.create_connection((host, port), timeout=5)
        assert wait_until(lambda: extra.recv(1) == b"", timeout_s=5), "one past the limit is closed at once"
        extra.close()
    finally:
        for sock in idle:
            sock.close()
    assert wait_until(lambda: get(url + "/queues")[0] == 200, timeout_s=10)


def test_a_queues_charts_are_its_rates_over_ten_second_samples_for_at_most_a_thousand_queues():
    from pzq.console import history as history_module

    history = History()

    def at(second: float, queues: dict[str, tuple[int, int, int]]) -> None:
        stats = {"queues": {q: {"depth": d} for q, (_, _, d) in queues.items()}}
        history.add(second, stats, 0.1, {q: {"produced": p, "acked": a} for q, (p, a, _) in queues.items()})

    at(0.0, {"q": (0, 0, 0)})
    at(5.0, {"q": (999, 999, 9)})  # (between samples: not taken)
    at(10.0, {"q": (500, 100, 400)})
    at(20.0, {"q": (700, 700, 0)})
    assert history.queue_series("q") == {
        "produced": [(10.0, 50.0), (0.0, 20.0)],
        "acked": [(10.0, 10.0), (0.0, 60.0)],
        "depth": [(10.0, 400.0), (0.0, 0.0)],
    }
    at(30.0, {})  # the queue was deleted: its samples go
    assert history.queue_series("q") == {"produced": [], "acked": [], "depth": []}
    many = {f"q{i}": (0, 0, 0) for i in range(history_module.MAX_CHARTED_QUEUES + 5)}
    at(40.0, many)
    at(50.0, many)
    charted = [q for q in many if history.queue_series(q)["depth"]]
    assert len(charted) == history_module.MAX_CHARTED_QUEUES


def test_a_client_list_shows_hostile_identities_as_text_and_at_most_two_hundred_rows():
    table = {
        "gateway": "emqp",
        "kind": "emqp-workers",
        "title": "Workers",
        "columns": ["worker", "queues"],
        "rows": [["<img src=x onerror=alert(1)>", "q"]] + [[f"w{i}", "q"] for i in range(300)],
        "total": 301,
    }
    page = pages.clients({"emqp": {"workers": 301}}, [table])
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert page.count('<td class="name">') == pages.CLIENT_ROWS and "and 101 more" in page
    assert "busy" in pages.clients({"emqp": {"workers": 1}}, None)


def test_only_a_logged_in_operators_pages_carry_forms_and_each_form_its_csrf_token():
    content = {"messages": [], "dead": [{"id": "0001", "enqueued_us": 0, "deliveries": 3, "body": b"x", "reason": "r"}]}
    reader = pages.queue_page("q", {}, None, {}, content)
    assert "<form" not in reader
    operator = pages.queue_page("q", {}, None, {}, content, viewer=pages.Viewer(csrf='tok"en'))
    forms = re.findall(r"<form method=post.*?</form>", operator)
    assert len(forms) == 6  # log out, requeue all, delete all, purge, and the letter's requeue and delete
    assert all('name=csrf value="tok&quot;en"' in form for form in forms)
