"""The web console in a real browser: Debian's Chromium, headless, driven by selenium through
ChromeDriver, loads every page of a running server with traffic and checks that the figures it shows
are the server's STATS, then logs in and requeues a dead letter. Screenshots go to $PZQ_ARTIFACTS (or
the test's tmp dir) and are named in the output."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pzq.clients import native as client

from conftest import free_tcp_endpoint, wait_until

webdriver = pytest.importorskip("selenium.webdriver")
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
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def shown(driver, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector).text


SECRET = "a console secret for the browser test"


def test_every_console_page_shows_the_servers_figures_in_chromium_and_a_dead_letter_is_requeued(
    make_server, browser, tmp_path
):
    artifacts = Path(os.environ.get("PZQ_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    secret = tmp_path / "console.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    srv = make_server(http_dsn=url, http_auth_file=str(secret), max_deliveries=1, ack_timeout=0.3)
    with client.Producer(srv.receive) as producer:  # poison: delivered once, never acked, then dead
        assert all(r.ok for r in producer.produce_many([b"poison %d" % i] for i in range(3)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(3):
            consumer.receive(5000)
        assert wait_until(lambda: client.stats(srv.monitor)["queues"]["default"]["dead_letters"] == 3, timeout_s=15)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"event %d" % i] for i in range(12)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(5):
            consumer.ack(consumer.receive(5000))

    def settled() -> dict | None:  # the page shows the loop's snapshot of the last second: wait for it
        stats = client.stats(srv.monitor)
        browser.get(url + "/")
        figures = (shown(browser, '[data-figure="messages stored"]'), shown(browser, '[data-figure="in flight"]'))
        return stats if figures == (f"{stats['messages']:,}", f"{stats['messages_inflight']:,}") else None

    stats = wait_until(settled, timeout_s=15, interval_s=0.5)
    assert stats["messages"] == 7
    assert len(browser.find_elements("css selector", "figure.chart")) == 4
    browser.save_screenshot(str(artifacts / "console-overview.png"))

    browser.get(url + "/queues?sort=depth&order=desc")
    assert shown(browser, '[data-queue="default"]') == "default"
    assert shown(browser, 'tr:has([data-queue="default"]) [data-column="depth"]') == str(
        stats["queues"]["default"]["depth"]
    )
    browser.save_screenshot(str(artifacts / "console-queues.png"))

    browser.get(url + "/clients")
    assert "Native PZQ" in browser.page_source
    browser.save_screenshot(str(artifacts / "console-clients.png"))

    browser.get(url + "/queues")
    browser.find_element("link text", "default").click()
    bodies = [cell.text for cell in browser.find_elements("css selector", "table.messages td.body")]
    assert bodies == [f"event {i}" for i in range(5, 12)] + [f"poison {i}" for i in range(3)]  # (and the dead)
    assert not browser.find_elements("css selector", "form[action='/queue/requeue']"), "no changes before a login"

    browser.find_element("link text", "Log in").click()
    browser.find_element("name", "secret").send_keys(SECRET)
    browser.save_screenshot(str(artifacts / "console-login.png"))
    browser.find_element("css selector", "form[action='/login'] button").click()
    logged_in = WebDriverWait(browser, 10).until(lambda b: b.find_elements("css selector", "form[action='/logout']"))
    assert logged_in[0].text == "Log out"
    browser.get(url + "/queue?name=default")
    first_dead = browser.find_element("css selector", "tr[data-message] td.actions").find_element("xpath", "..")
    dead_id = first_dead.get_attribute("data-message")
    first_dead.find_element("css selector", "button[data-action='/queue/requeue']").click()
    notice = WebDriverWait(browser, 10).until(lambda b: b.find_elements("css selector", ".notice"))
    assert notice[0].text == "requeued 1 dead letter(s) of queue 'default'"
    figures = client.stats(srv.monitor)["queues"]["default"]
    assert (figures["dead_letters"], figures["depth"]) == (2, 8)
    assert shown(browser, '[data-figure="dead letters"]') == "2", "the page shows the queue as the change left it"
    assert dead_id not in [row.get_attribute("data-message") for row in browser.find_elements("css selector", "tr")]
    bodies = [cell.text for cell in browser.find_elements("css selector", "table.messages td.body")]
    assert bodies[7] == "poison 0", "the requeued letter is back at the end of its queue"
    browser.save_screenshot(str(artifacts / "console-queue.png"))
    print("screenshots:", *sorted(str(p) for p in artifacts.glob("console-*.png")))
