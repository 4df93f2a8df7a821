"""No input makes a `pzq` command print a traceback: every command and subcommand of the group (found
from the group itself, so that a command added later is walked too) is run with bad values of each kind
its options take (an endpoint without a port, a negative count, a duration in no unit or a wrong one, a
missing file, a choice not offered) and says one line on standard error with a named exit code.

And the three silences a client meets are told apart (pzq/clients/reach.py): nothing listens (within a
second, in a real process), the server wants a CURVE key, and no message came."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from cli_walk import commands
from click.testing import CliRunner

from pzq import config
from pzq.cli import cli
from pzq.cli.common import Duration
from pzq.errors import ExitCode

from conftest import free_tcp_endpoint

pytestmark = pytest.mark.timeout(120)
PZQ = str(Path(sys.executable).parent / "pzq")


def kind(option: click.Option) -> str | None:
    """What an option takes, as far as bad values go (None: free text, nothing to refuse)."""
    unit = config.FIELDS[option.name].metadata["unit"] if option.name in config.FIELDS else None
    if isinstance(option.type, Duration) or option.name in config.DURATION_FIELDS:
        return "duration"
    if unit == config.SIZE:
        return "size"
    if option.name.endswith("_dsn"):
        return "endpoint"
    if isinstance(option.type, click.Choice):
        return "choice"
    if isinstance(option.type, click.types.IntParamType):
        return "count"
    if isinstance(option.type, click.types.FloatParamType):
        return "number"
    if isinstance(option.type, click.Path) or option.name.endswith(("_key", "_file")) or option.name == "permissions":
        return "file"
    return None


def bad_values(option: click.Option) -> list[str]:
    """The bad values of an option's kind; a duration whose plain number changed meaning refuses one."""
    values = {
        "duration": ["1parsec", "-1s"],
        "size": ["12Q", "-1"],
        "endpoint": ["tcp://127.0.0.1", "nonsense"],
        "choice": ["nonsense"],
        "count": ["-1", "many"],
        "number": ["-1", "fast"],
        "file": ["/nonexistent/pzq/file"],
    }.get(kind(option) or "", [])
    if isinstance(option.type, Duration) and option.type.was:
        values.append("1")  # (`--timeout 1`: was 1 ms, is refused with its unit named)
    return values


def arguments(command: click.Command) -> list[str]:
    """A harmless value for each argument (the bad value under test must be refused before any work)."""
    return ["x" for p in command.params if isinstance(p, click.Argument)]


def cases():
    for path, command in commands():
        for option in command.params:
            if isinstance(option, click.Option) and not option.is_flag:
                for value in bad_values(option):
                    yield pytest.param(path, option.opts[-1], value, id=f"{' '.join(path)} {option.opts[-1]}={value}")


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """Every endpoint a command finds by itself is a place where nothing listens (never a server of the
    machine's), and the working directory is a fresh one."""
    monkeypatch.chdir(tmp_path)
    _, (_, port) = free_tcp_endpoint()
    env = {name: None for name in ("PZQ_CONFIG", "PZQ_CURVE_CLIENT_KEY", "PZQ_CURVE_SERVER_KEY")}
    for name in ("receive_dsn", "send_dsn", "consume_dsn", "monitor_dsn"):
        env[f"PZQ_{name.upper()}"] = f"ipc://{tmp_path}/no-{name}"
    env["PZQ_MQKS_DSN"] = f"tcp://127.0.0.1:{port}"
    _, (_, http) = free_tcp_endpoint()
    env["PZQ_HTTP_DSN"] = f"http://127.0.0.1:{http}"  # (so that `pzq console` reads every other option)
    env["PZQ_DATABASE"] = str(tmp_path / "db")
    return env


