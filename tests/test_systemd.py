"""Running under systemd: the unit verifies, and the notify protocol works through a real NOTIFY_SOCKET."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pzq.clients import native as client
from pzq.systemd import Notifier

from conftest import ProcessServer

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "pzq.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart exists: point it at this checkout's pzq instead of /opt/pzq.
    unit = tmp_path / "pzq.service"
    pzq = Path(sys.executable).with_name("pzq")  # (this interpreter's: a worktree has no .venv of its own)
    unit.write_text(UNIT.read_text().replace("/opt/pzq/.venv/bin/pzq", str(pzq)))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pzq.service" not in result.stderr, result.stderr  # no warning about the unit itself


def test_the_unit_runs_as_a_notify_service_sandboxed_with_its_own_user_state_and_config():
    settings = dict(
        line.split("=", 1) for line in UNIT.read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Type"] == "notify" and settings["WatchdogSec"]
    assert settings["User"] == "pzq" and settings["StateDirectory"] == "pzq"
    assert settings["Environment"] == "PZQ_CONFIG=/etc/pzq/pzq.toml"
    for key, value in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("ProtectHome", "yes"),
        ("CapabilityBoundingSet", ""),
    ):
        assert settings[key] == value, key


def receive(sock: socket.socket, timeout_s: float = 10.0) -> dict[str, str]:
    sock.settimeout(timeout_s)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


def test_the_server_says_ready_pings_the_watchdog_reloads_on_sighup_and_says_stopping(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    srv = None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        monkeypatch.setenv("WATCHDOG_USEC", "400000")
        srv = ProcessServer(tmp_path)
        srv.proc = subprocess.Popen(
            srv.argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        first = receive(listener)
        assert first["READY"] == "1" and first["MAINPID"] == str(srv.proc.pid)
        # Every socket was bound when READY came: the monitor answers at once, nobody waited for it.
        assert client.monitor_request(srv.monitor, timeout_s=0.3)
        pings, deadline = 0, time.monotonic() + 5
        while pings < 3 and time.monotonic() < deadline:
            pings += receive(listener).get("WATCHDOG") == "1"
        assert pings == 3
        srv.proc.send_signal(signal.SIGHUP)
        states = [receive(listener) for _ in range(6)]
        reload_at = next(i for i, s in enumerate(states) if s.get("RELOADING") == "1")
        assert any(s.get("READY") == "1" for s in states[reload_at + 1 :])
        assert srv.stop(signal.SIGTERM) == 0
        rest = []
        listener.settimeout(2)
        while True:
            try:
                rest.append(receive(listener, 2))
            except TimeoutError:
                break
        assert any(s.get("STOPPING") == "1" for s in rest)
    finally:
        listener.close()
        if srv.proc is not None and srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(5)


def test_without_notify_socket_the_notifier_does_nothing():
    notifier = Notifier.from_environment({})
    assert not notifier.enabled and notifier.watchdog_s is None
    assert notifier.ready("x") is False


def test_the_watchdog_is_for_us_only_if_its_pid_is_ours_or_unset():
    assert Notifier.from_environment({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000"}).watchdog_s == 2.0
    other = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert Notifier.from_environment(other).watchdog_s is None


def test_an_abstract_notify_socket_is_reached():
    name = f"pzq-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name)
    try:
        assert Notifier("@" + name).notify("READY=1")
        assert receive(listener, 2) == {"READY": "1"}
    finally:
        listener.close()
