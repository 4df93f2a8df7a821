"""`pzq queue show|peek|purge|publish`, `pzq clients` and `pzq dead-letters delete` against a real
server: what each prints, and a refusal as one line on standard error with a non-zero exit."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients import native as client
from pzq.errors import ExitCode

from conftest import free_tcp_endpoint, wait_until

pytestmark = pytest.mark.timeout(120)

NO_SETTINGS = {"PZQ_CONFIG": None, "PZQ_MONITOR_DSN": None, "PZQ_DATABASE": None}


def run(srv, *args: str, stdin: bytes | None = None):
    return CliRunner().invoke(cli, [*args, "--monitor-dsn", srv.monitor], env=NO_SETTINGS, input=stdin)


def one_error_line(result, code: int = ExitCode.FAILURE) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pzq: error: ")
    return lines[0]


def test_queue_publish_then_peek_then_show_then_purge(server):
    published = run(server, "queue", "publish", "default", "hello operator")
    assert published.exit_code == 0, published.stderr
    message_id = published.stdout.strip()
    assert run(server, "queue", "publish", "default", "-", stdin=b"from stdin").exit_code == 0
    peeked = run(server, "queue", "peek", "default", "-n", "1")
    assert peeked.exit_code == 0
    [row] = [json.loads(line) for line in peeked.stdout.splitlines()]
    assert (row["id"], row["head"], row["size"]) == (message_id, "hello operator", 14)
    assert peeked.stderr.strip().startswith("more: --after ")
    rest = run(server, "queue", "peek", "default", "--after", message_id)
    assert [json.loads(line)["head"] for line in rest.stdout.splitlines()] == ["from stdin"]
    shown = run(server, "queue", "show", "default")
    assert shown.exit_code == 0 and "depth 2" in shown.stdout and "consumers: 0" in shown.stdout
    assert json.loads(run(server, "queue", "show", "default", "--json").stdout)["figures"]["depth"] == 2
    purged = run(server, "queue", "purge", "default")
    assert purged.exit_code == 0 and purged.stdout.strip() == "purged 2"
    assert wait_until(lambda: server.stats()["queues"]["default"]["depth"] == 0)


def test_each_command_refuses_an_unknown_queue_with_one_line_and_exit_4(server):
    for args in (
        ("queue", "show", "nope"),
        ("queue", "peek", "nope"),
        ("queue", "peek", "nope", "--dead"),
        ("queue", "purge", "nope"),
        ("queue", "publish", "nope", "x"),
        ("dead-letters", "delete", "nope", "all"),
    ):
        line = one_error_line(run(server, *args), ExitCode.NOT_FOUND)
        assert line == "pzq: error: there is no queue 'nope'", args


def test_bad_ids_and_bodies_too_big_are_refused_with_one_line(server):
    client.Producer(server.receive).close()
    assert run(server, "queue", "publish", "default", "x").exit_code == 0
    assert "not a message id" in one_error_line(run(server, "queue", "peek", "default", "--after", "bogus"))
    assert "not a dead letter id" in one_error_line(run(server, "dead-letters", "delete", "default", "bogus"))
    too_big = run(server, "queue", "publish", "default", "-", stdin=b"x" * ((1 << 20) + 1))
    assert "over 1048576 bytes" in one_error_line(too_big)
    assert run(server, "queue", "peek", "default", "-n", "0").exit_code == 2  # (click's usage error)


def test_dead_letters_delete_one_then_all(make_server):
    srv = make_server(max_deliveries=1, ack_timeout=0.2)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"dead %d" % i] for i in range(3)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(3):
            assert consumer.receive(timeout_s=5) is not None
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == 3, timeout_s=15)
    peeked = run(srv, "queue", "peek", "default", "--dead")
    letters = [json.loads(line) for line in peeked.stdout.splitlines()]
    assert len(letters) == 3 and letters[0]["head"] == "dead 0" and letters[0]["reason"]
    assert run(srv, "dead-letters", "delete", "default", letters[0]["id"]).stdout.strip() == "deleted 1"
    assert run(srv, "dead-letters", "delete", "default", "all").stdout.strip() == "deleted 2"


def test_clients_lists_phpmq_connections_with_their_addresses_a_page_at_a_time(make_server):
    dsn, addr = free_tcp_endpoint()
    srv = make_server(phpmq_dsn=dsn)
    conns = [socket.create_connection(addr, timeout=5) for _ in range(3)]
    try:
        assert wait_until(lambda: srv.stats()["phpmq"]["connections"] == 3)
        listed = run(srv, "clients", "-n", "2", "--offset", "1")
        assert listed.exit_code == 0
        lines = listed.stdout.splitlines()
        assert lines[0] == "phpmq: Connections (2-3 of 3)" and lines[1].split("\t")[-2:] == ["address", "connected_us"]
        host, port = conns[0].getsockname()[:2]
        every = run(srv, "clients").stdout
        assert f"\t{host}:{port}\t" in every
        assert json.loads(run(srv, "clients", "--json").stdout)["figures"]["phpmq"]["connections"] == 3
    finally:
        for conn in conns:
            conn.close()


def test_no_answer_is_one_line_and_a_non_zero_exit(tmp_path):
    result = CliRunner().invoke(
        cli, ["queue", "show", "x", "--monitor-dsn", f"ipc://{tmp_path}/none", "--timeout", "200ms"], env=NO_SETTINGS
    )
    assert result.exit_code == ExitCode.NOT_LISTENING
    assert result.output.strip().splitlines() == [
        f"pzq: error: nothing listens at ipc://{tmp_path}/none: there is no socket file {tmp_path}/none "
        "(is pzq running there?)"
    ]


def test_with_curve_a_write_is_logged_with_the_name_of_the_key_that_asked(make_server, tmp_path, caplog):
    import logging
    import shutil

    for name in ("server", "alice"):
        assert CliRunner().invoke(cli, ["keygen", str(tmp_path / name), name]).exit_code == 0
    (tmp_path / "clients").mkdir()
    shutil.copy(tmp_path / "alice" / "alice.key", tmp_path / "clients")
    srv = make_server(
        curve_secret_key=str(tmp_path / "server" / "server.key_secret"), curve_clients=str(tmp_path / "clients")
    )
    keys = ["--curve-client-key", str(tmp_path / "alice" / "alice.key_secret")]
    keys += ["--curve-server-key", str(tmp_path / "server" / "server.key")]
    with caplog.at_level(logging.INFO, logger="pzq.admin"):
        published = run(srv, "queue", "publish", "default", "signed", *keys)
        assert published.exit_code == 0, published.stderr
    assert f"published {published.stdout.strip()} (6 bytes) to queue 'default' (by alice)" in caplog.text
    unsigned = run(srv, "queue", "publish", "default", "anyone", "--timeout", "300ms")
    assert "wants a CURVE key" in one_error_line(unsigned, ExitCode.CURVE_REFUSED)
