"""One setting moves every endpoint of a development server (issue 42): a real server started with only
``--config dev.toml`` (``base_port`` in it), and the client commands reaching it with only that file."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pzq.clients import native as client

from conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # (a subprocess server)


def _free_base() -> int:
    """A base port whose eleven ports (base + 0 to + 10) are all free on loopback just now, below the
    kernel's ephemeral range: the other tests' ports (``free_tcp_endpoint``) and every outgoing
    connection's come from that range, and a base inside it had taken a port another test was given."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        base = random.randrange(min(20000, low // 2), low - 11)
        taken = []
        try:
            for port in range(base, base + 11):
                sock = socket.socket()
                taken.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in taken:
                sock.close()
    pytest.fail("no eleven free loopback ports in a row")


def _pzq(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pzq", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_server_and_its_clients_moved_by_one_base_port_in_one_config_file(tmp_path):
    base = _free_base()
    dev = tmp_path / "dev.toml"
    # The README's second development server: a base port and a store of its own, nothing else.
    dev.write_text(f'base_port = {base}\ndatabase = "./pzq-data-2"\ndisk_reserve = "0"\n')
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "pzq", "serve", "--config", str(dev)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def answers() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                return bool(client.monitor_request(f"ipc://{tmp_path}/pzq-data-2/monitor", timeout_s=0.2))
            except client.ClientError:
                return False

        wait_until(answers, timeout_s=30)
        # Every tcp endpoint is where the table puts it: each port is taken by the server now.
        for port in range(base, base + 9):
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", port)) == 0, f"nothing listens on {port}"
        produced = _pzq("produce", "--config", "dev.toml", "hello", "world", cwd=tmp_path)
        assert produced.returncode == 0, produced.stderr
        consumed = _pzq("consume", "--config", "dev.toml", "-n", "1", "--timeout", "10s", cwd=tmp_path)
        assert consumed.returncode == 0 and consumed.stdout.split() == ["hello"], consumed.stderr
        # PZQ_CONFIG does what --config does, for every command.
        shown = _pzq("monitor", cwd=tmp_path, env={"PZQ_CONFIG": "dev.toml"})
        assert shown.returncode == 0, shown.stderr
        assert "messages" in shown.stdout
        # MQKS: a consumer bound to the event first (as the README's example), then the publish reaches it.
        with subprocess.Popen(
            [sys.executable, "-m", "pzq", "mqks", "consume", "--config", "dev.toml", "-n", "1", "greetings", "hi"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as consumer:
            bound = ("queue", "show", "--config", "dev.toml", "greetings")  # (exits 0 once the queue exists)
            wait_until(lambda: _pzq(*bound, cwd=tmp_path).returncode == 0, timeout_s=20)
            published = _pzq("mqks", "publish", "--config", "dev.toml", "hi", "there", cwd=tmp_path)
            assert published.returncode == 0, published.stderr
            out, err = consumer.communicate(timeout=30)
        assert consumer.returncode == 0 and out.split()[1:] == ["hi", "0", "there"], err
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
