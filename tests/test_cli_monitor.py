"""`pzq monitor` as an operator meets it: found from any directory, one clear line when nothing answers,
and --watch that redraws in place on a terminal (one time-stamped block per interval elsewhere); and the
commands beside it that name things: dead letters of a queue that does not exist, an MQKS publish that
nothing is bound to."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

from click.testing import CliRunner

from pzq.cli import cli
from pzq.cli.common import monitor_endpoint
from pzq.errors import ExitCode

from conftest import free_tcp_endpoint

NO_SETTINGS = {"PZQ_CONFIG": None, "PZQ_MONITOR_DSN": None, "PZQ_DATABASE": None}


def run(*args: str):
    return CliRunner().invoke(cli, list(args), env=NO_SETTINGS, catch_exceptions=False)


def test_no_answer_is_one_line_naming_the_absolute_socket_and_asking_if_pzq_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("monitor", "--timeout", "200ms")
    assert result.exit_code == ExitCode.NOT_LISTENING
    socket = f"{tmp_path}/pzq-data/monitor"
    assert result.output.strip().splitlines() == [
        f"pzq: error: nothing listens at ipc://{socket}: there is no socket file {socket} (is pzq running there?)"
    ]


def test_without_settings_or_a_local_store_the_monitor_is_the_installed_services(tmp_path, monkeypatch):
    service = tmp_path / "pzq.toml"
    service.write_text('database = "/var/lib/pzq"\nmonitor_dsn = "ipc:///run/pzq/monitor"\n')
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    for name in NO_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert monitor_endpoint(None, None, str(service)) == "ipc:///run/pzq/monitor"
    # a store in this directory, or anything named, wins over the service's file
    assert monitor_endpoint(None, "ipc://mine", str(service)) == f"ipc://{here}/mine"
    (here / "pzq-data").mkdir()
    (here / "pzq-data" / "monitor").write_text("")
    assert monitor_endpoint(None, None, str(service)) == f"ipc://{here}/pzq-data/monitor"
    monkeypatch.setenv("PZQ_DATABASE", str(tmp_path / "db"))
    assert monitor_endpoint(None, None, str(service)) == f"ipc://{tmp_path}/db/monitor"


def test_the_table_puts_the_queues_first_under_the_time(server):
    assert run("produce", "--receive-dsn", server.receive, "x").exit_code == 0
    lines = run("monitor", "--monitor-dsn", server.monitor).output.splitlines()
    assert lines[0].startswith(f"pzq at {server.monitor}, {time.strftime('%Y-%m-%d')} ")
    assert lines[2].split() == ["queue", "depth", "inflight", "dead"]
    assert lines[3].split() == ["default", "1", "0", "0"]
    assert any(line.split() == ["messages", "1"] for line in lines[4:])


def _watch(server, stdout) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pzq", "monitor", "--monitor-dsn", server.monitor, "--watch", "100ms"],
        stdout=stdout,
        stderr=subprocess.DEVNULL,
    )


def _read_until(fd: int, count: int, marker: bytes, timeout_s: float = 20) -> bytes:
    """What ``fd`` gives until ``marker`` was seen ``count`` times (or the time is up)."""
    out = b""
    deadline = time.monotonic() + timeout_s
    while out.count(marker) < count and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
    return out


def test_watch_on_a_terminal_redraws_in_place(server):
    main, child = pty.openpty()
    proc = _watch(server, child)
    os.close(child)
    try:
        out = _read_until(main, 3, b"pzq at ")
    finally:
        proc.terminate()
        proc.wait(10)
        os.close(main)
    frames = out.split(b"\x1b[H\x1b[2J")
    assert len(frames) >= 4 and frames[0] == b""  # every frame starts by clearing the screen
    assert all(f.startswith(b"pzq at ") and b"every 100ms" in f for f in frames[1:3])


def test_watch_into_a_pipe_writes_one_time_stamped_block_per_interval(server):
    proc = _watch(server, subprocess.PIPE)
    assert proc.stdout is not None
    try:
        out = _read_until(proc.stdout.fileno(), 3, b"pzq at ")
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
    assert b"\x1b" not in out
    blocks = out.decode().split("\npzq at ")
    assert len(blocks) >= 3 and blocks[0].startswith("pzq at ")
    for block in blocks[1:3]:  # each a whole block, after a blank line: the time, then the queues
        assert block.startswith(f"{server.monitor}, {time.strftime('%Y-%m-%d')} ")
        assert block.splitlines()[2].split() == ["queue", "depth", "inflight", "dead"]
    assert out.decode().count("\n\npzq at ") == len(blocks) - 1  # a blank line between blocks


def test_dead_letters_of_a_queue_the_server_does_not_have_is_an_error_not_an_empty_list(server):
    result = run("dead-letters", "list", "--monitor-dsn", server.monitor, "nosuchqueue")
    assert result.exit_code == ExitCode.NOT_FOUND == 4
    assert result.output.strip() == "pzq: error: there is no queue 'nosuchqueue'"  # (as every queue command says)
    result = run("dead-letters", "requeue", "--monitor-dsn", server.monitor, "--all", "nosuchqueue")
    assert result.exit_code == ExitCode.NOT_FOUND
    # a queue that exists with no dead letters lists none, successfully, and says so on standard error
    result = run("dead-letters", "list", "--monitor-dsn", server.monitor, "default")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "queue 'default' has no dead letters\n")


def test_mqks_publish_to_an_event_nothing_is_bound_to_publishes_nothing_and_exits_unrouted(make_server):
    mqks, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=mqks)
    env = {**NO_SETTINGS, "PZQ_MQKS_DSN": mqks, "PZQ_MONITOR_DSN": srv.monitor}
    runner = CliRunner()
    result = runner.invoke(cli, ["mqks", "publish", "nobody.listens", "hello"], env=env)
    assert result.exit_code == ExitCode.UNROUTED
    assert result.output.strip() == (
        "pzq: error: no queue is bound to event 'nobody.listens': nothing published (MQKS drops such a message; "
        "bind one: pzq mqks consume QUEUE nobody.listens, or publish anyway with --allow-unrouted)"
    )
    assert srv.stats()["mqks"]["unrouted_total"] == 0, "nothing was sent to be dropped"
    anyway = runner.invoke(cli, ["mqks", "publish", "nobody.listens", "lost", "--allow-unrouted"], env=env)
    assert (anyway.exit_code, anyway.output.strip()) == (
        0,
        "1 published and dropped: no queue is bound to 'nobody.listens' (--allow-unrouted)",
    )
    assert srv.stats()["mqks"]["unrouted_total"] == 1
    bound = runner.invoke(cli, ["mqks", "consume", "q", "nobody.listens", "--timeout", "100ms"], env=env)
    assert bound.exit_code == ExitCode.NO_MESSAGE  # (nothing there yet; the queue is bound from now on)
    result = runner.invoke(cli, ["mqks", "publish", "nobody.listens", "hello"], env=env)
    assert (result.exit_code, result.output.strip()) == (0, "1 published to 1 queue(s)")
    got = runner.invoke(cli, ["mqks", "consume", "q", "--timeout", "5s"], env=env)
    assert got.exit_code == 0 and got.output.split("\t")[1:] == ["nobody.listens", "0", "hello\n"]


def test_mqks_publish_without_a_monitor_to_ask_publishes_and_says_binding_is_not_known(make_server, tmp_path):
    mqks, _ = free_tcp_endpoint()
    make_server(mqks_dsn=mqks)
    env = {**NO_SETTINGS, "PZQ_MQKS_DSN": mqks, "PZQ_MONITOR_DSN": f"ipc://{tmp_path}/nothing-here"}
    result = CliRunner().invoke(cli, ["mqks", "publish", "some.event", "hello"], env=env)
    assert (result.exit_code, result.output.strip()) == (
        0,
        f"1 published (whether a queue is bound to 'some.event' is not known: no monitor answered at "
        f"ipc://{tmp_path}/nothing-here)",
    )


def test_mqks_publish_refuses_an_event_with_spaces_in_one_line(server):
    result = CliRunner().invoke(cli, ["mqks", "publish", "two words", "x"], env=NO_SETTINGS)
    assert (result.exit_code, result.output.strip()) == (
        ExitCode.USAGE,
        "pzq: error: an MQKS event is one word without spaces, got 'two words'",
    )
