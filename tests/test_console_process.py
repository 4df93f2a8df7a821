"""The web console as a child process of `pzq serve` (pzq/server/console_child.py): started after the
bind, restarted when it dies, stopped with the server, gone when the server is killed, and with CURVE a
monitor client with a key of its own that never shows in /proc. Each runs twice: against the real
`pzq console` and against tests/console_stand_in.py (the same command line and duties, no web stack),
so that the supervisor's own behaviour is told apart from the console's."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from pzq import config
from pzq.cli import cli
from pzq.clients import native as client
from pzq.server.console_child import ConsoleChild

from conftest import ProcessServer, free_tcp_endpoint, wait_until

# A SCHED_IDLE console gets only CPU time nothing else wants: beside CI's two busy workers (Spark's JVMs,
# the torture run) none for minutes; 60 s for its first page failed there.
STARVED_S = 180
pytestmark = pytest.mark.timeout(420)
STAND_IN = str(Path(__file__).with_name("console_stand_in.py"))
MODES = ["pzq console", "stand-in"]
STARTED = re.compile(r"web console at (\S+): child pid (\d+)")


def console_server(tmp_path: Path, mode: str, *extra: str, port: int | None = None) -> tuple[ProcessServer, str]:
    """A `pzq serve` subprocess with --http-dsn (not yet started), and the console's URL."""
    if port is None:
        _, (_, port) = free_tcp_endpoint()
    url = f"http://127.0.0.1:{port}"
    srv = ProcessServer(tmp_path, "--http-dsn", url, *extra)
    if mode == "stand-in":
        srv.argv[1:4] = [STAND_IN, "serve"]  # (python -m pzq serve ... -> python console_stand_in.py serve ...)
    return srv, url


def children(srv: ProcessServer) -> list[int]:
    """The console children the server has logged starting, oldest first."""
    return [int(m.group(2)) for m in STARTED.finditer(srv.log.read_text())]


def page(url: str) -> int | None:
    """The status of the console's first page, or None if nothing answers."""
    try:
        with urllib.request.urlopen(url + "/", timeout=5) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def overview(url: str) -> dict:
    """The real console's overview as JSON."""
    with urllib.request.urlopen(url + "/api/overview", timeout=5) as answer:
        return json.loads(answer.read())


def gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[1])


@pytest.mark.parametrize("mode", MODES)
def test_serve_with_an_http_dsn_starts_the_console_as_a_lower_priority_child_whose_page_answers(tmp_path, mode):
    srv, url = console_server(tmp_path, mode, "--log-format", "json")
    srv.start()
    try:
        pid = wait_until(lambda: children(srv), timeout_s=30)[0]
        assert parent_of(pid) == srv.proc.pid
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # (only CPU time that nothing else wants)
        assert wait_until(lambda: page(url), timeout_s=STARVED_S) == 200
        assert f"web console at {url}/: child pid {pid}" in srv.log.read_text()
        if mode == "pzq console":  # (it logs as the server was told to, though no flag of its says so)
            lines = [json.loads(line) for line in srv.log.read_text().splitlines() if line.startswith("{")]
            assert any(line["logger"] == "pzq.console" and line["pid"] == pid for line in lines)
    finally:
        srv.stop(signal.SIGKILL)


@pytest.mark.parametrize("mode", MODES)
def test_a_killed_console_is_started_again_and_its_end_logged(tmp_path, mode):
    srv, url = console_server(tmp_path, mode)
    srv.start()
    try:
        first = wait_until(lambda: children(srv), timeout_s=30)[0]
        wait_until(lambda: page(url), timeout_s=STARVED_S)
        os.kill(first, signal.SIGKILL)
        pids = wait_until(lambda: children(srv)[1:], timeout_s=30)
        assert pids[0] != first
        log = srv.log.read_text()
        assert re.search(rf"child pid {first} was killed by SIGKILL after [\d.]+ s.*started again in 1 s", log), log
        assert wait_until(lambda: page(url), timeout_s=STARVED_S) == 200
        assert srv.stats()["messages"] == 0  # (the server itself never noticed anything)
    finally:
        srv.stop(signal.SIGKILL)


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_to_serve_stops_the_console_first(tmp_path, mode):
    srv, url = console_server(tmp_path, mode)
    srv.start()
    pid = wait_until(lambda: children(srv), timeout_s=30)[0]
    wait_until(lambda: page(url), timeout_s=STARVED_S)
    assert srv.stop(signal.SIGTERM) == 0
    assert gone(pid)
    # (stopped by the SIGTERM, not the SIGKILL 5 s later: the console exits 0, or re-raises the signal)
    stopped = re.search(rf"web console: child pid {pid} stopped \((.*)\)", srv.log.read_text())
    assert stopped and stopped.group(1) in ("exited with status 0", "was killed by SIGTERM"), srv.log.read_text()
    assert "still running" not in srv.log.read_text()
    assert page(url) is None


