"""The web console process in a real browser: Debian's Chromium, headless, driven by selenium through
ChromeDriver, against `pzq console` for a server with traffic flowing: a figure and a chart change
without a reload (and stop when paused), every page loads without a script or CSP error, the 404 page
leads back, and a logged-in operator publishes, requeues, deletes and purges. Screenshots go to
$PZQ_ARTIFACTS (or the test's tmp dir) and are named in the output."""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import pytest
from console_run import SECRET, ConsoleProcess

from pzq.clients import native as client

from conftest import wait_until

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("Debian's chromium and chromium-driver are installed by scripts/test")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


class Traffic:
    """A producer and a consumer that acks, in a thread, until stopped: the figures keep moving."""

    def __init__(self, srv):
        self.srv = srv
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with client.Producer(self.srv.receive) as producer, client.Consumer(self.srv.send) as consumer:
            n = 0
            while not self.stopping.wait(0.05):
                assert producer.produce([b"traffic %d" % n]).ok
                n += 1
                if n % 3:
                    delivered = consumer.receive(timeout_s=2)
                    if delivered is not None:
                        consumer.ack(delivered)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


def text(driver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).text


def errors(driver) -> list[str]:
    """The browser's console errors since the last call (a CSP violation, a script that failed)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


@pytest.fixture
def setup(make_server, tmp_path):
    secret = tmp_path / "console.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    srv = make_server(max_deliveries=1, ack_timeout=0.2)
    with client.Producer(srv.receive) as producer:  # poison: delivered once, never acked, then dead
        assert all(r.ok for r in producer.produce_many([b"poison %d" % i] for i in range(3)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(3):
            consumer.receive(timeout_s=5)
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == 3, timeout_s=15)
    process = ConsoleProcess(tmp_path, srv.monitor, "--http-auth-file", str(secret))
    artifacts = Path(os.environ.get("PZQ_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    yield srv, process, artifacts
    assert process.stop() == 0, process.text()


def test_a_figure_and_a_chart_change_without_a_reload_while_traffic_flows_and_stop_when_paused(setup, browser):
    srv, process, artifacts = setup
    traffic = Traffic(srv)
    try:
        browser.get(process.url + "/")
        browser.execute_script("window.pzqNoReload = 1")
        chart = browser.find_element(By.CSS_SELECTOR, 'figure[data-chart="produced_total"]')
        WebDriverWait(browser, 15).until(lambda b: int(chart.get_attribute("data-points") or 0) >= 2)
        assert chart.find_elements(By.CSS_SELECTOR, "canvas"), "uPlot drew the chart"
        assert chart.find_elements(By.CSS_SELECTOR, ".u-axis"), "with its axes: time and value"
        figure, drawn = text(browser, '[data-figure="produced_total"]'), chart.get_attribute("data-last-at")
        WebDriverWait(browser, 15).until(
            lambda b: (
                text(b, '[data-figure="produced_total"]') != figure and chart.get_attribute("data-last-at") != drawn
            )
        )
        assert browser.execute_script("return window.pzqNoReload") == 1, "updated in place, not reloaded"
        browser.save_screenshot(str(artifacts / "console-overview.png"))

        browser.find_element(By.ID, "pause").click()
        WebDriverWait(browser, 5).until(lambda b: text(b, "#live-state") == "paused")
        paused = browser.find_element(By.TAG_NAME, "body").get_attribute("data-updated")
        stats_before = srv.stats()["produced_total"]
        wait_until(lambda: srv.stats()["produced_total"] > stats_before + 40, timeout_s=15, interval_s=0.1)
        assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-updated") == paused
        browser.find_element(By.ID, "pause").click()
        WebDriverWait(browser, 10).until(
            lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-updated") != paused
        )
        assert not errors(browser)
    finally:
        traffic.stop()


def test_every_page_loads_without_a_script_error_and_the_404_page_leads_back(setup, browser):
    srv, process, artifacts = setup
    for path, name in (
        ("/queues?sort=depth&order=desc", "queues"),
        ("/queue?name=default", "queue"),
        ("/clients", "clients"),
        ("/login", "login"),
        ("/queue?name=nosuch", "404"),
    ):
        browser.get(process.url + path)
        if name not in ("login", "404"):  # (pages of pzq's figures: wait for console.js's first update)
            WebDriverWait(browser, 10).until(
                lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-updated")
            )
        browser.save_screenshot(str(artifacts / f"console-{name}.png"))
        assert not [e for e in errors(browser) if "404" not in e], path
    assert text(browser, "h1") == "No such queue"
    browser.find_element(By.LINK_TEXT, "Back to the queues").click()
    assert text(browser, '[data-queue="default"]') == "default"
    browser.find_element(By.LINK_TEXT, "default").click()
    assert text(browser, '[data-figure="dead_letters"]') == "3"
    print("screenshots:", *sorted(str(p) for p in artifacts.glob("console-*.png")))


def test_a_logged_in_operator_publishes_requeues_deletes_and_purges_from_the_queue_page(setup, browser):
    srv, process, artifacts = setup
    browser.get(process.url + "/queue?name=default")
    assert not browser.find_elements(By.CSS_SELECTOR, "form[action='/queue/requeue']"), "no changes before a login"
    browser.find_element(By.LINK_TEXT, "Log in").click()
    browser.find_element(By.NAME, "secret").send_keys(SECRET)
    browser.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "form[action='/logout']"))

    def act(selector: str, expected: str, box: bool = False) -> None:
        browser.get(process.url + "/queue?name=default")
        form = browser.find_element(By.CSS_SELECTOR, selector)
        if box:
            form.find_element(By.NAME, "confirm").click()
        form.find_element(By.CSS_SELECTOR, "button").click()
        shown = WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "p.notice[role=status]"))
        assert shown[0].text.startswith(expected), shown[0].text

    browser.get(process.url + "/queue?name=default")
    browser.find_element(By.NAME, "body").send_keys("hello from chromium")
    browser.find_element(By.CSS_SELECTOR, "button[data-action='/queue/publish']").click()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "p.notice[role=status]"))
    assert text(browser, "p.notice[role=status]").startswith("published message ")
    assert srv.stats()["queues"]["default"]["depth"] == 1
    assert "hello from chromium" in [c.text for c in browser.find_elements(By.CSS_SELECTOR, "table.messages td.body")]

    act("tr[data-dead] form[action='/queue/requeue']", "requeued 1 dead letter(s)")
    assert srv.stats()["queues"]["default"]["dead_letters"] == 2
    act("tr[data-dead] form[action='/queue/delete']", "deleted 1 dead letter(s)")
    assert srv.stats()["queues"]["default"]["dead_letters"] == 1
    assert text(browser, '[data-figure="dead_letters"]') == "1", "the page shows the queue as the change left it"
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-dead]")) == 1
    browser.save_screenshot(str(artifacts / "console-queue-operator.png"))
    act("section.changes form[action='/queue/requeue']", "requeued 1 dead letter(s)")
    act("section.changes form[action='/queue/purge']", "purged 3 ready message(s)", box=True)
    figures = srv.stats()["queues"]["default"]
    assert (figures["depth"], figures["dead_letters"]) == (0, 0)
    assert not errors(browser)


@pytest.fixture
def served(make_server, tmp_path):
    """A server whose native and PHPMQ endpoints are TCP (their peers have addresses), with an API to
    make queues by producing to them, and its console; the artifacts' directory."""
    from conftest import free_tcp_endpoint

    send, _ = free_tcp_endpoint()
    phpmq_dsn, _ = free_tcp_endpoint()
    srv = make_server(send_dsn=send, phpmq_dsn=phpmq_dsn, api_dsn=f"ipc://{tmp_path}/api")
    process = ConsoleProcess(tmp_path, srv.monitor)
    artifacts = Path(os.environ.get("PZQ_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    yield srv, process, artifacts
    assert process.stop() == 0, process.text()


def produce_to(srv, queue: str, n: int) -> None:
    from pzq.clients.api import ApiClient

    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.produce([(queue, b"m%d" % i) for i in range(n)])


def test_the_queues_table_lives_a_queue_made_after_the_page_loaded_appears_and_the_filter_typed_stays(served, browser):
    srv, process, _ = served
    browser.set_window_size(1280, 400)  # (a page taller than the window: its scroll must stay)
    browser.get(process.url + "/queues")
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-updated"))
    browser.execute_script("window.pzqNoReload = 1")
    typed = browser.find_element(By.NAME, "filter")
    typed.send_keys("half-typed")  # (an operator's form, open as the table changes under it)
    produce_to(srv, "fresh", 3)
    row = 'table[data-live="queues"] tr[data-key="fresh"]'
    WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.CSS_SELECTOR, row))
    assert text(browser, row + ' td[data-column="depth"]') == "3"
    assert text(browser, row + " td.name a") == "fresh"
    produce_to(srv, "fresh", 1024)
    WebDriverWait(browser, 15).until(lambda b: text(b, row + ' td[data-column="depth"]') == "1,027")
    rate = browser.find_element(By.CSS_SELECTOR, row + ' td[data-column="in_per_s"]')
    WebDriverWait(browser, 20).until(lambda b: rate.text != "0 msg/s")
    assert rate.text.endswith(" msg/s") and rate.get_attribute("title").endswith(" msg/s"), rate.text
    assert browser.execute_script("return window.pzqNoReload") == 1, "updated in place, not reloaded"
    assert typed.get_attribute("value") == "half-typed", "the operator's form is as they left it"
    assert not errors(browser)


