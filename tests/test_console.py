"""The web console as its own process (`pzq console`): its pages, their JSON twins, HEAD, the 404s, the
escaping of what clients named, the security headers, and the few requests it makes of pzq however
many browsers watch, against a real server over real HTTP."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest
import zmq
import zmq.auth
from console_run import Browser, ConsoleProcess, free_port

from pzq.clients import native as client
from pzq.clients.api import ApiClient
from pzq.console import views
from pzq.console.connections import MOST, REQUEST_S
from pzq.console.history import QUEUE_EVERY_S, History
from pzq.console.reader import Snapshot
from pzq.curve_keys import keygen
from pzq.protocols import phpmq

from conftest import ended, free_tcp_endpoint, wait_until

HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'.replace(" ", "_")


@pytest.fixture
def console(make_server, tmp_path):
    """make(*console options, **server overrides) -> (server, console process); stopped after the test,
    each asserted to end with status 0 on SIGTERM."""
    made: list[ConsoleProcess] = []

    def make(*extra: str, **overrides):
        srv = make_server(**overrides)
        process = ConsoleProcess(tmp_path, srv.monitor, *extra)
        made.append(process)
        return srv, process

    yield make
    for process in made:
        assert process.stop() == 0, process.text()


def test_rates_are_the_counters_differences_over_the_seconds_between_samples():
    history = History()
    history.add(100.0, {"produced_total": 0, "acked_total": 0, "messages": 1, "commit_ms_last": 0.5})
    history.add(101.0, {"produced_total": 500, "acked_total": 100, "messages": 401, "commit_ms_last": 0.7})
    history.add(103.0, {"produced_total": 900, "acked_total": 100, "messages": 801, "commit_ms_last": 0.9})
    series = history.series()
    assert series["produced_total"] == {"t": [101.0, 103.0], "v": [500.0, 200.0]}
    assert series["acked_total"] == {"t": [101.0, 103.0], "v": [100.0, 0.0]}
    assert series["messages"]["v"] == [1.0, 401.0, 801.0] and series["commit_ms"]["v"] == [0.5, 0.7, 0.9]


def test_the_history_keeps_five_minutes_of_polls_an_hour_and_a_day_downsampled_and_no_more():
    history = History()
    day = 2 * 24 * 3600  # (two days of one poll a second)
    for second in range(0, day, 1):
        history.add(float(second), {"produced_total": 2 * second, "commit_ms_last": 1.0 if second % 600 else 9.0})
    last = day - 1
    for name, span, most in (("5m", 300, 302), ("1h", 3600, 362), ("24h", 86400, 290)):
        points = history.series(name)["produced_total"]
        assert points["t"][0] >= last - span - 300 and points["t"][-1] == last, name
        assert len(points["t"]) <= most, name
        assert set(points["v"]) == {2.0}, f"{name}: a downsampled rate is the rate over its step"
    assert max(history.series("24h")["commit_ms"]["v"]) == 9.0, "a day's chart keeps the worst commit of each step"
    assert history.series("nonsense") == history.series("5m")
    history = History()
    for second in range(0, 3 * 3600, 1):
        history.add(float(second), {"queues": {"q": {"depth": second}}})
    for name, span in (("5m", 300), ("1h", 3600), ("24h", 86400)):
        depth = history.queue_series("q", 3 * 3600.0, {"depth": 7}, name)["depth"]
        assert depth["t"][0] >= 3 * 3600 - span - QUEUE_EVERY_S and len(depth["t"]) <= 75, name
        assert depth["v"][-1] == 7.0, "a queue's chart ends with the page's figure"


def test_every_page_answers_200_and_head_answers_the_same_headers_without_a_body(console):
    srv, process = console()
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(10)))
    for path in ("/", "/queues", "/queue?name=default", "/clients", "/login", "/static/console.js"):
        connection = http.client.HTTPConnection("127.0.0.1", process.port, timeout=10)
        connection.request("GET", path)
        got = connection.getresponse()
        body = got.read()
        connection.request("HEAD", path)
        head = connection.getresponse()
        assert (got.status, head.status) == (200, 200), path
        assert head.read() == b"" and head.getheader("content-type") == got.getheader("content-type"), path
        connection.close()
        if path.startswith("/static"):
            continue
        assert b'<script src="/static/console.js" defer></script>' in body and b"<script>" not in body, path
        assert got.getheader("cache-control") == "no-store" and got.getheader("x-frame-options") == "DENY"
        csp = got.getheader("content-security-policy")
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp


def test_each_page_has_a_json_twin_with_the_figures_the_page_shows(console):
    srv, process = console()
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(10)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(4):
            consumer.ack(consumer.receive(timeout_s=5))
    browser = Browser(process.url)

    def settled() -> dict | None:
        data = json.loads(browser.get("/api/overview")[1])
        return data if data["figures"]["messages"] == 6 and data["figures"]["acked_total"] == 4 else None

    overview = wait_until(settled, timeout_s=10, interval_s=0.1)
    assert overview["figures"]["produced_total"] == 10
    assert set(overview["charts"]) == {"produced_total", "delivered_total", "acked_total", "messages", "commit_ms"}
    messages = overview["charts"]["messages"]
    assert messages["v"][-1] == 6.0 and len(messages["t"]) == len(messages["v"]), "the chart ends at the figure"
    queues = json.loads(browser.get("/api/queues?sort=depth&order=desc")[1])
    assert queues["rows"][0]["name"] == "default" and queues["rows"][0]["depth"] == 6
    queue = json.loads(browser.get("/api/queue?name=default")[1])
    assert queue["figures"]["depth"] == 6 and queue["charts"]["depth"]["v"][-1] == 6.0
    assert queue["snapshot"]["at"] == queue["charts"]["depth"]["t"][-1], "figures and charts of one snapshot"
    page = browser.get("/queue?name=default")[1]
    assert re.search(r'data-figure="depth" data-unit="count" title="6">6<', page)
    clients = json.loads(browser.get("/api/clients")[1])
    assert clients["page"] == "clients" and "figures" in clients


def test_an_unknown_path_and_an_unknown_queue_get_a_404_page_with_a_way_back(console):
    _, process = console()
    browser = Browser(process.url)
    for path in ("/nothing", "/../../etc/passwd", "/queue?name=nosuch", "/queue", "/queue?name=a%20b"):
        status, page = browser.get(path)
        assert status == 404, path
        assert '<a href="/queues">Back to the queues</a>' in page, path
    assert "There is no queue &#39;nosuch&#39; on this server." in browser.get("/queue?name=nosuch")[1]
    status, body = browser.get("/api/queue?name=nosuch")
    assert status == 404 and json.loads(body)["status"] == 404
    status, _, _ = browser.open("/queues", method="PUT")
    assert status == 405


def test_a_hostile_queue_name_and_body_are_shown_as_text_never_as_markup(console):
    api_dsn, _ = free_tcp_endpoint()
    srv, process = console(api_dsn=api_dsn)
    with ApiClient(api_dsn) as api:
        api.produce([(HOSTILE, b"<b>bold</b><script>alert(3)</script>")])
    browser = Browser(process.url)

    def listed() -> str | None:
        page = browser.get("/queues")[1]
        return page if "onerror" in page else None

    page = wait_until(listed, timeout_s=10)
    assert "<script>alert" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img_src=x_onerror=alert(2)&gt;" in page
    status, queue = browser.get("/queue?" + urllib.parse.urlencode({"name": HOSTILE}))
    assert status == 200 and "<script>alert" not in queue and "<b>bold" not in queue
    twin = json.loads(browser.get("/api/queues")[1])
    assert twin["rows"][-1]["name"] in (HOSTILE, "default")


def test_a_host_name_not_the_consoles_own_is_refused_with_421_as_dns_rebinding_would(console):
    _, process = console("--http-host-names", "pzq.example.org")

    def status(host: str) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", process.port, timeout=10)
        connection.request("GET", "/", headers={"Host": host})
        answer = connection.getresponse()
        answer.read()
        connection.close()
        return answer.status

    assert status("attacker.example.com") == 421
    assert status(f"attacker.example.com:{process.port}") == 421
    assert status(f"127.0.0.1:{process.port}") == 200 and status(f"localhost:{process.port}") == 200
    assert status("pzq.example.org") == 200 and status("[::1]") == 200


def test_fifty_browsers_at_once_leave_the_requests_to_pzq_at_one_stats_a_poll(console):
    srv, process = console()
    browser = Browser(process.url)
    before = json.loads(browser.get("/api/console")[1])
    paths = ["/", "/api/overview", "/queues", "/queue?name=default", "/api/queue?name=default", "/clients"]
    started = time.monotonic()

    def hammer(i: int) -> list[int]:  # (each browser from an address of its own: 127.0.0.2 to 127.0.0.51)
        connection = http.client.HTTPConnection(
            "127.0.0.1", process.port, timeout=15, source_address=(f"127.0.0.{i + 2}", 0)
        )
        statuses = []
        for n in range(12):
            connection.request("GET", paths[(i + n) % len(paths)])
            answer = connection.getresponse()
            answer.read()
            statuses.append(answer.status)
        connection.close()
        return statuses

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        statuses = [s for got in pool.map(hammer, range(50)) for s in got]
    seconds = time.monotonic() - started
    after = json.loads(browser.get("/api/console")[1])
    assert set(statuses) <= {200, 503} and statuses.count(200) > len(statuses) // 2, statuses
    polls = after["requests_sent"]["STATS"] - before["requests_sent"].get("STATS", 0)
    assert polls <= seconds / 0.5 + 3, f"{polls} STATS in {seconds:.1f} s (one every 0.5 s)"
    reads = sum(n for name, n in after["requests_sent"].items() if name != "STATS") - sum(
        n for name, n in before["requests_sent"].items() if name != "STATS"
    )
    # (at most a read of each of the 5 texts a second, each cached for a second)
    assert reads <= 5 * (seconds + 2), f"{reads} reads in {seconds:.1f} s for {len(statuses)} page views"


@pytest.mark.slow
def test_pages_say_busy_with_503_when_reads_already_wait_on_a_pzq_that_does_not_answer(console):
    srv, process = console()
    browser = Browser(process.url)
    wait_until(lambda: json.loads(browser.get("/api/overview")[1])["figures"]["queues"] == 1, timeout_s=10)
    srv.stop()  # (pzq stops answering: every read waits its 5 s out)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(lambda p: Browser(process.url).get(p)[0], ["/clients", "/queue?name=default"] * 3))
    assert 503 in statuses, statuses

    def failure_shown() -> str | None:  # (once the poll in flight has waited its 5 s out)
        status, page = browser.get("/")
        return page if status == 200 and "no answer from pzq" in page else None

    page = wait_until(failure_shown, timeout_s=15, interval_s=0.2)
    assert 'data-figure="queues" data-unit="count" title="1">1<' in page, (
        "the overview shows the last figures and the failure"
    )


def test_half_sent_requests_held_open_from_one_address_never_refuse_a_page_load_from_that_address(console):
    _, process = console()
    half = []
    for _ in range(MOST + 40):  # (more than the console keeps open: every one from 127.0.0.1)
        raw = socket.create_connection(("127.0.0.1", process.port), timeout=5)
        raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        half.append(raw)
    try:
        served = []
        for _ in range(40):
            page = http.client.HTTPConnection("127.0.0.1", process.port, timeout=10)
            page.request("GET", "/")
            served.append(page.getresponse().status)
            page.close()
        assert served == [200] * 40
        assert ended(half[:40], 10) == [True] * 40, "the longest waiting half-sent requests were closed"
    finally:
        for raw in half:
            raw.close()
    figures = json.loads(Browser(process.url).get("/api/console")[1])
    assert figures["connections_evicted_total"] >= 40 and figures["connections_open"] <= MOST


def test_an_idle_kept_alive_connection_is_closed_first_to_make_room_and_a_new_request_is_served(console):
    _, process = console()
    slow = http.client.HTTPConnection("127.0.0.1", process.port, timeout=10)
    slow.request("GET", "/api/overview")
    answer = slow.getresponse()  # (answered: the connection now waits for its next request)
    answer.read()
    half = [socket.create_connection(("127.0.0.1", process.port), timeout=5) for _ in range(MOST)]
    try:
        for raw in half:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert ended([slow.sock], 10) == [True], "the idle kept-alive one waited longest: closed first"
        fast = http.client.HTTPConnection("127.0.0.1", process.port, timeout=10)
        fast.request("GET", "/")
        assert fast.getresponse().status == 200
        fast.close()
    finally:
        for raw in half:
            raw.close()
        slow.close()


@pytest.mark.slow
def test_a_request_sent_a_byte_at_a_time_is_cut_off_at_its_deadline(console):
    _, process = console()
    slow = socket.create_connection(("127.0.0.1", process.port), timeout=5)
    started, closed_at = time.monotonic(), None
    try:
        for byte in b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 60:
            slow.sendall(bytes([byte]))
            readable, _, _ = select.select([slow], [], [], 0.5)  # (a byte each half second, unless it closed)
            if readable and slow.recv(1) == b"":
                closed_at = time.monotonic()
                break
    except (BrokenPipeError, ConnectionResetError):
        closed_at = time.monotonic()
    finally:
        slow.close()
    assert closed_at is not None and REQUEST_S - 1 < closed_at - started < REQUEST_S + 5


def test_the_console_stops_with_status_0_when_its_stdin_pipe_ends_as_when_pzq_serve_is_killed(server, tmp_path):
    process = ConsoleProcess(tmp_path, server.monitor, keep_stdin=True)
    assert Browser(process.url).get("/")[0] == 200
    assert process.proc.stdin is not None
    process.proc.stdin.close()  # (what the kernel does when the server holding the other end dies)
    assert process.proc.wait(15) == 0
    assert "standard input closed (pzq serve is gone): stopping" in process.text()


def test_a_port_in_use_is_one_clear_line_and_a_non_zero_exit(server, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "pzq", "console", "--http-dsn", f"http://127.0.0.1:{port}"]
            + ["--monitor-dsn", server.monitor],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        f"pzq: error: --http-dsn http://127.0.0.1:{port}: cannot listen: Address already in use"
    )


def test_the_console_serves_while_pzq_is_not_there_yet_and_ends_with_status_0_on_sigterm(tmp_path):
    process = ConsoleProcess(tmp_path, f"ipc://{tmp_path}/nobody-here")
    try:
        status, page = Browser(process.url).get("/")
        assert status == 200 and "no answer from pzq" in page
    finally:
        assert process.stop() == 0
    assert "console: serving" in process.text() and "console: stopped" in process.text()


def test_the_clients_page_lists_phpmq_connections_with_peer_address_and_age_a_page_at_a_time(console):
    tcp, (host, port) = free_tcp_endpoint()
    srv, process = console(phpmq_dsn=tcp)
    connections = [socket.create_connection((host, port), timeout=5) for _ in range(250)]
    try:
        connections[0].sendall(phpmq.encode(phpmq.CONSUME, [(phpmq.QUEUE, b"default"), (phpmq.COUNT, b"5")]))
        mine = f"127.0.0.1:{connections[0].getsockname()[1]}"
        browser = Browser(process.url)

        def listed() -> str | None:
            page = browser.get("/clients")[1]
            return page if "Connections (250)" in page else None

        page = wait_until(listed, timeout_s=15, interval_s=0.2)
        rows = re.findall(
            r'<td class="text">(127\.0\.0\.1:\d+)</td><td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)</td>', page
        )
        assert len(rows) == 100 and ">connected since</th>" in page, "a page of 100 rows, each with its age"
        following = browser.get("/clients?offset=200")[1]
        assert len(re.findall(r'<td class="text">127\.0\.0\.1:\d+</td>', following)) == 50 and 'rel="prev"' in following

        def consuming() -> str | None:
            page = browser.get("/queue?name=default")[1]
            return page if mine in page else None

        queue = wait_until(consuming, timeout_s=10)
        assert re.search(
            rf'<td class="name">phpmq</td><td class="text">\w+</td><td class="text">{mine}</td><td>\d{{4}}-', queue
        )
    finally:
        for connection in connections:
            connection.close()


def test_the_queues_page_shows_a_thousand_queues_a_hundred_a_page_sorted_by_any_column(console):
    api_dsn, _ = free_tcp_endpoint()
    srv, process = console(api_dsn=api_dsn)
    for first in range(0, 1000, 100):  # (each client may make 100 queues: its share of --max-queues)
        with ApiClient(api_dsn) as api:
            api.produce([(f"q{n:04d}", b"x") for n in range(first, first + 100) for _ in range(n % 3 + 1)])
    browser = Browser(process.url)
    wait_until(lambda: json.loads(browser.get("/api/queues")[1])["paging"]["total"] >= 1000, timeout_s=15)
    started = time.monotonic()
    status, page = browser.get("/queues?sort=depth&order=desc&page=3")
    assert status == 200 and time.monotonic() - started < 5
    assert "page 3 of 11" in page and len(re.findall(r'<td class="name" data-queue=', page)) == 100
    depths = [int(d) for d in re.findall(r'data-column="depth" title="\d+">(\d+)<', page)]
    assert depths == sorted(depths, reverse=True) and depths[0] <= 3
    assert 'rel="next" href="/queues?sort=depth&amp;order=desc&amp;page=4"' in page
    found = json.loads(browser.get("/api/queues?filter=q09&sort=name")[1])
    assert [r["name"] for r in found["rows"]] == [f"q{n:04d}" for n in range(900, 1000)]


@pytest.fixture
def curve_keys(tmp_path):
    """Key pairs of the server, of an allowed console and of a stranger; the allowed public keys' dir."""
    for name in ("server", "console", "mallory"):
        keygen(str(tmp_path / name), name)
    (tmp_path / "clients").mkdir()
    shutil.copy(tmp_path / "console" / "console.key", tmp_path / "clients")
    return tmp_path