@pytest.mark.parametrize("mode", MODES)
def test_a_sigkilled_serve_takes_its_console_with_it(tmp_path, mode):
    srv, url = console_server(tmp_path, mode)
    srv.start()
    pid = wait_until(lambda: children(srv), timeout_s=30)[0]
    wait_until(lambda: page(url), timeout_s=STARVED_S)
    srv.stop(signal.SIGKILL)  # (no stop of its own: the pipe's EOF and PR_SET_PDEATHSIG are what is left)
    wait_until(lambda: gone(pid), timeout_s=30)
    wait_until(lambda: page(url) is None, timeout_s=30)


@pytest.mark.parametrize("mode", MODES)
def test_a_console_port_already_taken_is_retried_with_a_growing_wait_while_producers_are_served(tmp_path, mode):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    srv, url = console_server(tmp_path, mode, port=squatter.getsockname()[1])
    srv.start()
    try:
        wait_until(lambda: "started again in 2 s" in srv.log.read_text(), timeout_s=60)
        log = srv.log.read_text()
        assert re.search(r"child pid \d+ exited with status [1-9]\d* after [\d.]+ s.*started again in 1 s", log), log
        with client.Producer(srv.receive, timeout_s=5) as producer:
            assert producer.produce([b"served all along"]).ok
        squatter.close()  # the port comes free: the next start takes it
        assert wait_until(lambda: page(url), timeout_s=STARVED_S) is not None
        assert srv.stats()["messages"] == 1
    finally:
        squatter.close()
        srv.stop(signal.SIGKILL)


@pytest.fixture
def keys(tmp_path):
    runner = CliRunner()
    for name in ("server", "alice"):
        result = runner.invoke(cli, ["keygen", str(tmp_path / name), name])
        assert result.exit_code == 0, result.output
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "alice.key").write_bytes((tmp_path / "alice" / "alice.key").read_bytes())
    return tmp_path


def start_keyed(srv: ProcessServer, keys: Path) -> None:
    """Start ``srv`` (its monitor wants a key: ProcessServer.start's keyless MONITOR gets no answer)."""
    alice = (str(keys / "alice" / "alice.key_secret"), str(keys / "server" / "server.key"))
    with open(srv.log, "ab") as out:
        srv.proc = subprocess.Popen(srv.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until(lambda: srv.proc.poll() is not None or client.monitor_request(srv.monitor, curve=alice), timeout_s=60)
    assert srv.proc.poll() is None, srv.log.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_with_curve_the_console_reaches_pzq_with_its_own_key_which_proc_never_shows(tmp_path, mode, keys):
    curve = ("--curve-secret-key", str(keys / "server" / "server.key_secret"), "--curve-clients", str(keys / "clients"))
    srv, url = console_server(tmp_path, mode, *curve, "--unauthenticated", "console")
    start_keyed(srv, keys)
    try:
        pid = wait_until(lambda: children(srv), timeout_s=30)[0]
        assert wait_until(lambda: page(url) == 200, timeout_s=STARVED_S)
        if mode == "stand-in":  # (its page is STATS as pzq answered it to the console's key)
            with urllib.request.urlopen(url + "/", timeout=5) as answer:
                assert b'"messages"' in answer.read()
        else:  # (the overview's figures come from STATS, null until pzq has answered one)
            assert wait_until(lambda: overview(url)["figures"]["messages"] == 0, timeout_s=STARVED_S)
            assert not overview(url)["snapshot"]["error"]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        server_public = (keys / "server" / "server.key").read_text().split('public-key = "')[1].split('"')[0]
        assert argv[argv.index(b"--curve-server-key") + 1] == server_public.encode()
        assert b"--curve-key-stdin" in argv
        keylike = [a for a in argv if re.fullmatch(rb"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}", a)]
        assert keylike == [server_public.encode()], "no key but the server's public one on the command line"
        with open(f"/proc/{pid}/environ", "rb") as f, open(f"/proc/{srv.proc.pid}/environ", "rb") as g:
            child, server = set(f.read().split(b"\0")), set(g.read().split(b"\0"))
        assert child - server == {b"PZQ_LOG_LEVEL=info", b"PZQ_LOG_FORMAT=text"}, "the server's, and its log settings"
    finally:
        srv.stop(signal.SIGKILL)


def quitting_child(tmp_path: Path, code: int) -> list[str]:
    # (reads the key line first; a shell, not an interpreter: eight starts of Python took 1-9 s)
    return ["/bin/sh", "-c", f"read line; exit {code}"]


def test_restart_waits_double_from_one_second_to_thirty_and_start_over_after_a_long_life(tmp_path, caplog):
    cfg = config.Config(database=str(tmp_path / "db"), http_dsn="http://127.0.0.1:1")
    child = ConsoleChild(cfg, command=quitting_child(tmp_path, 3), limits=dataclasses.replace(cfg.limits))
    caplog.set_level("INFO")
    now, waits = 0.0, []
    child.start(now)
    for _ in range(7):
        assert child.proc is not None
        child.proc.stdin.close()  # (EOF: the stand-in reads a line, then exits 3)
        child.proc.wait(10)
        child.check(now)  # noticed: its end logged, the next start due after the wait
        assert child.proc is None
        due = float(re.findall(r"started again in ([\d.]+) s", caplog.text)[-1])
        waits.append(due)
        child.check(now + due - 0.01)
        assert child.proc is None, "not before its wait is over"
        now += due
        child.check(now)
    assert waits == [1, 2, 4, 8, 16, 30, 30]
    assert "exited with status 3" in caplog.text
    child.proc.stdin.close()
    child.proc.wait(10)
    child.check(now + 60)  # this one lived a minute: the wait starts over
    assert re.findall(r"started again in ([\d.]+) s", caplog.text)[-1] == "1"
    child.stop()
    assert child.proc is None and child.starts == 8


def test_a_sighup_reaches_the_console_whose_key_stays_allowed_after_the_clients_directory_is_reread(tmp_path, keys):
    secret = tmp_path / "console.secret"
    secret.write_text("a console secret of enough bytes\n")
    secret.chmod(0o600)
    curve = ("--curve-secret-key", str(keys / "server" / "server.key_secret"), "--curve-clients", str(keys / "clients"))
    srv, url = console_server(tmp_path, "stand-in", *curve, "--unauthenticated", "console")
    srv.argv += ["--http-auth-file", str(secret)]
    start_keyed(srv, keys)
    try:
        pid = wait_until(lambda: children(srv), timeout_s=30)[0]
        assert wait_until(lambda: page(url) == 200, timeout_s=STARVED_S)
        srv.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "pzq console (stand-in): SIGHUP" in srv.log.read_text(), timeout_s=30)
        log = srv.log.read_text()
        assert (
            f"SIGHUP: passed on to the web console (pid {pid})" in log and "CURVE client keys re-read: 1 allowed" in log
        )
        assert page(url) == 200, "the console's STATS is still answered: its key survived the reload"
        assert children(srv) == [pid]
    finally:
        srv.stop(signal.SIGKILL)