def test_charts_switch_between_five_minutes_an_hour_and_a_day_without_a_reload_and_show_values_on_hover(
    served, browser
):
    srv, process, artifacts = served
    traffic = Traffic(srv)
    try:
        browser.get(process.url + "/")
        browser.execute_script("window.pzqNoReload = 1")
        chart = browser.find_element(By.CSS_SELECTOR, 'figure[data-chart="produced_total"]')
        WebDriverWait(browser, 15).until(lambda b: int(chart.get_attribute("data-points") or 0) >= 3)
        assert chart.get_attribute("data-range") == "5m"
        for label, name in (("1 hour", "1h"), ("24 hours", "24h"), ("5 minutes", "5m")):
            browser.find_element(By.LINK_TEXT, label).click()
            WebDriverWait(browser, 10).until(lambda b, name=name: chart.get_attribute("data-range") == name)
            assert f"range={name}" in browser.current_url
            chosen = browser.find_element(By.CSS_SELECTOR, "a[data-range].chosen")
            assert chosen.get_attribute("data-range") == name
        assert browser.execute_script("return window.pzqNoReload") == 1, "switched in place, not reloaded"

        from selenium.webdriver.common.action_chains import ActionChains

        over = chart.find_element(By.CSS_SELECTOR, ".u-over")
        ActionChains(browser).move_to_element_with_offset(over, over.size["width"] // 3, 5).perform()
        value = chart.find_elements(By.CSS_SELECTOR, ".u-legend .u-series .u-value")
        WebDriverWait(browser, 5).until(lambda b: re.fullmatch(r"[\d,.]+ msg/s", value[1].text))
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", value[0].text), "the time under the cursor"
        browser.save_screenshot(str(artifacts / "console-hover.png"))
        stored = browser.find_element(By.CSS_SELECTOR, 'td[data-figure="store_bytes"]')
        assert re.fullmatch(r"[\d.,]+ (KiB|MiB|GiB)", stored.text), stored.text
        assert re.fullmatch(r"[\d,]+ bytes", stored.get_attribute("title")), "the exact figure on hover"
        assert not errors(browser)
    finally:
        traffic.stop()


def test_a_native_consumer_is_listed_with_its_address_and_since_when_and_the_list_lives(served, browser):
    srv, process, _ = served
    browser.get(process.url + "/queue?name=default")
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-updated"))
    browser.execute_script("window.pzqNoReload = 1")
    with client.Consumer(srv.send) as consumer:
        consumer.receive(timeout_s=0.5)  # (connected: nothing to receive)
        rows = 'table[data-live="consumers"] tbody tr:not(.none)'
        WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.CSS_SELECTOR, rows))
        cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, rows + " td")]
        assert cells[0] == "native" and re.fullmatch(r"127\.0\.0\.1:\d+", cells[2]), cells
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", cells[3]), cells
    WebDriverWait(browser, 15).until(lambda b: not b.find_elements(By.CSS_SELECTOR, rows))
    assert browser.execute_script("return window.pzqNoReload") == 1
    assert not errors(browser)


