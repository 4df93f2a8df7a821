"""Changing things through the web console process: the login, its throttle and sessions, CSRF and
the origin check, and the requeue, delete, purge and publish a logged-in operator makes, each answered
after pzq's reply (which comes after its commit) and logged, against a real server over real HTTP."""

from __future__ import annotations

import json
import logging
import re
import signal
import urllib.parse
import urllib.request

import pytest
from console_run import SECRET, Browser, ConsoleProcess

from pzq.clients import native as client
from pzq.console import auth
from pzq.errors import ConfigError

from conftest import wait_until


@pytest.fixture
def console(make_server, tmp_path):
    """make(*console options, **server overrides) -> (server, console process) with a login secret in
    a private file (``auth=False``: none); each console must end with status 0 on SIGTERM."""
    secret_file = tmp_path / "console.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    made: list[ConsoleProcess] = []

    def make(*extra: str, auth: bool = True, **overrides):
        srv = make_server(**overrides)
        options = ("--http-auth-file", str(secret_file)) if auth else ()
        process = ConsoleProcess(tmp_path, srv.monitor, *options, *extra)
        made.append(process)
        return srv, process

    yield make
    for process in made:
        assert process.stop() == 0, process.text()


def dead_letters(srv, count: int) -> list[str]:
    """``count`` messages of queue "default" sent to the dead letters the way a user meets them: each
    delivered once, never acknowledged, and out of deliveries (--max-deliveries 1) when it comes back."""
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"dead %d" % i] for i in range(count)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(count):
            consumer.receive(timeout_s=5)  # (not acknowledged: back after the ack timeout, then dead)
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == count, timeout_s=15)
    letters = json.loads(client.monitor_request(srv.monitor, "DEADLETTERS default"))
    return [letter["id"] for letter in letters]


def operator(console, dead: int = 0, **overrides):
    """A server with ``dead`` dead letters, its console, and a logged-in operator's browser."""
    srv, process = console(max_deliveries=1, ack_timeout=0.2, **overrides)
    if dead:
        dead_letters(srv, dead)
    browser = Browser(process.url)
    status, page = browser.log_in()
    assert status == 200 and "Log out" in page
    return srv, process, browser


def change(browser: Browser, path: str, **fields: str) -> tuple[int, str]:
    """A change as the queue page's form makes it (the session's CSRF token added)."""
    status, page, _ = browser.open(path, {"csrf": browser.csrf("/queue?name=default"), **fields})
    return status, page


def notice(page: str) -> str:
    found = re.search(r'<p class="notice" role="status">([^<]*)</p>', page)
    return found.group(1) if found else ""


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


def test_a_rotated_secret_ends_every_session():
    logins = auth.Logins(b"the first secret")
    key = logins.log_in(b"the first secret", "a")
    assert not logins.replace_secret(b"the first secret") and logins.session(key) is not None
    assert logins.replace_secret(b"the second secret")
    assert logins.session(key) is None and logins.log_in(b"the first secret", "a") is None
    assert logins.log_in(b"the second secret", "a") is not None


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


def test_without_an_auth_file_the_console_refuses_every_change(console):
    _, process = console(auth=False)
    browser = Browser(process.url)
    assert "read-only" in browser.get("/")[1] and "started without --http-auth-file" in browser.get("/login")[1]
    for path in ("/login", "/logout", "/queue/requeue", "/queue/delete", "/queue/purge", "/queue/publish"):
        status, body, _ = browser.open(path, {"name": "default", "which": "all", "secret": SECRET})
        assert status == 403 and "read-only" in body, path


