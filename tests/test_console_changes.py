"""Changing things through the web console: the login, its throttle and sessions, CSRF, and the
requeue, delete and purge a logged-in operator makes, against a real server over HTTP."""

from __future__ import annotations

import http.cookiejar
import json
import logging
import re
import signal
import socket
import urllib.error
import urllib.parse
import urllib.request

import pytest

from pzq.clients import native as client
from pzq.console import auth
from pzq.errors import ConfigError

from conftest import free_tcp_endpoint, wait_until

SECRET = "correct horse battery staple"


class Browser:
    """A person at a browser: keeps the session cookie, follows the redirect after a form."""

    def __init__(self, url: str):
        self.url = url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def open(self, path: str, form: dict | None = None, headers: dict | None = None) -> tuple[int, str]:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers or {})
        try:
            with self.opener.open(request, timeout=15) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def log_in(self, secret: str = SECRET) -> tuple[int, str]:
        return self.open("/login", {"secret": secret})

    def csrf(self, path: str = "/") -> str:
        found = re.search(r'name=csrf value="([^"]+)"', self.open(path)[1])
        assert found, "a logged-in page carries the session's CSRF token"
        return found.group(1)


@pytest.fixture
def console(make_server, tmp_path):
    """make(**overrides) -> (server, console url) with a login secret in a private file."""
    secret_file = tmp_path / "console.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)

    def make(**overrides):
        tcp, _ = free_tcp_endpoint()
        url = tcp.replace("tcp://", "http://")
        return make_server(http_dsn=url, http_auth_file=str(secret_file), **overrides), url

    return make


def dead_letters(srv, count: int) -> list[str]:
    """``count`` messages of queue "default" sent to the dead letters the way a user meets them: each
    delivered once, never acknowledged, and out of deliveries (--max-deliveries 1) when it comes back."""
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"dead %d" % i] for i in range(count)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(count):
            consumer.receive(5000)  # (not acknowledged: back after the ack timeout, then dead)
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == count, timeout_s=15)
    letters = json.loads(client.monitor_request(srv.monitor, "DEADLETTERS default"))
    return [letter["id"] for letter in letters]


def operator_with_dead_letters(console, count: int) -> tuple:
    """(server, console url, a logged-in Browser) with ``count`` dead letters in queue "default"."""
    srv, url = console(max_deliveries=1, ack_timeout=0.2)
    dead_letters(srv, count)
    browser = Browser(url)
    assert "Log out" in browser.log_in()[1]
    return srv, url, browser


def test_a_secret_file_must_hold_a_secret_of_twelve_bytes_or_more(tmp_path):
    short = tmp_path / "short"
    short.write_text("hunter2\n")
    with pytest.raises(ConfigError, match="12 to 4096 bytes"):
        auth.read_secret(str(short))
    with pytest.raises(ConfigError, match="cannot read it"):
        auth.read_secret(str(tmp_path / "missing"))


def test_a_secret_file_others_may_read_is_accepted_with_a_warning(tmp_path, caplog):
    loose = tmp_path / "loose"
    loose.write_text("  a long enough secret  \nsecond line ignored\n")
    loose.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="pzq.console"):
        assert auth.read_secret(str(loose)) == b"a long enough secret"
    assert "chmod 600" in caplog.text


def test_five_wrong_secrets_from_one_address_throttle_it_for_a_minute_but_not_the_others():
    now = [0.0]
    logins = auth.Logins(b"the right secret", clock=lambda: now[0])
    for _ in range(auth.FAILURES_PER_ADDRESS):
        assert not logins.throttled("10.0.0.1")
        assert logins.log_in(b"guess", "10.0.0.1") is None
    assert logins.throttled("10.0.0.1") and not logins.throttled("10.0.0.2")
    now[0] += auth.FAILURE_WINDOW_S + 1
    assert not logins.throttled("10.0.0.1")
    assert logins.log_in(b"the right secret", "10.0.0.1") is not None