def test_the_clients_page_leads_with_who_is_connected_and_folds_its_counters_in_units(served, browser):
    srv, process, artifacts = served
    host, port = srv.config.phpmq_dsn.removeprefix("tcp://").rsplit(":", 1)
    import socket

    with socket.create_connection((host, int(port)), timeout=5):
        browser.get(process.url + "/clients")
        browser.execute_script("window.pzqNoReload = 1")
        live = 'table[data-live="clients:phpmq"] tbody tr:not(.none)'
        WebDriverWait(browser, 15).until(lambda b: b.find_elements(By.CSS_SELECTOR, live))
        first = browser.find_element(By.CSS_SELECTOR, "h1 ~ table, h1 ~ details")
        assert first.get_attribute("data-live") == "clients:phpmq", "the connections come first"
        cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, live + " td")]
        assert any(re.fullmatch(r"127\.0\.0\.1:\d+", c) for c in cells), cells
        assert any(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", c) for c in cells), cells
        counters = browser.find_element(By.CSS_SELECTOR, "details.counters")
        assert (
            counters.get_attribute("open") is None
            and not counters.find_element(By.CSS_SELECTOR, "table").is_displayed()
        )
        counters.find_element(By.TAG_NAME, "summary").click()
        sizes = [c for c in counters.find_elements(By.CSS_SELECTOR, 'td[data-unit="bytes"]') if c.text != "0 B"]
        assert sizes and all(re.fullmatch(r"[\d.,]+ (B|KiB|MiB|GiB)", c.text) for c in sizes), [c.text for c in sizes]
        assert all(re.fullmatch(r"[\d,]+ bytes", c.get_attribute("title")) for c in sizes)
        browser.save_screenshot(str(artifacts / "console-clients-open.png"))
    WebDriverWait(browser, 15).until(lambda b: not b.find_elements(By.CSS_SELECTOR, live))
    assert browser.execute_script("return window.pzqNoReload") == 1
    assert not errors(browser)


def test_the_dead_letter_pager_goes_next_previous_and_first_with_its_links_apart(setup, browser):
    srv, process, _ = setup
    with client.Producer(srv.receive) as producer:  # 3 dead already: 57 more, 60 in all, 3 pages of 25
        assert all(r.ok for r in producer.produce_many([b"poison more %d" % i] for i in range(57)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(57):
            assert consumer.receive(timeout_s=5) is not None
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == 60, timeout_s=30)
    browser.get(process.url + "/queue?name=default")

    def page() -> tuple[str, list[str], list[str]]:
        pager = browser.find_element(By.CSS_SELECTOR, "nav.pages")
        links = [a.text for a in pager.find_elements(By.TAG_NAME, "a")]
        ids = [tr.get_attribute("data-dead") for tr in browser.find_elements(By.CSS_SELECTOR, "tr[data-dead]")]
        return pager.text, links, ids

    said, links, first = page()
    assert "page 1" in said and links == ["next"] and len(first) == 25
    assert said.endswith("first · previous · next"), "each link a word of its own"
    browser.find_element(By.CSS_SELECTOR, "nav.pages a[rel=next]").click()
    said, links, second = page()
    assert "page 2" in said and links == ["first", "previous", "next"] and not set(second) & set(first)
    browser.find_element(By.CSS_SELECTOR, "nav.pages a[rel=next]").click()
    said, links, third = page()
    assert "page 3" in said and links == ["first", "previous"] and len(third) == 10
    browser.find_element(By.CSS_SELECTOR, "nav.pages a[rel=prev]").click()
    assert page()[2] == second, "previous goes back to the page before"
    browser.find_element(By.CSS_SELECTOR, "nav.pages a[rel=prev]").click()
    assert page()[2] == first
    browser.find_element(By.CSS_SELECTOR, "nav.pages a[rel=next]").click()
    browser.find_element(By.CSS_SELECTOR, "nav.pages a[rel=first]").click()
    assert page()[2] == first
    assert not errors(browser)
