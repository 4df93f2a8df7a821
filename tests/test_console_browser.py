"""The web console process in a real browser: Debian's Chromium, headless, driven by selenium through
ChromeDriver, against `pzq console` for a server with traffic flowing: a figure and a chart change
without a reload (and stop when paused), every page loads without a script or CSP error, the 404 page
leads back, and a logged-in operator publishes, requeues, deletes and purges. Screenshots go to
$PZQ_ARTIFACTS (or the test's tmp dir) and are named in the output."""

from __future__ import annotations

import os
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