def test_a_session_ends_eight_hours_after_its_login_and_at_its_logout():
    now = [0.0]
    logins = auth.Logins(b"the right secret", clock=lambda: now[0])
    first, second = logins.log_in(b"the right secret", "a"), logins.log_in(b"the right secret", "a")
    assert first and second and first != second
    session = logins.session(first)
    assert session is not None and logins.csrf_ok(session, session.csrf) and not logins.csrf_ok(session, "x")
    logins.log_out(second)
    assert logins.session(second) is None
    now[0] += auth.SESSION_S
    assert logins.session(first) is None


@pytest.mark.slow
def test_without_an_auth_file_the_console_refuses_every_change(make_server):
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    make_server(http_dsn=url)
    browser = Browser(url)
    assert "read-only" in browser.open("/")[1]
    status, text = browser.open("/queue/purge", {"name": "default", "confirm": "yes"})
    assert status == 403 and "read-only" in text
    assert browser.log_in()[0] == 403


@pytest.mark.slow
def test_an_operator_logs_in_and_requeues_one_dead_letter_which_a_consumer_then_gets(console, caplog):
    # (writes nobody waits for are committed within 2 s: the page must show them all the same)
    srv, url = console(max_deliveries=1, ack_timeout=0.2, commit_interval=2.0)
    ids = dead_letters(srv, 2)
    browser = Browser(url)
    status, page = browser.log_in()
    assert status == 200 and "Log out" in page
    queue_page = browser.open("/queue?name=default")[1]
    assert queue_page.count('data-action="/queue/requeue"') == 3  # one per letter, and "all"
    with caplog.at_level(logging.INFO, logger="pzq.console"):
        status, page = browser.open(
            "/queue/requeue", {"name": "default", "which": ids[0], "csrf": browser.csrf("/queue?name=default")}
        )
    assert status == 200 and "requeued 1 dead letter(s) of queue &#x27;default&#x27;" in page
    assert re.search(r"console: requeued 1 dead letter\(s\) of queue 'default' \(by 127\.0\.0\.1", caplog.text)
    # Answered after the commit: the monitor sees it at once, with no wait for the next snapshot.
    assert srv.stats()["queues"]["default"]["dead_letters"] == 1 and srv.stats()["queues"]["default"]["depth"] == 1
    with client.Consumer(srv.send) as consumer:
        message = consumer.receive(5000)
        assert message.body == [b"dead 0"]
        consumer.ack(message)
    assert ids[0] not in browser.open("/queue?name=default")[1]


@pytest.mark.slow
def test_a_change_without_the_sessions_csrf_token_or_from_another_site_is_refused_and_logged(console, caplog):
    srv, url, browser = operator_with_dead_letters(console, 1)
    csrf = browser.csrf()
    form = {"name": "default", "which": "all"}
    with caplog.at_level(logging.WARNING, logger="pzq.console"):
        assert browser.open("/queue/requeue", form)[0] == 403
        assert browser.open("/queue/requeue", {**form, "csrf": csrf + "x"})[0] == 403
        evil = {"Origin": "http://evil.example"}
        assert browser.open("/queue/requeue", {**form, "csrf": csrf}, headers=evil)[0] == 403
        cross = {"Sec-Fetch-Site": "cross-site"}
        assert browser.open("/queue/requeue", {**form, "csrf": csrf}, headers=cross)[0] == 403
        assert Browser(url).open("/queue/requeue", {**form, "csrf": csrf})[0] == 403  # (no session cookie)
    assert caplog.text.count("change refused") == 5
    assert srv.stats()["queues"]["default"]["dead_letters"] == 1
    status, page = browser.open("/queue/requeue", {**form, "csrf": csrf})
    assert status == 200 and srv.stats()["queues"]["default"]["dead_letters"] == 0


def test_a_login_and_a_logout_are_logged_at_info_and_only_a_failed_login_warns(console, caplog):
    _, url = console()
    browser = Browser(url)
    with caplog.at_level(logging.INFO, logger="pzq.console"):
        assert browser.log_in("a wrong guess")[0] == 403
        assert browser.log_in()[0] == 200
        assert browser.open("/logout", {"csrf": browser.csrf()})[0] == 200
    levels = {r.getMessage(): r.levelname for r in caplog.records if r.name.startswith("pzq.console")}
    assert levels == {
        "console: failed login from 127.0.0.1": "WARNING",
        "console: login from 127.0.0.1": "INFO",
        "console: 127.0.0.1 logged out": "INFO",
    }


