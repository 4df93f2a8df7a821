"""How the console's pages answer at scale: a pzq server (a subprocess, its own tmp store) with its console
(`--http-dsn`, the server's child), QUEUES named queues of a message each (through the API) and
CONNECTIONS idle PHPMQ connections (what a fleet of workers looks like to the clients page), then each page
and its JSON twin asked ROUNDS times, one at a time: the time to its last byte (median and worst) and its
size, and what the server's loop took meanwhile (its CPU).

    .venv/bin/python scripts/console_scale.py [--queues 1000] [--connections 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from pzq.clients.admin import admin_request
from pzq.clients.api import ApiClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / 100


def fetch(url: str) -> tuple[float, int, int]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as page:
            body = page.read()
            status = page.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return time.perf_counter() - started, len(body), status


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            fetch(url)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the console at {url} did not answer in {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # The server inherits it, and keeps half of it for connections: 10,000 sockets on each side need 2 x 10,000+.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(hard, 2 * args.connections + 4096)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))  # (above the hard limit: root only)
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="pzq-scale-"))
    url, phpmq = f"http://127.0.0.1:{free_port()}", free_port()
    monitor = f"ipc://{tmp}/monitor"
    server = subprocess.Popen(
        [sys.executable, "-m", "pzq", "serve", "--database", str(tmp / "db"), "--http-dsn", url]
        + ["--phpmq-dsn", f"tcp://127.0.0.1:{phpmq}", "--monitor-dsn", monitor]
        + ["--receive-dsn", f"ipc://{tmp}/receive", "--send-dsn", f"ipc://{tmp}/send", "--consume-dsn", ""]
        # (one client may make 1 % of --max-queues)
        + ["--max-connections", str(args.connections + 1000), "--max-queues", str(100 * args.queues + 1000)]
        + ["--api-dsn", f"ipc://{tmp}/api", "--mqks-dsn", "", "--emqp-frontend-dsn", "", "--emqp-backend-dsn", ""]
        + ["--emqp-publish-dsn", ""],
        stderr=open(tmp / "server.log", "wb"),  # noqa: SIM115 - the server's, closed with it
    )
    conns: list[socket.socket] = []
    try:
        wait_for(url + "/", 60)
        with ApiClient(f"ipc://{tmp}/api") as api:  # (PRODUCE makes the queues it names)
            for start in range(0, args.queues, 500):
                api.produce([(f"q{i:04d}", b"x" * 100) for i in range(start, min(start + 500, args.queues))])
        for _ in range(args.connections):
            conns.append(socket.create_connection(("127.0.0.1", phpmq), timeout=10))
        deadline, open_now = time.monotonic() + 60, 0
        while open_now < args.connections and time.monotonic() < deadline:
            time.sleep(0.5)
            open_now = admin_request(monitor, ["STATS"], timeout_s=10).get("phpmq", {}).get("connections", 0)
        if open_now < args.connections:  # (the open-files limit caps --max-connections: the server log says so)
            raise SystemExit(f"only {open_now} of {args.connections} connections were let in: see {tmp}/server.log")
        time.sleep(2.5)  # (two polls: the console's snapshot has every queue)
        middle = f"q{args.queues // 2:04d}"
        pages = ["/", "/queues", f"/queues?page={args.queues // 100}", "/queues?sort=depth&order=desc"]
        pages += [f"/queue?name={middle}", f"/clients?offset={max(0, args.connections - 100)}", "/clients"]
        pages += ["/api/overview", "/api/queues", f"/api/queue?name={middle}"]
        pages += [f"/api/clients?offset={args.connections // 2}", "/nowhere"]
        print(f"{args.queues} queues, {args.connections} PHPMQ connections; {args.rounds} views each, one at a time")
        print("| page | status | median ms | worst ms | KiB |")
        print("|---|---|---:|---:|---:|")
        loop_cpu = cpu_s(server.pid)
        for path in pages:
            # (a second view within a second may be served from the console's cache: the rounds are spaced)
            times = []
            for _ in range(args.rounds):
                took, size, status = fetch(url + path)
                times.append(took)
                time.sleep(1.1)
            times.sort()
            median, worst = times[len(times) // 2] * 1e3, times[-1] * 1e3
            print(f"| `{path}` | {status} | {median:.1f} | {worst:.1f} | {size / 1024:.0f} |")
        print(f"the server's CPU meanwhile: {cpu_s(server.pid) - loop_cpu:.2f} s")
    finally:
        for conn in conns:
            conn.close()
        server.terminate()
        server.wait(30)
        if sys.exc_info()[0] is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
