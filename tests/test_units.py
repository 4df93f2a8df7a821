"""One rule for a plain number of a duration, tried on every duration option of every command, every
setting's flag, variable and file key, and the Python clients: seconds, µs for the original PZQ's two,
refused in one line naming the unit where its meaning changed this release; units accepted everywhere."""

from __future__ import annotations

import time
import warnings

import click
import pytest
from cli_walk import commands
from click.testing import CliRunner

from pzq import config
from pzq.cli import cli
from pzq.cli.common import Duration
from pzq.clients import native as client
from pzq.clients.admin import admin_request
from pzq.errors import ClientError, ConfigError

# Every duration option: what a plain 7 is now (seconds), or None where it is refused (the unit it meant).
CLIENT_OPTIONS = {
    "console --poll-interval": 7.0,
    "monitor --watch": 7.0,
    "monitor --timeout": None,
    "produce --timeout": None,
    "consume --timeout": None,
    "mqks consume --timeout": 7.0,
    "dead-letters list --timeout": None,
    "dead-letters requeue --timeout": None,
    "dead-letters delete --timeout": None,
    "queue list --timeout": None,
    "queue create --timeout": None,
    "queue delete --timeout": None,
    "queue show --timeout": None,
    "queue peek --timeout": None,
    "queue purge --timeout": None,
    "queue publish --timeout": None,
    "queue where --timeout": None,
    "clients --timeout": None,
    "bench --paced-seconds": 7.0,
}
SETTINGS = {  # serve's: a plain number -> seconds (None: refused)
    "ack_timeout": ("7000000", 7.0),  # µs: the original PZQ's two
    "reaper_frequency": ("7000000", 7.0),
    "commit_interval": ("500", None),  # was µs
    "lease_timeout": ("7", 7.0),
    "api_dedup_window": ("7", 7.0),
    "implicit_queue_ttl": ("7", 7.0),
    "gc_whole_interval": ("7", 7.0),
    "emqp_heartbeat_interval": ("7", 7.0),
}
REFUSED = "give a unit (500us, 2ms, 1s): a plain number's meaning changes from {} to seconds in this release"


def duration_options():
    for path, command in commands():
        for option in command.params:
            if isinstance(option, click.Option) and isinstance(option.type, Duration):
                yield " ".join(path), command, option


def test_the_table_names_every_duration_option_and_setting_there_is():
    assert {f"{path} {option.opts[0]}" for path, _, option in duration_options()} == set(CLIENT_OPTIONS)
    assert set(config.DURATION_FIELDS) == set(SETTINGS)


@pytest.mark.parametrize("where", sorted(CLIENT_OPTIONS))
def test_a_client_commands_duration_takes_units_and_a_plain_number_is_seconds_or_refused_in_one_line(where):
    command = next(c for p, c, o in duration_options() if f"{p} {o.opts[0]}" == where)
    option = next(o for p, c, o in duration_options() if f"{p} {o.opts[0]}" == where)
    assert option.type.convert("250ms", option, None) == 0.25
    assert option.type.convert("2s", option, None) == 2.0
    assert option.type.convert("0", option, None) == 0.0  # (0 is 0 in any unit)
    if CLIENT_OPTIONS[where] is not None:
        assert option.type.convert("7", option, None) == CLIENT_OPTIONS[where]
        return
    # The command itself, with its arguments: one line, exit 2, before anything is sent anywhere
    arguments = ["x" for p in command.params if isinstance(p, click.Argument) and p.required]
    result = CliRunner().invoke(cli, [*where.split()[:-1], *arguments, option.opts[0], "7"])
    assert (result.exit_code, result.output.strip()) == (2, f"pzq: error: --timeout: {REFUSED.format('milliseconds')}")


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_setting_takes_units_from_flag_variable_and_file_and_a_plain_number_is_its_unit_or_refused(name, tmp_path):
    key, flag = "PZQ_" + name.upper(), "--" + name.replace("_", "-")
    file = tmp_path / "pzq.toml"
    file.write_text(f'{name} = "5s"\n')
    for given in ({"flags": {name: "5s"}}, {"env": {key: "5s"}}, {"file": file}):
        assert getattr(config.load(**given), name) == 5.0
    plain, expected = SETTINGS[name]
    file.write_text(f"{name} = {plain}\n")  # a TOML number, as a plain one
    if expected is not None:
        for given in ({"flags": {name: plain}}, {"env": {key: plain}}, {"file": file}):
            assert getattr(config.load(**given), name) == pytest.approx(expected)
        return
    refused = REFUSED.format("microseconds")
    for given, source in (
        ({"flags": {name: plain}}, f"{flag}:"),
        ({"env": {key: plain}}, f"environment {key}:"),
        ({"file": file}, f"config file {file}: {name}:"),
    ):
        with pytest.raises(ConfigError) as raised:
            config.load(**given)
        assert str(raised.value) == f"{source} {refused}"
    assert getattr(config.load(flags={name: "0"}), name) == 0.0


def test_serve_refuses_a_plain_commit_interval_in_one_line_naming_the_unit(tmp_path):
    result = CliRunner().invoke(cli, ["serve", "--database", str(tmp_path / "db"), "--commit-interval", "500"])
    assert (result.exit_code, result.output.strip()) == (
        2,
        f"pzq: error: --commit-interval: {REFUSED.format('microseconds')}",
    )


def test_every_duration_help_says_what_a_plain_number_is():
    for where, _, option in duration_options():
        help = " ".join((option.help or "").split())
        rule = "refused in this release, as its meaning changes from ms to seconds"
        assert (rule if CLIENT_OPTIONS[f"{where} {option.opts[0]}"] is None else "A plain number is seconds.") in help
    assert "A plain number is µs." in config.describe("ack_timeout")
    assert "from µs to seconds" in config.describe("commit_interval")
    assert "A plain number is seconds." in config.describe("lease_timeout")


def test_the_python_clients_wait_in_seconds_and_timeout_ms_is_a_deprecated_alias_still_in_ms(tmp_path):
    nobody = f"ipc://{tmp_path}/nobody"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the seconds argument warns of nothing
        with client.Consumer(nobody) as consumer:
            t0 = time.monotonic()
            assert consumer.receive(timeout_s=0.2) is None
            assert 0.15 < time.monotonic() - t0 < 2
        with pytest.raises(ClientError, match="within 200ms"):
            client.stats(nobody, timeout_s=0.2)
    with client.Consumer(nobody) as consumer:
        for call in (lambda: consumer.receive(200), lambda: consumer.receive(timeout_ms=200)):
            t0 = time.monotonic()
            with pytest.warns(DeprecationWarning, match="timeout_ms is deprecated: give timeout_s"):
                assert call() is None
            assert 0.15 < time.monotonic() - t0 < 2  # 200 ms, not 200 s
    with pytest.warns(DeprecationWarning), pytest.raises(ClientError, match="within 200ms"):
        client.monitor_request(nobody, timeout_ms=200)
    with pytest.warns(DeprecationWarning), pytest.raises(ClientError, match="within 200ms"):
        admin_request(nobody, "QUEUES", timeout_ms=200)
    with pytest.warns(DeprecationWarning), pytest.raises(ClientError, match="no PZQ-BATCH/1 answer"):
        client.BatchConsumer(nobody, hello_timeout_ms=200)
    with pytest.warns(DeprecationWarning):
        producer = client.Producer(nobody, timeout_ms=300)
    with producer:
        assert producer.timeout_s == 0.3
    with pytest.raises(TypeError, match="not both"), client.Consumer(nobody) as consumer:
        consumer.receive(timeout_s=1, timeout_ms=1000)