def test_an_operator_logs_in_and_requeues_one_dead_letter_which_a_consumer_then_gets(console):
    srv, process, browser = operator(console, dead=2)
    cookie = next(c for c in browser.cookies if c.name == "pzq_session")
    assert cookie.has_nonstandard_attr("HttpOnly") and cookie.get_nonstandard_attr("SameSite") == "strict"
    page = browser.get("/queue?name=default")[1]
    assert 'action="/queue/requeue"' in page and 'action="/queue/publish"' in page
    letter = dead_ids(srv)[0]
    status, page = change(browser, "/queue/requeue", name="default", which=letter)
    assert status == 200 and notice(page) == "requeued 1 dead letter(s)"
    assert srv.stats()["queues"]["default"]["dead_letters"] == 1, "answered after pzq's commit"
    assert re.search(r'data-figure="dead_letters"[^>]*>1<', page), "the page shows the queue as the change left it"
    assert letter not in re.findall(r'data-dead="([^"]+)"', page)
    with client.Consumer(srv.send) as consumer:
        assert consumer.receive(timeout_s=5).body[0].startswith(b"dead ")
    assert re.search(r"INFO pzq\.console: console: 127\.0\.0\.1, session \w{8} asked 'REQUEUE default ", process.text())


def dead_ids(srv) -> list[str]:
    return [d["id"] for d in json.loads(client.monitor_request(srv.monitor, "DEADLETTERS default"))]


def test_a_change_without_a_session_its_csrf_token_or_from_another_site_is_refused_and_logged(console):
    srv, process, browser = operator(console, dead=1)
    form = {"name": "default", "which": "all"}
    assert Browser(process.url).open("/queue/requeue", {**form, "csrf": "x"})[0] == 403
    assert browser.open("/queue/requeue", {**form, "csrf": "not the token"})[0] == 403
    csrf = browser.csrf()
    status, body, _ = browser.open("/queue/requeue", {**form, "csrf": csrf}, {"Origin": "http://evil.example"})
    assert status == 403 and "another site" in body
    status, _, _ = browser.open("/queue/requeue", {**form, "csrf": csrf}, {"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    assert srv.stats()["queues"]["default"]["dead_letters"] == 1, "nothing was changed"
    text = process.text()
    assert "change refused from 127.0.0.1: no session" in text
    assert "change refused from 127.0.0.1: a form without this session's CSRF token" in text
    assert "change refused from 127.0.0.1: a request from another site" in text


def test_a_form_that_is_not_urlencoded_or_too_long_is_refused_before_it_is_read(console):
    _, process, browser = operator(console)
    url = process.url + "/queue/purge"
    opener = browser.opener
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=10)
    assert refused.value.code == 415
    request = urllib.request.Request(url, data=b"name=" + b"x" * 9000)
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=10)
    assert refused.value.code == 413


def test_a_login_and_a_logout_are_logged_at_info_and_only_a_failed_login_warns(console):
    _, process, browser = operator(console)
    assert Browser(process.url).log_in("not the secret")[0] == 403
    status, page, _ = browser.open("/logout", {"csrf": browser.csrf()})
    assert status == 200 and "Log in" in page and "Log out" not in page
    text = process.text()
    assert "INFO pzq.console: console: login from 127.0.0.1" in text
    assert "INFO pzq.console: console: 127.0.0.1 logged out" in text
    assert "WARNING pzq.console: console: failed login from 127.0.0.1" in text


def test_a_wrong_secret_is_refused_and_the_sixth_try_in_a_minute_is_not_even_checked(console):
    _, process = console()
    browser = Browser(process.url)
    for _ in range(auth.FAILURES_PER_ADDRESS):
        status, page = browser.log_in("a wrong guess")
        assert status == 403 and "wrong secret" in page
    assert browser.log_in()[0] == 429, "the right secret waits out the minute too"
    assert "refused unchecked: too many failures lately" in process.text()