def one_line_and_a_named_code(result, where: str) -> str:
    assert not result.exception or isinstance(result.exception, SystemExit), (where, result.exception)
    assert result.exit_code in set(ExitCode) - {ExitCode.OK, ExitCode.FAILURE}, (where, result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pzq: error: "), (where, result.stderr)
    return lines[0]


def test_every_command_is_walked_including_each_group_s_subcommands():
    walked = {" ".join(path) for path, _ in commands()}
    assert {"produce", "consume", "monitor", "queue show", "dead-letters list", "mqks publish", "serve"} <= walked


@pytest.mark.timeout(30)  # (a value taken by mistake would start the command's work: serve, console, bench)
@pytest.mark.parametrize(("path", "option", "value"), list(cases()))
def test_a_bad_value_of_any_option_is_one_line_and_a_named_exit_code(nowhere, path, option, value):
    command = dict(commands())[path]
    args = [*path, option, value, *arguments(command)]
    if option in ("--curve-client-key", "--curve-server-key"):  # (the pair is given together)
        args += ["--curve-server-key" if option == "--curve-client-key" else "--curve-client-key", value]
    result = CliRunner().invoke(cli, args, env=nowhere)
    one_line_and_a_named_code(result, " ".join(args))


def test_a_missing_config_file_is_one_line_for_every_command_that_reads_one(nowhere):
    for path, command in commands():
        if any(p.name == "config_file" for p in command.params):
            args = [*path, "--config", "/nonexistent/pzq.toml", *arguments(command)]
            line = one_line_and_a_named_code(CliRunner().invoke(cli, args, env=nowhere), " ".join(args))
            assert "/nonexistent/pzq.toml" in line


def test_a_missing_argument_or_an_unknown_option_is_one_line_naming_the_command_s_help(nowhere):
    for path, command in commands():
        if any(isinstance(p, click.Argument) and p.required for p in command.params):
            line = one_line_and_a_named_code(CliRunner().invoke(cli, list(path), env=nowhere), " ".join(path))
            assert f" {' '.join(path)} --help)" in line
        line = one_line_and_a_named_code(CliRunner().invoke(cli, [*path, "--no-such-option"], env=nowhere), str(path))
        assert "--no-such-option" in line


def test_a_bad_queue_name_is_one_line_for_every_command_that_names_a_queue(nowhere):
    from pzq.cli.common import QueueName

    naming = [(path, c) for path, c in commands() if any(isinstance(p.type, QueueName) for p in c.params)]
    assert {"queue show", "dead-letters list", "mqks consume"} <= {" ".join(path) for path, _ in naming}
    for path, command in naming:
        for bad in ("", "two words", "line\nbreak", "x" * 1025):
            args = [*path, *(bad if isinstance(p.type, QueueName) else "x" for p in command.params if p.required)]
            if not any(isinstance(p.type, QueueName) and p.required for p in command.params):
                args.append(bad)  # (an optional QUEUE: dead-letters list)
            result = CliRunner().invoke(cli, args, env=nowhere)
            line = one_line_and_a_named_code(result, repr(args))
            assert result.exit_code == ExitCode.USAGE and "is not a queue name" in line, line


def test_keygen_refuses_a_name_that_is_not_a_file_name_and_a_directory_it_cannot_make(nowhere, tmp_path):
    for args in (["keys", ""], ["keys", "../outside"], ["keys", ".hidden"], ["/proc/no/such", "alice"]):
        result = CliRunner().invoke(cli, ["keygen", *args], env=nowhere)
        line = one_line_and_a_named_code(result, repr(args))
        assert result.exit_code == ExitCode.CONFIG and "keygen:" in line
    assert not list(tmp_path.glob("outside*")) and not list(tmp_path.glob("keys/*")), "nothing was written"


def test_consume_refuses_a_negative_count_instead_of_printing_nothing(nowhere):
    result = CliRunner().invoke(cli, ["consume", "--count=-1"], env=nowhere)
    assert result.exit_code == ExitCode.USAGE and "-1 is not in the range" in result.stderr


def test_an_endpoint_without_a_port_is_one_line_naming_it(nowhere):
    result = CliRunner().invoke(cli, ["produce", "--receive-dsn", "tcp://127.0.0.1", "hello"], env=nowhere)
    line = one_line_and_a_named_code(result, "produce")
    assert result.exit_code == ExitCode.CONFIG and "'tcp://127.0.0.1'" in line and "tcp://HOST:PORT" in line


def run_pzq(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([PZQ, *args], capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


@pytest.mark.parametrize(
    "args",
    [
        ["produce", "--receive-dsn", "{tcp}", "--timeout", "30s", "hello"],
        ["consume", "--send-dsn", "{tcp}", "--consume-dsn", "", "--timeout", "30s"],
        ["consume", "--send-dsn", "{tcp}", "--timeout", "30s"],  # (the batched endpoint beside it: no wait)
        ["monitor", "--monitor-dsn", "{tcp}", "--timeout", "30s"],
        ["queue", "show", "default", "--monitor-dsn", "{tcp}", "--timeout", "30s"],
        ["clients", "--monitor-dsn", "{tcp}", "--timeout", "30s"],
        ["dead-letters", "list", "--monitor-dsn", "{tcp}"],
        ["mqks", "publish", "--mqks-dsn", "{tcp}", "event", "data"],
    ],
    ids=lambda args: " ".join(a for a in args if not a.startswith(("-", "{"))),
)
def test_nothing_listening_is_said_within_a_second_not_after_the_timeout(tmp_path, args):
    tcp, _ = free_tcp_endpoint()
    _, start = run_pzq("--version")  # (what the process takes to start here and now: a busy machine's)
    done, took = run_pzq(*(tcp if a == "{tcp}" else a for a in args))
    assert done.returncode == ExitCode.NOT_LISTENING, done.stderr
    assert done.stderr.startswith(f"pzq: error: nothing listens at {tcp}") and done.stderr.count("\n") == 1
    assert took - start < 2, f"{took:.1f} s ({start:.1f} s to start): the wait for a connection is 1 s, not --timeout"


def test_nothing_listening_at_an_ipc_path_without_its_socket_file_is_said_at_once(tmp_path):
    _, start = run_pzq("--version")
    done, took = run_pzq("monitor", "--monitor-dsn", f"ipc://{tmp_path}/monitor", "--timeout", "30s")
    assert done.returncode == ExitCode.NOT_LISTENING and "there is no socket file" in done.stderr, done.stderr
    assert took - start < 0.9, f"{took:.1f} s ({start:.1f} s to start): no wait for a connection at all"


@pytest.fixture
def curve_server(make_server, tmp_path):
    """A server whose every endpoint wants a CURVE key; Alice's is let in."""
    runner = CliRunner()
    for name in ("server", "alice", "other"):
        assert runner.invoke(cli, ["keygen", str(tmp_path / name), name]).exit_code == 0
    (tmp_path / "clients").mkdir()
    shutil.copy(tmp_path / "alice" / "alice.key", tmp_path / "clients")
    receive, _ = free_tcp_endpoint()
    return make_server(
        receive_dsn=receive,
        curve_secret_key=str(tmp_path / "server" / "server.key_secret"),
        curve_clients=str(tmp_path / "clients"),
    )


def test_a_client_without_a_key_is_told_the_server_wants_one(curve_server):
    for args in (["produce", "--receive-dsn", curve_server.receive, "x"], ["monitor"], ["queue", "show", "default"]):
        if args[0] != "produce":
            args += ["--monitor-dsn", curve_server.monitor]
        result = CliRunner().invoke(cli, [*args, "--timeout", "30s"], env={"PZQ_CONFIG": None})
        line = one_line_and_a_named_code(result, " ".join(args))
        assert result.exit_code == ExitCode.CURVE_REFUSED and "wants a CURVE key" in line


def test_a_client_with_the_wrong_server_key_is_told_so_and_a_key_not_let_in_is_not_permitted(curve_server, tmp_path):
    wrong = ["--curve-client-key", str(tmp_path / "alice" / "alice.key_secret")]
    wrong += ["--curve-server-key", str(tmp_path / "other" / "other.key")]
    result = CliRunner().invoke(cli, ["produce", "--receive-dsn", curve_server.receive, *wrong, "x"])
    assert result.exit_code == ExitCode.CURVE_REFUSED and "--curve-server-key" in result.stderr, result.stderr
    stranger = ["--curve-client-key", str(tmp_path / "other" / "other.key_secret")]
    stranger += ["--curve-server-key", str(tmp_path / "server" / "server.key")]
    result = CliRunner().invoke(cli, ["produce", "--receive-dsn", curve_server.receive, *stranger, "x"])
    assert result.exit_code == ExitCode.NOT_PERMITTED and "refused this client's CURVE key" in result.stderr


def test_keys_given_to_a_server_without_curve_are_said_to_be_needless(make_server, tmp_path):
    receive, _ = free_tcp_endpoint()
    server = make_server(receive_dsn=receive)
    for name in ("server", "alice"):
        assert CliRunner().invoke(cli, ["keygen", str(tmp_path / name), name]).exit_code == 0
    keys = ["--curve-client-key", str(tmp_path / "alice" / "alice.key_secret")]
    keys += ["--curve-server-key", str(tmp_path / "server" / "server.key")]
    result = CliRunner().invoke(cli, ["produce", "--receive-dsn", server.receive, *keys, "x"])
    assert result.exit_code == ExitCode.CURVE_REFUSED and "does not use CURVE" in result.stderr, result.stderr


def test_a_peer_that_takes_the_connection_and_never_handshakes_is_said_after_a_second(tmp_path):
    import socket

    listener = socket.create_server(("127.0.0.1", 0))  # (accepts, and says nothing: no ZeroMQ greeting)
    try:
        endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        result = CliRunner().invoke(cli, ["produce", "--receive-dsn", endpoint, "--timeout", "30s", "x"])
        line = one_line_and_a_named_code(result, "produce")
        assert result.exit_code == ExitCode.CURVE_REFUSED and "no ZeroMQ handshake completed within 1 s" in line
        assert time.monotonic() - started < 10, "the 1 s wait for a handshake, not --timeout's 30 s"
    finally:
        listener.close()


def test_a_zeromq_peer_that_handshakes_and_never_answers_is_no_message_after_the_timeout():
    import zmq

    silent = zmq.Context.instance().socket(zmq.ROUTER)  # (takes every request, answers none)
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        endpoint = f"tcp://127.0.0.1:{port}"
        for args, said in (
            (["monitor", "--monitor-dsn", endpoint], "no answer from pzq at"),
            (["queue", "show", "default", "--monitor-dsn", endpoint], "though connected"),
            (["produce", "--receive-dsn", endpoint, "x"], "no ack from the server within 1.2s"),
        ):
            result = CliRunner().invoke(cli, [*args, "--timeout", "1200ms"])
            line = one_line_and_a_named_code(result, args[0])
            assert result.exit_code == ExitCode.NO_MESSAGE and said in line, line
    finally:
        silent.close()


def test_consume_with_send_dsn_alone_does_not_wait_for_a_batched_endpoint_nothing_listens_at(make_server):
    import socket

    send, (_, port) = free_tcp_endpoint()
    with socket.socket() as beside:  # (the port 'auto' puts the batched endpoint at: free, nothing there)
        beside.bind(("127.0.0.1", port + 2))
    srv = make_server(send_dsn=send, consume_dsn="")
    assert CliRunner().invoke(cli, ["produce", "--receive-dsn", srv.receive, "hello"]).exit_code == 0
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["consume", "--send-dsn", send, "--timeout", "30s"])
    assert result.exit_code == 0 and result.stdout == "hello\n", result.output
    assert time.monotonic() - started < 1.5, "the refused batched endpoint is left at once (it waited 2 s for HELLO)"


def test_an_empty_queue_is_no_message_with_its_own_code_after_the_timeout_not_before(server):
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["consume", "--send-dsn", server.send, "--timeout", "1500ms"])
    assert time.monotonic() - started >= 1.5, "the server is there: its silence is waited out"
    line = one_line_and_a_named_code(result, "consume")
    assert result.exit_code == ExitCode.NO_MESSAGE and "no message came within 1.5s (0 received)" in line


def test_a_group_given_no_command_prints_its_help_not_a_line_of_it():
    for path in ((), ("queue",), ("dead-letters",), ("mqks",)):
        result = CliRunner().invoke(cli, list(path))
        assert result.exit_code == ExitCode.USAGE and "Commands:\n" in result.output, path
