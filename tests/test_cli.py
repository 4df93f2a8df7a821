"""The `pzq` command line, through click's runner against a real server, and once as a real subprocess."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from click.testing import CliRunner

from pzq.cli import cli
from pzq.errors import ExitCode


def run(*args: str, input: str | None = None, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


def test_help_exits_0_for_every_command():
    for args in (
        [],
        ["serve"],
        ["monitor"],
        ["produce"],
        ["consume"],
        ["dead-letters"],
        ["dead-letters", "list"],
        ["dead-letters", "requeue"],
        ["mqks"],
        ["mqks", "publish"],
        ["mqks", "consume"],
        ["bench"],
    ):
        result = run(*args, "--help")
        assert result.exit_code == 0, (args, result.output)
        assert "Usage:" in result.output


def test_serve_help_keeps_the_original_option_names():
    out = run("serve", "--help").output
    for option in (
        "--database",
        "--receive-dsn",
        "--send-dsn",
        "--monitor-dsn",
        "--ack-timeout",
        "--reaper-frequency",
        "--hard-sync",
        "--user",
        "--config",
    ):
        assert option in out


def test_a_bad_option_value_is_one_clear_line_and_exit_2(tmp_path):
    result = run("serve", "--database", str(tmp_path / "db"), "--ack-timeout", "-5")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == ["pzq: error: --ack-timeout: must be at least 1ms, got -5µs"]


def test_a_duration_flag_takes_a_unit_and_its_error_names_the_flag_with_units(tmp_path):
    result = run("serve", "--database", str(tmp_path / "db"), "--ack-timeout", "500us")
    assert (result.exit_code, result.output.strip()) == (
        2,
        "pzq: error: --ack-timeout: must be at least 1ms, got 500µs",
    )
    result = run("serve", "--database", str(tmp_path / "db"), "--lease-timeout", "5 parsecs")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "pzq: error: --lease-timeout: '5 parsecs' is not a duration such as 250ms, 30s, 5m or 1h"
    )


def test_every_serve_option_is_made_from_a_config_field_and_shows_its_default_with_its_unit():
    from pzq import config
    from pzq.cli.serve import serve

    params = {p.name: p for p in serve.params}
    assert set(params) == {"config_file", *config.FIELDS}
    for name, field in config.FIELDS.items():
        shown = config.show(name, field.default)
        assert params[name].help.endswith(f"  [default: {shown}]"), name
        assert params[name].help.startswith(field.metadata["help"]), name
    assert "[default: 5s]" in params["ack_timeout"].help and "A plain number is µs." in params["ack_timeout"].help
    assert "[default: 1h]" in params["lease_timeout"].help and "plain number is seconds" in params["lease_timeout"].help
    assert "[default: 4G]" in params["max_store_size"].help
    assert "[default: 1000 deliveries]" in params["max_inflight"].help


def test_exit_codes_have_names():
    from pzq.errors import ExitCode

    assert (ExitCode.OK, ExitCode.FAILURE, ExitCode.CONFIG, ExitCode.USAGE, ExitCode.STORE) == (0, 1, 2, 2, 3)


def test_a_broken_config_file_is_one_clear_line_and_exit_2(tmp_path):
    conf = tmp_path / "pzq.toml"
    conf.write_text("ack_timeout = [1, 2\n")
    result = run("serve", "--config", str(conf))
    assert result.exit_code == 2
    assert "not valid TOML" in result.output and "Traceback" not in result.output


def test_an_endpoint_in_use_is_reported_without_a_traceback(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with taken:
        result = run(
            "serve",
            "--database",
            str(tmp_path / "db"),
            "--receive-dsn",
            f"tcp://127.0.0.1:{taken.getsockname()[1]}",
            "--send-dsn",
            f"ipc://{tmp_path}/s",
            "--monitor-dsn",
            f"ipc://{tmp_path}/m",
        )
    assert result.exit_code == 2
    assert "cannot bind" in result.output and "Traceback" not in result.output


def test_a_start_that_cannot_bind_leaves_no_new_store_directory_and_keeps_an_existing_one(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    endpoints = ["--receive-dsn", f"tcp://127.0.0.1:{taken.getsockname()[1]}", "--send-dsn", f"ipc://{tmp_path}/s"]
    endpoints += ["--consume-dsn", "", "--phpmq-dsn", "", "--mqks-dsn", "", "--api-dsn", ""]
    endpoints += ["--emqp-frontend-dsn", "", "--emqp-backend-dsn", "", "--emqp-publish-dsn", ""]
    with taken:
        result = run("serve", "--database", str(tmp_path / "new" / "deeper" / "db"), *endpoints)
        assert result.exit_code == 2 and "cannot bind" in result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # (new/ and new/deeper/ were this start's too)
        kept = tmp_path / "kept"
        kept.mkdir()
        (kept / "notes.txt").write_text("mine")
        result = run("serve", "--database", str(kept), *endpoints)
        assert result.exit_code == 2
        assert (kept / "notes.txt").read_text() == "mine" and (kept / "data.mdb").exists()


def test_produce_then_consume_round_trips_lines_in_order(server):
    produced = run("produce", "--receive-dsn", server.receive, input="one\ntwo\nthree\n")
    assert produced.exit_code == 0, produced.output
    consumed = run("consume", "--send-dsn", server.send, "-n", "3", "--timeout", "5s")
    assert consumed.exit_code == 0
    assert consumed.output.splitlines() == ["one", "two", "three"]


def test_produce_takes_messages_from_arguments_and_the_environment_names_the_endpoint(server):
    result = run("produce", "a", "b", env={"PZQ_RECEIVE_DSN": server.receive})
    assert result.exit_code == 0
    assert server.stats()["messages"] == 2


def test_produce_says_at_once_that_nothing_listens_at_an_ipc_path_with_no_socket_file(tmp_path):
    result = run("produce", "--receive-dsn", f"ipc://{tmp_path}/nobody", "--timeout", "300ms", "x")
    assert result.exit_code == ExitCode.NOT_LISTENING
    assert f"nothing listens at ipc://{tmp_path}/nobody: there is no socket file" in result.output


def test_consume_exits_no_message_when_no_message_comes(server):
    result = run("consume", "--send-dsn", server.send, "--timeout", "300ms")
    assert result.exit_code == ExitCode.NO_MESSAGE


def test_client_timeouts_take_units_and_a_plain_number_whose_meaning_changed_is_refused_in_one_line(server):
    result = run("consume", "--send-dsn", server.send, "--timeout", "300ms")
    assert result.exit_code == ExitCode.NO_MESSAGE and "no message came within 300ms (0 received)" in result.output
    result = run("consume", "--send-dsn", server.send, "--timeout", "0.2s")
    assert result.exit_code == ExitCode.NO_MESSAGE and "no message came within 200ms (0 received)" in result.output
    result = run("consume", "--send-dsn", server.send, "--timeout", "200")  # (was 200 ms; 200 s would hang)
    assert (result.exit_code, result.output.strip()) == (
        2,
        "pzq: error: --timeout: give a unit (500us, 2ms, 1s): a plain number's meaning changes from "
        "milliseconds to seconds in this release",
    )
    result = run("consume", "--send-dsn", server.send, "--timeout", "soon")
    assert result.exit_code == 2 and "'soon' is not a duration" in result.output


def test_monitor_prints_a_table_and_json(server):
    run("produce", "--receive-dsn", server.receive, "x")
    table = run("monitor", "--monitor-dsn", server.monitor)
    assert table.exit_code == 0
    assert "messages " in table.output and "default" in table.output
    figures = json.loads(run("monitor", "--monitor-dsn", server.monitor, "--json").output)
    assert figures["messages"] == 1 and figures["queues"]["default"]["depth"] == 1


def test_dead_letters_can_be_listed_and_requeued(make_server):
    server = make_server(max_deliveries=1)
    run("produce", "--receive-dsn", server.receive, "poison")
    assert run("consume", "--send-dsn", server.send, "--nack").exit_code == 0
    assert run("consume", "--send-dsn", server.send, "--timeout", "300ms").exit_code == ExitCode.NO_MESSAGE
    listed = run("dead-letters", "list", "--monitor-dsn", server.monitor, "default")
    letter = json.loads(listed.output.splitlines()[0])
    assert letter["body"] == ["poison"] and letter["reason"] == "max-deliveries"
    requeued = run("dead-letters", "requeue", "--monitor-dsn", server.monitor, "default", letter["id"])
    assert requeued.output.strip() == "requeued 1"
    assert server.stats()["messages"] == 1
    bad = run("dead-letters", "requeue", "--monitor-dsn", server.monitor, "default", "nonsense")
    assert bad.exit_code == 1 and "not a dead letter id" in bad.output


def test_the_installed_command_runs_as_a_real_process(process_server):
    server = process_server()
    produced = subprocess.run(
        [sys.executable, "-m", "pzq", "produce", "--receive-dsn", server.receive, "hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [sys.executable, "-m", "pzq", "consume", "--send-dsn", server.send], capture_output=True, text=True, timeout=60
    )
    assert consumed.stdout == "hi\n"
    version = subprocess.run([sys.executable, "-m", "pzq", "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "pzq" in version.stdout


def test_json_logs_are_one_object_per_line(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            str(tmp_path / "db"),
            "--receive-dsn",
            f"ipc://{tmp_path}/r",
            "--send-dsn",
            f"ipc://{tmp_path}/s",
            "--monitor-dsn",
            f"ipc://{tmp_path}/m",
            "--phpmq-dsn",
            "",
            "--emqp-frontend-dsn",
            "",
            "--emqp-backend-dsn",
            "",
            "--mqks-dsn",
            "",
            "--api-dsn",
            "",
            "--log-format",
            "json",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(proc.stderr.readline())
        assert first["level"] == "info" and first["logger"] == "pzq.server" and "serving" in first["message"]
        assert first["time"].endswith("+00:00")
    finally:
        proc.terminate()
        proc.wait(15)
    assert all(json.loads(line)["message"] for line in proc.stderr.read().splitlines())
