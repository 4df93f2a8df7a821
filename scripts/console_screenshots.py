"""The README's pictures of the web console: a pzq server (a subprocess, its own tmp store) with a
minute or so of traffic (a producer at a rate that rises and falls, a consumer that acks, a PHPMQ
connection, three poison messages in the dead letters), then Debian's Chromium, headless, saves the
overview, the clients page, and a queue's page after a logged-in requeue.

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
import time

from pzq.clients import native as client

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
    from selenium.webdriver.support.wait import WebDriverWait

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pzq-shots-"))
    secret = tmp / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    url, phpmq = f"http://127.0.0.1:{free_port()}", free_port()
    ends = {name: f"ipc://{tmp}/{name}" for name in ("receive", "send", "monitor")}
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
                client.stats(ends["monitor"], timeout_ms=500)
                break
            except client.ClientError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit(f"the server did not start:\n{(tmp / 'server.log').read_text()}")
        traffic(ends, args.seconds, phpmq)
        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
            options.add_argument(flag)
        driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            with socket.create_connection(("127.0.0.1", phpmq)):
                driver.get(url + "/")
                driver.save_screenshot(str(out / "console-overview.png"))
                driver.get(url + "/clients")
                driver.save_screenshot(str(out / "console-clients.png"))
            driver.get(url + "/login")
            driver.find_element("name", "secret").send_keys(SECRET)
            driver.find_element("css selector", "form[action='/login'] button").click()
            WebDriverWait(driver, 10).until(lambda d: d.find_elements("css selector", "form[action='/logout']"))
            driver.get(url + "/queue?name=default")
            driver.save_screenshot(str(out / "console-queue.png"))  # (replaced below, after the requeue)
            driver.find_element("css selector", "td.actions button[data-action='/queue/requeue']").click()
            driver.execute_script("window.scrollTo(0, 0)")  # (the click scrolled down to the dead letters)
            driver.save_screenshot(str(out / "console-queue.png"))
        finally:
            driver.quit()
        print("screenshots:", *sorted(str(p) for p in out.glob("console-*.png")))
    finally:
        server.terminate()
        server.wait(20)
        shutil.rmtree(tmp, ignore_errors=True)


def traffic(ends: dict[str, str], seconds: float, phpmq: int) -> None:
    """Poison first (delivered once, never acked: dead), then a rising and falling rate, acked."""
    with client.Producer(ends["receive"]) as producer:
        assert all(r.ok for r in producer.produce_many([b'{"job": "resize", "image": %d}' % i] for i in range(3)))
    with client.Consumer(ends["send"]) as consumer:
        for _ in range(3):
            consumer.receive(5000)
        deadline = time.monotonic() + 30
        while client.stats(ends["monitor"])["queues"]["default"]["dead_letters"] < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    started = time.monotonic()
    with client.Producer(ends["receive"]) as producer, client.Consumer(ends["send"]) as consumer:
        n = 0
        while (elapsed := time.monotonic() - started) < seconds:
            rate = 400 + 300 * math.sin(elapsed / 12)  # messages a second, for the charts' shape
            batch = max(1, int(rate / 10))
            producer.produce_many([b'{"event": "page_view", "n": %d}' % (n + i)] for i in range(batch))
            n += batch
            while (delivery := consumer.receive(5)) is not None:  # (all that came, each acked in time)
                consumer.ack(delivery)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - started - elapsed)))


if __name__ == "__main__":
    main()