@pytest.mark.slow
def test_a_wrong_secret_is_refused_and_the_sixth_try_in_a_minute_is_not_even_checked(console, caplog):
    _, url = console()
    browser = Browser(url)
    with caplog.at_level(logging.WARNING, logger="pzq.console"):
        for _ in range(auth.FAILURES_PER_ADDRESS):
            status, page = browser.log_in("a wrong guess")
            assert status == 403 and "wrong secret" in page
        assert browser.log_in()[0] == 429  # (even the right secret waits out the minute)
    assert caplog.text.count("failed login from 127.0.0.1") == auth.FAILURES_PER_ADDRESS
    assert "Log out" not in browser.open("/")[1]


@pytest.mark.slow
def test_deleting_every_dead_letter_needs_the_box_ticked(console):
    srv, _, browser = operator_with_dead_letters(console, 3)
    form = {"name": "default", "which": "all", "csrf": browser.csrf()}
    status, page = browser.open("/queue/delete", form)
    assert "nothing deleted: tick the box" in page and srv.stats()["queues"]["default"]["dead_letters"] == 3
    status, page = browser.open("/queue/delete", {**form, "confirm": "yes"})
    assert "deleted 3 dead letter(s)" in page
    figures = srv.stats()["queues"]["default"]
    assert (figures["dead_letters"], figures["depth"]) == (0, 0)


@pytest.mark.slow
def test_a_purge_deletes_every_ready_message_over_turns_and_leaves_the_one_in_flight(console):
    srv, url = console(ack_timeout=60.0)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(12_000)))
    with client.Consumer(srv.send) as consumer:
        held = consumer.receive(5000)  # in flight, unacknowledged, while the purge runs
        browser = Browser(url)
        browser.log_in()
        form = {"name": "default", "csrf": browser.csrf()}
        assert "not purged: tick the box" in browser.open("/queue/purge", form)[1]
        status, page = browser.open("/queue/purge", {**form, "confirm": "yes"})
        first_share = re.search(r"purged (\d+) ready message\(s\) of queue &#x27;default&#x27;; the rest follows", page)
        assert status == 200 and first_share and 0 < int(first_share.group(1)) <= 5000
        inflight = srv.stats()["messages_inflight"]
        assert wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == inflight, timeout_s=10)
        consumer.ack(held)
        assert wait_until(lambda: srv.stats()["messages"] == inflight - 1, timeout_s=10)


@pytest.mark.slow
def test_a_page_asked_for_by_a_host_name_not_its_own_is_refused_as_dns_rebinding_would(console):
    _, url = console(http_host_names="pzq.example.com, other.example")
    port = int(url.rsplit(":", 1)[1])

    def status(host: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        return answer.split(b" ", 2)[1]

    assert status(b"rebound.evil.example:%d" % port) == b"421"
    assert status(b"pzq.example.com.evil.example") == b"421"
    for ours in (
        b"127.0.0.1:%d" % port,
        b"LOCALHOST.:%d" % port,
        b"[::1]:%d" % port,
        b"PZQ.example.com",
        b"other.example:443",
    ):
        assert status(ours) == b"200", ours


@pytest.mark.slow
def test_the_clients_page_lists_each_phpmq_connection(console):
    tcp, (host, port) = free_tcp_endpoint()
    _, url = console(phpmq_dsn=tcp)

    def listed() -> str | None:
        page = Browser(url).open("/clients")[1]
        return page if "Connections (2)" in page else None

    with socket.create_connection((host, port), timeout=5), socket.create_connection((host, port), timeout=5):
        page = wait_until(listed, timeout_s=10, interval_s=0.1)
    assert 'data-clients="phpmq"' in page and "Connections (2)" in page
    assert re.search(r'data-figure="connections">2<', page), "the figures are as fresh as the list"


def test_a_rotated_secret_ends_every_session():
    logins = auth.Logins(b"the first secret")
    key = logins.log_in(b"the first secret", "a")
    assert not logins.replace_secret(b"the first secret") and logins.session(key) is not None
    assert logins.replace_secret(b"the second secret")
    assert logins.session(key) is None and logins.log_in(b"the first secret", "a") is None
    assert logins.log_in(b"the second secret", "a") is not None


def test_an_auth_file_without_a_console_is_refused_at_start(tmp_path):
    from pzq.config import Config

    with pytest.raises(ConfigError, match="--http-dsn is not set"):
        Config(database=str(tmp_path / "db"), http_auth_file=str(tmp_path / "secret")).validate()


@pytest.mark.slow
def test_sighup_rereads_the_secret_file_and_a_changed_secret_shuts_out_the_old_sessions(process_server, tmp_path):
    secret = tmp_path / "console.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    srv = process_server("--http-dsn", url, "--http-auth-file", str(secret))
    browser = Browser(url)
    assert "Log out" in browser.log_in()[1]
    secret.write_text("a brand new secret, rotated\n")
    srv.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "every session has ended" in srv.log.read_text(), timeout_s=10)
    assert "Log out" not in browser.open("/")[1]
    assert browser.log_in()[0] == 403
    assert "Log out" in Browser(url).log_in("a brand new secret, rotated")[1]