def test_with_curve_the_console_reads_pzq_with_its_own_key_from_a_file_or_stdin_and_a_strangers_reads_nothing(
    make_server, curve_keys, tmp_path
):
    keys = curve_keys
    srv = make_server(curve_secret_key=str(keys / "server" / "server.key_secret"), curve_clients=str(keys / "clients"))
    server_public = zmq.auth.load_certificate(str(keys / "server" / "server.key"))[0].decode()
    public, secret = zmq.auth.load_certificate(str(keys / "console" / "console.key_secret"))
    started = [
        ConsoleProcess(
            tmp_path,
            srv.monitor,
            "--curve-client-key",
            str(keys / "console" / "console.key_secret"),
            "--curve-server-key",
            str(keys / "server" / "server.key"),
        ),
        ConsoleProcess(
            tmp_path,
            srv.monitor,
            "--curve-key-stdin",
            "--curve-server-key",
            server_public,
            stdin=f"{public.decode()} {secret.decode()}\n",
            keep_stdin=True,  # (as pzq serve does: its end of file means the server is gone)
        ),
        ConsoleProcess(
            tmp_path,
            srv.monitor,
            "--curve-client-key",
            str(keys / "mallory" / "mallory.key_secret"),
            "--curve-server-key",
            server_public,
        ),
    ]
    try:
        for process in started[:2]:
            overview = json.loads(Browser(process.url).get("/api/overview")[1])
            assert overview["snapshot"]["error"] == "" and overview["figures"]["queues"] == 1, process.text()
        stranger = json.loads(Browser(started[2].url).get("/api/overview")[1])
        assert "no answer from pzq" in stranger["snapshot"]["error"] and stranger["figures"]["queues"] == 0
    finally:
        assert [process.stop() for process in started] == [0, 0, 0]


