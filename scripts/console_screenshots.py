"""The README's pictures of the web console: a pzq server (a subprocess, its own tmp store) with its
console (`--http-dsn`: `pzq console` as the server's child, talking to it through the monitor), a minute or so
of traffic (a producer at a rate that rises and falls, a consumer that acks, PHPMQ connections that
send to a few more queues and one that consumes, three poison messages in the dead letters), then,
with the traffic still flowing, Debian's Chromium, headless, saves the overview, the queues, the
clients page, and a queue's page after a logged-in requeue.

    .venv/bin/python scripts/console_screenshots.py [--seconds 90] [--out tests/screenshots]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from pzq.clients import native as client
from pzq.protocols import phpmq

SECRET = "screenshots only: a throwaway secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="of traffic before the pictures")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "screenshots"))
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.wait import WebDriverWait

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pzq-shots-"))
    secret = tmp / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    url, phpmq = f"http://127.0.0.1:{free_port()}", free_port()
    ends = {name: f"ipc://{tmp}/{name}" for name in ("receive", "send", "monitor")}
    ends["send"] = f"tcp://127.0.0.1:{free_port()}"  # (TCP: the queue's page names its consumers' addresses)
    server = subprocess.Popen(
        [sys.executable, "-m", "pzq", "serve", "--database", str(tmp / "db"), "--http-dsn", url]
        + ["--http-auth-file", str(secret), "--phpmq-dsn", f"tcp://127.0.0.1:{phpmq}", "--max-deliveries", "1"]
        + ["--ack-timeout", "3000000", "--receive-dsn", ends["receive"], "--send-dsn", ends["send"]]
        + ["--monitor-dsn", ends["monitor"], "--mqks-dsn", "", "--api-dsn", ""]
        + ["--emqp-frontend-dsn", "", "--emqp-backend-dsn", "", "--emqp-publish-dsn", ""],
        stderr=open(tmp / "server.log", "wb"),  # noqa: SIM115 - the server's, closed with it
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.stats(ends["monitor"], timeout_s=0.5)
                break
            except client.ClientError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit(f"the server did not start:\n{(tmp / 'server.log').read_text()}")
        stopping = threading.Event()
        flowing = threading.Thread(target=traffic, args=(ends, stopping, phpmq), daemon=True)
        flowing.start()
        time.sleep(args.seconds)  # (the charts' 15 minutes fill as the traffic flows)
        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
            options.add_argument(flag)
        driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            driver.get(url + "/")
            settle(driver, WebDriverWait)
            over = driver.find_element("css selector", 'figure[data-chart="produced_total"] .u-over')
            # (the cursor on the produce chart: its legend shows the time and the value under it)
            ActionChains(driver).move_to_element_with_offset(over, over.size["width"] // 4, 10).perform()
            driver.save_screenshot(str(out / "console-overview.png"))
            driver.get(url + "/queues?sort=depth&order=desc")
            settle(driver, WebDriverWait)
            driver.save_screenshot(str(out / "console-queues.png"))
            driver.get(url + "/clients")
            settle(driver, WebDriverWait)
            driver.find_element("css selector", "details.counters summary").click()  # (the counters too)
            driver.save_screenshot(str(out / "console-clients.png"))
            driver.get(url + "/login")
            driver.find_element("name", "secret").send_keys(SECRET)
            driver.find_element("css selector", "form[action='/login'] button").click()
            WebDriverWait(driver, 10).until(lambda d: d.find_elements("css selector", "form[action='/logout']"))
            driver.get(url + "/queue?name=default")
            driver.save_screenshot(str(out / "console-queue.png"))  # (replaced below, after the requeue)
            driver.find_element("css selector", "td.actions button[data-action='/queue/requeue']").click()
            settle(driver, WebDriverWait)
            driver.execute_script("window.scrollTo(0, 0)")  # (the click scrolled down to the dead letters)
            driver.set_window_size(1280, 1500)  # (its consumers, first messages and dead letters too)
            settle(driver, WebDriverWait)
            driver.save_screenshot(str(out / "console-queue.png"))
        finally:
            driver.quit()
            stopping.set()
            flowing.join(10)
        print("screenshots:", *sorted(str(p) for p in out.glob("console-*.png")))
    finally:
        server.terminate()
        server.wait(20)
        shutil.rmtree(tmp, ignore_errors=True)


def settle(driver, wait) -> None:
    """Wait for console.js's first update of the page (its charts drawn)."""
    # (read by a script: an element found before the form's redirect would be stale after it)
    wait(driver, 10).until(lambda d: d.execute_script("return document.body && document.body.dataset.updated"))


def traffic(ends: dict[str, str], stopping: threading.Event, phpmq_port: int) -> None:
    """Poison first (delivered once, never acked: dead), then a rising and falling rate, acked, until
    ``stopping``; PHPMQ connections send to three more queues, and one consumes from "default"."""
    with client.Producer(ends["receive"]) as producer:
        assert all(r.ok for r in producer.produce_many([b'{"job": "resize", "image": %d}' % i] for i in range(3)))
    with client.Consumer(ends["send"]) as consumer:
        for _ in range(3):
            consumer.receive(timeout_s=5)
        deadline = time.monotonic() + 30
        while client.stats(ends["monitor"])["queues"]["default"]["dead_letters"] < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    php = [socket.create_connection(("127.0.0.1", phpmq_port)) for _ in range(4)]
    php[0].sendall(phpmq.encode(phpmq.CONSUME, [(phpmq.QUEUE, b"default"), (phpmq.COUNT, b"1")]))
    started = time.monotonic()
    try:
        with client.Producer(ends["receive"]) as producer, client.Consumer(ends["send"]) as consumer:
            n = 0
            while not stopping.is_set():
                elapsed = time.monotonic() - started
                rate = 400 + 300 * math.sin(elapsed / 12)  # messages a second, for the charts' shape
                batch = max(1, int(rate / 10))
                producer.produce_many([b'{"event": "page_view", "n": %d}' % (n + i)] for i in range(batch))
                for i, queue in enumerate((b"emails", b"thumbnails", b"invoices")):
                    if n % (i + 2) == 0:
                        body = b'{"to": "user%d@example.org"}' % n
                        php[i + 1].sendall(phpmq.encode(phpmq.SEND, [(phpmq.QUEUE, queue), (phpmq.CONTENT, body)]))
                n += batch
                while (
                    delivery := consumer.receive(timeout_s=0.005)
                ) is not None:  # (all that came, each acked in time)
                    consumer.ack(delivery)
                time.sleep(max(0.0, 0.1 - (time.monotonic() - started - elapsed)))
    finally:
        for connection in php:
            connection.close()


if __name__ == "__main__":
    main()