def test_a_flood_of_wrong_guesses_from_many_addresses_does_not_lock_out_an_operator_who_logged_in_before():
    logins = auth.Logins(b"the right secret")
    assert logins.log_in(b"the right secret", "10.0.0.1")
    for i in range(auth.FAILURES_IN_ALL):
        logins.log_in(b"guess", f"192.0.2.{i}")
    assert logins.throttled("198.51.100.7"), "a newcomer waits out the minute"
    assert not logins.throttled("10.0.0.1") and logins.log_in(b"the right secret", "10.0.0.1")


def test_the_addresses_of_one_ipv6_64_count_as_one_against_the_throttle():
    logins = auth.Logins(b"the right secret")
    for i in range(auth.FAILURES_PER_ADDRESS):
        assert logins.log_in(b"guess", f"2001:db8:1:2::{i + 1:x}") is None
    assert logins.throttled("2001:db8:1:2:ffff::1") and not logins.throttled("2001:db8:1:3::1")
    assert logins.log_in(b"the right secret", "2001:db8:1:2::99") is None, "throttled: not even checked"


@pytest.mark.slow
def test_a_decoy_session_cookie_sent_first_does_not_hide_the_operators_own(console):
    srv, url, browser = operator_with_dead_letters(console, 1)
    csrf = browser.csrf()
    own = next(c.value for c in browser.cookies if c.name == "pzq_session")
    form = urllib.parse.urlencode({"name": "default", "which": "all", "csrf": csrf}).encode()
    request = urllib.request.Request(
        url + "/queue/requeue", data=form, headers={"Cookie": f"pzq_session=decoy; pzq_session={own}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert "requeued 1 dead letter(s)" in answer.read().decode()


def test_a_purge_stops_when_its_queue_is_deleted_and_never_touches_a_new_queue_of_the_same_name(store):
    from pzq.broker import Broker
    from pzq.console.web import Console
    from pzq.endpoints.console import PURGE_PER_TURN, ConsoleEndpoint

    broker = Broker(store, ack_timeout_s=60)
    tcp, _ = free_tcp_endpoint()
    console = Console(tcp.replace("tcp://", "http://"), ".")
    try:
        endpoint = ConsoleEndpoint(console, broker, clients=lambda now, rows: {})
        store.put_many("q", [[b"old"]] * (3 * PURGE_PER_TURN), now_us=1)
        answer = endpoint._write("purge", {"name": "q"})
        assert answer["ok"] and "the rest follows" in answer["text"]
        broker.drop_queue("q")
        store.put_many("q", [[b"new"]] * (2 * PURGE_PER_TURN), now_us=2)
        for _ in range(3):
            endpoint.work(0.0, 0)
        assert store.queue("q").count == 2 * PURGE_PER_TURN and not endpoint.waiting()
    finally:
        console.close()