@pytest.mark.parametrize(
    ("options", "stdin", "said"),
    [
        (
            ["--curve-key-stdin", "--curve-server-key", "," * 40],
            f"{'a' * 40} {'b' * 40}\n",
            "--curve-server-key: neither",
        ),
        (
            ["--curve-key-stdin", "--curve-server-key", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"],
            "nonsense\n",
            "expected one",
        ),
        (["--curve-key-stdin"], "", "--curve-server-key needs"),
        (["--poll-interval", "0.1s"], "", "--poll-interval: 0.1 s is not between"),
    ],
)
def test_a_bad_key_or_poll_interval_is_one_clear_line_and_a_non_zero_exit(tmp_path, options, stdin, said):
    done = subprocess.run(
        [sys.executable, "-m", "pzq", "console", "--http-dsn", "http://127.0.0.1:1"]
        + ["--monitor-dsn", f"ipc://{tmp_path}/m", *options],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, done.stderr


def test_the_package_data_ships_every_template_and_static_file_and_uplots_licence():
    import configparser
    import fnmatch
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    setup = configparser.ConfigParser()
    setup.read(root / "setup.cfg")
    patterns = [p.strip() for p in setup["options.package_data"]["pzq.console"].split(",")]
    package = root / "pzq" / "console"
    files = [str(f.relative_to(package)) for d in ("static", "templates") for f in (package / d).iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in files), (files, patterns)
    assert {"static/uPlot.iife.min.js", "static/uPlot.min.css", "static/uPlot.LICENSE"} <= set(files)
    install = setup["options"]["install_requires"]
    assert all(name in install for name in ("starlette>=", "uvicorn>=", "jinja2>=", "python-multipart>="))


def test_the_console_takes_its_endpoints_and_host_names_from_the_servers_config_file(server, tmp_path):
    port = free_port()
    settings = tmp_path / "pzq.toml"
    settings.write_text(
        f'http_dsn = "http://127.0.0.1:{port}"\nmonitor_dsn = "{server.monitor}"\nhttp_host_names = "cfg.example"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pzq", "console", "--config", str(settings)],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _connects(port), timeout_s=20, interval_s=0.05)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/api/overview", headers={"Host": "cfg.example"})
        answer = connection.getresponse()
        assert answer.status == 200 and json.loads(answer.read())["figures"]["queues"] == 1
        connection.close()
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def test_a_snapshots_queue_rows_are_sorted_once_per_order_and_every_page_of_it_reads_the_same_rows():
    figures = {
        f"q{i:04d}": {"depth": i % 7, "inflight": 0, "dead_letters": 0, "bytes": i, "oldest_age_s": 0.0}
        for i in range(250)
    }
    snap = Snapshot({"queues": figures}, 1.0, 1)
    first, second = views.queues(snap, "depth", True, 1), views.queues(snap, "depth", True, 2)
    assert [r["depth"] for r in first["rows"] + second["rows"]] == sorted((i % 7 for i in range(250)), reverse=True)[
        :200
    ]
    assert views.queues(snap, "depth", True, 1)["rows"][0] is first["rows"][0], "sorted once for the snapshot"
    by_name = views.queues(snap, "name", False, 1, contains="q02")
    assert [r["name"] for r in by_name["rows"]] == [f"q{i:04d}" for i in range(200, 250)]
    later = Snapshot({"queues": {**figures, "q0000": {**figures["q0000"], "depth": 99}}}, 2.0, 2)
    assert views.queues(later, "depth", True, 1)["rows"][0]["name"] == "q0000", "a new snapshot, new rows"


def test_every_line_a_console_process_logs_comes_from_the_logger_pzq_console(make_server, tmp_path):
    """uvicorn's own lines (startup, shutdown) included: they came from ``uvicorn.error``."""
    srv = make_server()
    process = ConsoleProcess(tmp_path, srv.monitor)
    try:
        assert Browser(process.url).get("/")[0] == 200
    finally:
        assert process.stop() == 0, process.text()
    lines = [line for line in process.text().splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
    loggers = {line.split(" ")[3].rstrip(":") for line in lines}
    assert loggers == {"pzq.console"}, process.text()
    assert any("Application startup complete" in line for line in lines), "uvicorn's lines are kept, renamed"


def test_the_json_twins_give_numbers_as_numbers_with_their_units_apart_and_each_queues_rates(console):
    srv, process = console()
    browser = Browser(process.url)
    with client.Producer(srv.receive) as producer, client.Consumer(srv.send) as consumer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(50)))
        for _ in range(20):
            consumer.ack(consumer.receive(timeout_s=5))

        def rated() -> dict | None:
            row = json.loads(browser.get("/api/queues")[1])["rows"][0]
            return row if row["in_per_s"] > 0 and row["out_per_s"] > 0 else None

        row = wait_until(rated, timeout_s=15, interval_s=0.2)
    assert isinstance(row["in_per_s"], float) and isinstance(row["out_per_s"], float)
    assert row["in_per_s"] == pytest.approx(5.0, abs=0.6) and row["out_per_s"] == pytest.approx(2.0, abs=0.3), (
        "50 in and 20 acked over the last 10 s"
    )
    queue = json.loads(browser.get("/api/queue?name=default")[1])
    assert isinstance(queue["figures"]["in_per_s"], float) and queue["units"]["in_per_s"] == "msg/s"
    for path in ("/api/overview", "/api/queues", "/api/queue?name=default", "/api/clients"):
        twin = json.loads(browser.get(path)[1])
        assert set(twin["figures"]) == set(twin["units"]), path
        for key, value in twin["figures"].items():
            assert value is None or (isinstance(value, int | float) and not isinstance(value, bool)), (path, key, value)
            assert twin["units"][key] in ("count", "msg/s", "bytes", "s", "ms", "time_us"), (path, key)
    overview = json.loads(browser.get("/api/overview")[1])
    assert isinstance(overview["figures"]["inflight"], int) and overview["units"]["produce_rate"] == "msg/s"
    assert isinstance(overview["figures"]["produce_rate"], float)
    assert overview["figures"]["store_limit_bytes"] == srv.stats()["store_limit_bytes"]
    dead = queue["dead"]
    assert dead["page"] == 1 and dead["links"] == {} and isinstance(dead["total"], int)


def test_the_poller_stops_even_when_a_cancel_is_swallowed_as_python_311s_wait_for_does():
    import asyncio

    from pzq.console.reader import Reader

    class Link:  # (its request swallows the first cancel, as wait_for does when its waited-for completes then)
        swallowed = 0
        asked: asyncio.Event

        async def request(self, text):
            Link.asked.set()
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                if not Link.swallowed:
                    Link.swallowed += 1
                    return {"queues": {}}
                raise
            return {"queues": {}}

    async def run() -> float:
        Link.asked = asyncio.Event()
        reader = Reader(Link(), poll_s=0.01)
        reader.start()
        await asyncio.wait_for(Link.asked.wait(), 5)  # (the poller waits on pzq: the cancel comes there)
        began = time.monotonic()
        await asyncio.wait_for(reader.stop(), 5)  # (before: it never returned, the poller polling on)
        return time.monotonic() - began

    assert asyncio.run(run()) < 5 and Link.swallowed == 1