def test_a_decoy_session_cookie_sent_first_does_not_hide_the_operators_own(console):
    srv, process, browser = operator(console, dead=1)
    csrf = browser.csrf()
    own = next(c.value for c in browser.cookies if c.name == "pzq_session")
    form = urllib.parse.urlencode({"name": "default", "which": "all", "csrf": csrf}).encode()
    request = urllib.request.Request(
        process.url + "/queue/requeue", data=form, headers={"Cookie": f"pzq_session=decoy; pzq_session={own}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    assert srv.stats()["queues"]["default"]["dead_letters"] == 0


def test_deleting_every_dead_letter_needs_the_box_ticked_and_then_deletes_them(console):
    srv, _, browser = operator(console, dead=3)
    status, page = change(browser, "/queue/delete", name="default", which="all")
    assert notice(page) == "nothing deleted: tick the box to confirm"
    assert srv.stats()["queues"]["default"]["dead_letters"] == 3
    status, page = change(browser, "/queue/delete", name="default", which="all", confirm="yes")
    assert status == 200 and notice(page) == "deleted 3 dead letter(s)"
    assert srv.stats()["queues"]["default"]["dead_letters"] == 0


def test_deleting_one_dead_letter_deletes_that_one(console):
    srv, _, browser = operator(console, dead=2)
    first = dead_ids(srv)[0]
    status, page = change(browser, "/queue/delete", name="default", which=first)
    assert notice(page) == "deleted 1 dead letter(s)" and dead_ids(srv) != [] and first not in dead_ids(srv)


def test_a_purge_needs_the_box_ticked_and_deletes_the_ready_messages(console):
    srv, _, browser = operator(console)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(20)))
    assert notice(change(browser, "/queue/purge", name="default")[1]) == "not purged: tick the box to confirm"
    status, page = change(browser, "/queue/purge", name="default", confirm="yes")
    assert status == 200 and notice(page).startswith("purged 20 ready message(s)")
    assert srv.stats()["queues"]["default"]["depth"] == 0


def test_a_published_message_is_answered_after_its_commit_and_a_consumer_gets_it(console):
    srv, process, browser = operator(console)
    status, page = change(browser, "/queue/publish", name="default", body="<b>hello</b> from the console")
    assert status == 200 and notice(page).startswith("published message ")
    assert srv.stats()["queues"]["default"]["depth"] == 1, "answered after pzq's commit"
    with client.Consumer(srv.send) as consumer:
        assert consumer.receive(timeout_s=5).body == [b"<b>hello</b> from the console"]
    assert re.search(r"INFO pzq\.console: console: 127\.0\.0\.1, session \w{8} asked 'PUBLISH default'", process.text())


def test_the_queue_page_peeks_at_the_first_messages_and_pages_the_dead_letters_with_when_and_why(console):
    srv, _, browser = operator(console, dead=30)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"ready %d" % i] for i in range(3)))
    page = browser.get("/queue?name=default")[1]
    assert re.findall(r'<td class="body">(ready \d)</td>', page) == ["ready 0", "ready 1", "ready 2"]
    first = re.findall(r'data-dead="([^"]+)"', page)
    assert len(first) == 25 and "30 in all" in page
    following = re.search(r'rel="next" href="([^"]+)"', page).group(1).replace("&amp;", "&")
    second = re.findall(r'data-dead="([^"]+)"', browser.get(following)[1])
    assert len(second) == 5 and not set(first) & set(second)
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td><td>[^<]+</td>", page), "when and why each died"


def test_sighup_rereads_the_secret_file_and_a_changed_secret_shuts_out_the_old_sessions(console, tmp_path):
    _, process, browser = operator(console)
    secret_file = tmp_path / "console.secret"
    process.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "the secret is unchanged" in process.text(), timeout_s=10)
    assert "Log out" in browser.get("/")[1], "the same secret: the session goes on"
    secret_file.write_text("a brand new secret of the operator\n")
    process.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "every session has ended" in process.text(), timeout_s=10)
    assert "Log out" not in browser.get("/")[1]
    assert browser.log_in()[0] == 403 and browser.log_in("a brand new secret of the operator")[0] == 200
    secret_file.unlink()
    process.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "the old secret stays" in process.text(), timeout_s=10)
    assert "Log out" in browser.get("/")[1] and process.proc.poll() is None