def test_a_key_allowed_in_memory_survives_reloads_and_goes_when_taken_away(keys):
    import zmq

    from pzq.curve import CurveServer

    curve = CurveServer(zmq.Context.instance(), str(keys / "server" / "server.key_secret"), str(keys / "clients"))
    try:
        first, _ = zmq.curve_keypair()
        second, _ = zmq.curve_keypair()
        curve.allow("console", first)
        assert curve.gate.admits(first.decode()) and curve.names[first.decode()] == "console"
        assert curve.reload() == set()
        assert curve.gate.admits(first.decode()) and first in curve.auth.certs["pzq"]
        curve.allow("console", second)  # (the next console process: the dead one's key goes)
        assert not curve.gate.admits(first.decode()) and first not in curve.auth.certs["pzq"]
        assert curve.gate.admits(second.decode())
        curve.allow("console", None)
        assert list(curve.names.values()) == ["alice"] and len(curve.gate.allowed) == 1
    finally:
        curve.close()


def test_a_console_that_ignores_sigterm_is_killed_when_its_wait_is_over(tmp_path, caplog):
    script, ready = tmp_path / "deaf.py", tmp_path / "deaf.ready"
    script.write_text(
        "import signal, sys\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "sys.stdin.read()\nsignal.pause()\n"  # (not even EOF stops it: only SIGKILL does)
    )
    cfg = config.Config(database=str(tmp_path / "db"), http_dsn="http://127.0.0.1:1")
    limits = dataclasses.replace(cfg.limits, console_stop_s=0.5)
    child = ConsoleChild(cfg, command=[sys.executable, str(script)], limits=limits)
    caplog.set_level("INFO")
    child.start()
    proc = child.proc
    assert proc is not None
    wait_until(ready.exists, timeout_s=30)  # (its SIGTERM is ignored from here on)
    child.stop()
    assert proc.returncode == -signal.SIGKILL
    assert f"child pid {proc.pid} still running 0.5 s after SIGTERM: killed" in caplog.text
    child.check(1e9)
    assert child.proc is None, "no restart after a stop"


def test_an_inproc_monitor_cannot_serve_a_console_process():
    with pytest.raises(config.ConfigError, match="the console's process cannot reach --monitor-dsn inproc://m"):
        config.Config(http_dsn="http://127.0.0.1:9180", monitor_dsn="inproc://m").validate()
