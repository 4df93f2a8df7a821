"""The `pzq` commands against a server with permissions, each with a tenant's CURVE key: a refusal is
one line on standard error and exit status 5 (``NOT_PERMITTED``), for the admin commands (the
monitor's ``error: not permitted``) and for `pzq produce` / `pzq consume`, whose refusal is a refused
CURVE handshake, heard at once through the socket monitor rather than after the timeout."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from test_permissions_monitor import SEEDED, seed

from pzq.cli import cli
from pzq.errors import ExitCode

from permission_keys import ORDERS_PRODUCE_ONLY, reload

pytestmark = pytest.mark.timeout(120)

NO_SETTINGS = {"PZQ_CONFIG": None, "PZQ_MONITOR_DSN": None, "PZQ_DATABASE": None}
WAIT = "30s"  # every command's timeout: a refusal must come long before it


@pytest.fixture
def cli_server(make_server, tenants, tmp_path):
    """A CURVE server whose native queue is ``orders.x``; ``orders.x`` and ``payroll`` are seeded."""
    seed(tmp_path / "db", ("orders.x", "payroll"))
    return make_server(queue="orders.x", **tenants.config())


def run(tenants, name: str, *args: str, stdin: str | None = None):
    """`pzq ARGS` with ``name``'s CURVE key; (result, seconds it took)."""
    started = time.monotonic()
    result = CliRunner().invoke(cli, [*args, *tenants.cli_curve(name)], env=NO_SETTINGS, input=stdin)
    return result, time.monotonic() - started


def refused_in_one_line(result, elapsed: float) -> str:
    assert result.exit_code == ExitCode.NOT_PERMITTED == 5, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pzq: error: not permitted: "), result.stderr
    assert elapsed < 10, f"the refusal took {elapsed:.1f} s: it waited for the timeout"
    return lines[0]


def depth_and_dead(srv, tenants, queue: str) -> tuple[int, int]:
    from pzq.clients import native as client

    q = client.stats(srv.monitor, curve=tenants.curve("stranger"))["queues"][queue]
    return q["depth"], q["dead_letters"]


def admin_commands(srv, queue: str) -> list[list[str]]:
    at = ["--monitor-dsn", srv.monitor, "--timeout", WAIT]
    return [
        ["queue", "peek", queue, *at],
        ["queue", "peek", "--dead", queue, *at],
        ["queue", "purge", queue, *at],
        ["queue", "publish", queue, "forged", *at],
        ["dead-letters", "delete", queue, "--all", *at],
        ["dead-letters", "list", queue, "--monitor-dsn", srv.monitor],
        ["dead-letters", "requeue", "--all", queue, "--monitor-dsn", srv.monitor],
    ]


def test_every_admin_command_refused_on_another_tenants_queue_says_so_in_one_line_and_exits_5(cli_server, tenants):
    srv = cli_server
    for args in admin_commands(srv, "payroll"):
        line = refused_in_one_line(*run(tenants, "orders", *args))
        assert "orders has no " in line and "right on queue 'payroll'" in line, line
    assert depth_and_dead(srv, tenants, "payroll") == (SEEDED, SEEDED), "nothing changed"


def test_every_admin_command_on_the_keys_own_queue_succeeds(cli_server, tenants):
    srv = cli_server
    for args in admin_commands(srv, "orders.x"):
        result, _ = run(tenants, "orders", *args)
        if args[:2] == ["dead-letters", "requeue"]:  # (permitted, and nothing to do: exit 4, not 5)
            assert (result.exit_code, result.stderr) == (
                ExitCode.NOT_FOUND,
                "pzq: error: queue 'orders.x' has no dead letters: none requeued\n",
            ), result.output
            continue
        assert result.exit_code == 0, (args, result.output)
    # (purged, one published, the dead letters deleted before the requeue found none)
    assert depth_and_dead(srv, tenants, "orders.x") == (1, 0)
    for args in (["monitor"], ["queue", "show", "payroll"], ["clients"]):  # the figures: any key's
        result, _ = run(tenants, "orders", *args, "--monitor-dsn", srv.monitor)
        assert result.exit_code == 0, (args, result.output)


def test_produce_with_a_key_that_may_not_produce_is_refused_at_the_handshake_in_one_line(cli_server, tenants):
    srv = cli_server
    args = ["produce", "--receive-dsn", srv.receive, "--timeout", WAIT, "a forged order"]
    line = refused_in_one_line(*run(tenants, "payroll", *args))
    assert f"pzq at {srv.receive} refused this client's CURVE key" in line
    assert depth_and_dead(srv, tenants, "orders.x") == (SEEDED, SEEDED)
    result, _ = run(tenants, "orders", *args)
    assert result.exit_code == 0 and "1 stored, 0 refused" in result.stderr
    assert depth_and_dead(srv, tenants, "orders.x") == (SEEDED + 1, SEEDED)


@pytest.mark.parametrize("endpoint", ["batched", "send"])
def test_consume_with_a_key_that_may_not_consume_is_refused_at_the_handshake_in_one_line(cli_server, tenants, endpoint):
    srv = cli_server
    where = ["--consume-dsn", srv.config.consume_dsn] if endpoint == "batched" else ["--consume-dsn", ""]
    args = ["consume", "--send-dsn", srv.send, *where, "--timeout", WAIT]
    refused_in_one_line(*run(tenants, "payroll", *args))
    assert depth_and_dead(srv, tenants, "orders.x") == (SEEDED, SEEDED), "nothing was taken"
    result, _ = run(tenants, "orders", *args)
    assert result.exit_code == 0 and result.stdout.startswith("orders.x dead 0"), result.output


def test_a_key_the_server_does_not_know_is_refused_in_one_line_by_every_command(cli_server, tenants, tmp_path):
    srv = cli_server
    CliRunner().invoke(cli, ["keygen", str(tmp_path / "outsider"), "outsider"])
    secret = str(tmp_path / "outsider" / "outsider.key_secret")
    _, server = tenants.curve("orders")
    for args in (
        ["monitor", "--monitor-dsn", srv.monitor, "--timeout", WAIT],
        ["queue", "show", "orders.x", "--monitor-dsn", srv.monitor, "--timeout", WAIT],
        ["produce", "--receive-dsn", srv.receive, "--timeout", WAIT, "x"],
    ):
        started = time.monotonic()
        result = CliRunner().invoke(
            cli, [*args, "--curve-client-key", secret, "--curve-server-key", server], env=NO_SETTINGS
        )
        refused_in_one_line(result, time.monotonic() - started)


def test_after_a_sighup_that_narrows_the_key_the_same_command_is_refused(cli_server, tenants):
    srv = cli_server
    peek = ["queue", "peek", "orders.x", "--monitor-dsn", srv.monitor, "--timeout", WAIT]
    assert run(tenants, "orders", *peek)[0].exit_code == 0
    tenants.write(ORDERS_PRODUCE_ONLY)
    reload(srv)
    line = refused_in_one_line(*run(tenants, "orders", *peek))
    assert "orders has no consume right on queue 'orders.x' (PEEK)" in line
    consume = ["consume", "--send-dsn", srv.send, "--consume-dsn", srv.config.consume_dsn, "--timeout", WAIT]
    refused_in_one_line(*run(tenants, "orders", *consume))
    produce = ["produce", "--receive-dsn", srv.receive, "--timeout", WAIT, "still allowed"]
    assert run(tenants, "orders", *produce)[0].exit_code == 0
