"""`pzq queue list|show|peek|create|delete|purge|publish`, `pzq clients` and `pzq dead-letters` against a
real server: what each prints, and a refusal as one line on standard error with a named exit code."""

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
        ("queue", "delete", "nope", "--yes"),
        ("queue", "delete", "nope"),
        ("dead-letters", "delete", "nope", "--all"),
        ("dead-letters", "requeue", "nope", "--all"),
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
    assert run(srv, "dead-letters", "delete", "default", "--all").stdout.strip() == "deleted 2"


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


# -- queue list, create, delete; publish --create -------------------------------------------------------


def test_queue_list_prints_one_aligned_row_per_queue_with_units_in_the_header(server):
    assert run(server, "queue", "create", "orders").exit_code == 0
    for body in ("a", "bb", "ccc"):
        assert run(server, "queue", "publish", "orders", body).exit_code == 0
    listed = run(server, "queue", "list")
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split("  ")[0].rstrip() == "name"
    for unit in ("depth (msg)", "in flight (msg)", "dead (msg)", "in (msg/s)", "out (msg/s)", "size (bytes)"):
        assert unit in header
    assert [row.split()[0] for row in rows] == ["default", "orders"]
    orders = rows[1].split()
    assert orders[1:4] == ["3", "0", "0"]
    assert len({len(line) for line in [header, *rows]}) == 1, "every row as wide as the header: aligned"


def test_queue_list_json_gives_numbers_as_numbers_and_the_rates_as_stats_has_them(server):
    assert run(server, "queue", "publish", "default", "x").exit_code == 0
    [row] = json.loads(run(server, "queue", "list", "--json").stdout)
    figures = server.stats()["queues"]["default"]
    assert row == {
        "name": "default",
        "depth": 1,
        "inflight": 0,
        "dead_letters": 0,
        "in_per_s": figures.get("in_per_s"),  # (null from a server that does not report rates)
        "out_per_s": figures.get("out_per_s"),
        "bytes": figures["bytes"],
    }
    assert isinstance(row["bytes"], int) and row["bytes"] > 0


def test_queue_list_shows_a_dash_for_a_rate_the_server_does_not_report():
    from pzq.cli.queues import _row, _table

    lines = _table([{"name": "q", **_row({"depth": 1234, "inflight": 0, "dead_letters": 0, "bytes": 5})}])
    assert lines[1].split() == ["q", "1,234", "0", "0", "-", "-", "5"]
    with_rates = _table([{"name": "q", **_row({"depth": 1, "in_per_s": 12.25, "out_per_s": 0.0, "bytes": 5})}])
    assert with_rates[1].split()[4:6] == ["12.2", "0.0"]


def test_queue_list_sorted_by_depth_and_limited_shows_the_deepest_and_says_how_many_are_left_out(server):
    for name, depth in (("a", 1), ("b", 3), ("c", 2)):
        assert run(server, "queue", "create", name).exit_code == 0
        for _ in range(depth):
            assert run(server, "queue", "publish", name, "x").exit_code == 0
    listed = run(server, "queue", "list", "--sort", "depth", "-n", "2")
    assert [row.split()[0] for row in listed.stdout.splitlines()[1:]] == ["b", "c"]
    assert listed.stderr.strip() == "2 of 4 queues shown (--limit 2)"


def test_queue_list_of_a_server_without_queues_says_there_are_none(server):
    assert run(server, "queue", "delete", "default", "--yes").exit_code == 0
    listed = run(server, "queue", "list")
    assert (listed.exit_code, listed.stdout) == (0, "no queues on this server\n")
    assert run(server, "queue", "list", "--json").stdout.strip() == "[]"


def test_queue_create_makes_an_explicit_queue_and_again_says_it_exists_with_exit_0(server):
    made = run(server, "queue", "create", "orders")
    assert (made.exit_code, made.stdout) == (0, "created queue 'orders'\n")
    assert server.stats()["queues"]["orders"]["depth"] == 0
    again = run(server, "queue", "create", "orders")
    assert (again.exit_code, again.stdout) == (0, "queue 'orders' exists already: nothing changed\n")
    assert server.server.store.queue("orders", create=False).implicit is False


def test_queue_create_refuses_a_name_the_store_refuses_in_one_line(server):
    for bad in ("q" * 256, "é" * 128, "", "two words"):
        line = one_error_line(run(server, "queue", "create", bad), ExitCode.USAGE)
        assert f"{bad!r} is not a queue name (1 to 255 bytes, no blanks or control characters)" in line
    assert sorted(server.stats()["queues"]) == ["default"]


def test_queue_delete_without_a_terminal_and_without_yes_refuses_with_exit_not_confirmed(server):
    assert run(server, "queue", "publish", "default", "kept").exit_code == 0
    line = one_error_line(run(server, "queue", "delete", "default"), ExitCode.NOT_CONFIRMED)
    assert line == (
        "pzq: error: not deleting queue 'default' with 1 message(s) and 0 dead letter(s): "
        "there is no terminal to ask on; give --yes"
    )
    assert server.stats()["queues"]["default"]["depth"] == 1


def test_queue_delete_with_yes_drops_messages_and_dead_letters_and_the_name_starts_empty(make_server, tmp_path):
    seed_dead(tmp_path / "db", "default", 1, ready=2)
    srv = make_server()
    deleted = run(srv, "queue", "delete", "default", "--yes")
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout == "deleted queue 'default' with 2 message(s) and 1 dead letter(s)\n"
    assert "default" not in srv.stats()["queues"]
    assert run(srv, "queue", "create", "default").stdout == "created queue 'default'\n"
    assert wait_until(lambda: srv.stats()["messages"] == 0 and srv.stats()["queues"]["default"]["dead_letters"] == 0)


def test_queue_delete_on_a_terminal_asks_and_a_no_keeps_the_queue(process_server):
    import os
    import pty
    import subprocess
    import sys

    srv = process_server()

    def delete(answer: bytes) -> tuple[int, str]:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "pzq", "queue", "delete", "default", "--monitor-dsn", srv.monitor],
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env={k: v for k, v in os.environ.items() if not k.startswith("PZQ_")},
        )
        os.close(follower)
        seen = b""
        while b"[y/N]" not in seen:  # (the prompt: a read on the pty blocks until it comes, or the child ends)
            seen += os.read(leader, 4096)
        os.write(leader, answer)
        code = proc.wait(timeout=30)
        try:
            while more := os.read(leader, 4096):
                seen += more
        except OSError:  # (EIO: the child closed the terminal)
            pass
        os.close(leader)
        return code, seen.decode()

    code, text = delete(b"n\n")
    assert code == ExitCode.NOT_CONFIRMED and "Delete queue 'default' with 0 message(s)" in text
    assert "not deleted: queue 'default'" in text and "default" in srv.stats()["queues"]
    code, text = delete(b"y\n")
    assert code == 0 and "deleted queue 'default'" in text
    assert "default" not in srv.stats()["queues"]


def test_queue_publish_to_a_missing_queue_says_how_and_with_create_makes_it(server):
    line = one_error_line(run(server, "queue", "publish", "fresh", "x"), ExitCode.NOT_FOUND)
    assert line == "pzq: error: there is no queue 'fresh': publish with --create, or `pzq queue create fresh` first"
    published = run(server, "queue", "publish", "fresh", "hello", "--create")
    assert published.exit_code == 0, published.output
    assert server.stats()["queues"]["fresh"]["depth"] == 1
    assert server.server.store.queue("fresh", create=False).implicit is False
    assert run(server, "queue", "publish", "fresh", "again", "--create").exit_code == 0
    assert server.stats()["queues"]["fresh"]["depth"] == 2


# -- dead letters: one syntax, caps and nothing-to-do said ----------------------------------------------


def seed_dead(database, queue: str, count: int, ready: int = 0) -> None:
    """``count`` dead letters (and ``ready`` messages) in ``queue``, written before the server opens the
    store."""
    from pzq.store import Store

    store = Store(database, max_size=256 << 20)
    try:
        store.catalog.name_queue(queue)
        for i in range(count):
            dying = store.put(queue, [b"died %d" % i], now_us=1 + i)
            assert store.dead_letters.add(dying, "max-deliveries", now_us=2 + i)
        for i in range(ready):
            store.put(queue, [b"ready %d" % i], now_us=1 + i)
        store.commit()
    finally:
        store.close()


def test_requeue_all_past_its_cap_says_how_many_remain_and_how_to_go_on(make_server, tmp_path):
    seed_dead(tmp_path / "db", "default", 1_005)
    srv = make_server()
    first = run(srv, "dead-letters", "requeue", "default", "--all")
    assert (first.exit_code, first.stdout, first.stderr) == (
        0,
        "requeued 1000\n",
        "5 dead letter(s) remain (1,000 a run): run it again to go on\n",
    )
    second = run(srv, "dead-letters", "requeue", "default", "--all")
    assert (second.stdout, second.stderr) == ("requeued 5\n", "")
    none = run(srv, "dead-letters", "requeue", "default", "--all")
    assert one_error_line(none, ExitCode.NOT_FOUND) == "pzq: error: queue 'default' has no dead letters: none requeued"
    assert srv.stats()["queues"]["default"]["depth"] == 1_005


def test_requeuing_or_deleting_a_dead_letter_that_is_gone_says_so_and_exits_not_found(make_server, tmp_path):
    seed_dead(tmp_path / "db", "default", 2)
    srv = make_server()
    first, second = [json.loads(line)["id"] for line in run(srv, "dead-letters", "list", "default").stdout.splitlines()]
    assert run(srv, "dead-letters", "requeue", "default", first).stdout == "requeued 1\n"
    again = one_error_line(run(srv, "dead-letters", "requeue", "default", first), ExitCode.NOT_FOUND)
    assert again == (
        f"pzq: error: dead letter {first} is not in queue 'default' (requeued or deleted already?): none requeued"
    )
    assert run(srv, "dead-letters", "delete", "default", second).stdout == "deleted 1\n"
    gone = one_error_line(run(srv, "dead-letters", "delete", "default", second), ExitCode.NOT_FOUND)
    assert gone.endswith("(requeued or deleted already?): none deleted")


def test_an_empty_dead_letter_list_says_there_are_none(server):
    listed = run(server, "dead-letters", "list", "default")
    assert (listed.exit_code, listed.stdout, listed.stderr) == (0, "", "queue 'default' has no dead letters\n")


def test_the_old_spelling_all_still_deletes_with_a_line_saying_it_is_deprecated(make_server, tmp_path):
    seed_dead(tmp_path / "db", "default", 2)
    srv = make_server()
    old = run(srv, "dead-letters", "delete", "default", "all")
    assert (old.exit_code, old.stdout) == (0, "deleted 2\n")
    assert old.stderr == "pzq: note: `... QUEUE all` is deprecated: write `... QUEUE --all`\n"


def test_an_id_and_all_together_or_neither_is_a_usage_error(server):
    for args in (("requeue", "default"), ("delete", "default"), ("requeue", "default", "x", "--all")):
        line = one_error_line(run(server, "dead-letters", *args), ExitCode.USAGE)
        assert line == "pzq: error: give either an ID or --all"


# -- hostile: the monitor's CREATE and DELETE --------------------------------------------------------


def pipelined(endpoint: str, requests: list[bytes], window: int = 8) -> list[str]:
    """Send every request from one DEALER, ``window`` at a time without waiting (more than its pipe's 16
    and the monitor leaves them unanswered until it reads), and return the answers in order (each
    receive with a timeout)."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    answers: list[str] = []
    try:
        for at in range(0, len(requests), window):
            batch = requests[at : at + window]
            for request in batch:
                sock.send_multipart([b"", request])
            for _ in batch:
                assert sock.poll(30_000), "the monitor stopped answering"
                answers.append(sock.recv_multipart()[-1].decode())
    finally:
        sock.close()
    return answers


def test_a_create_or_delete_of_a_100_kb_name_is_one_error_line_and_the_server_goes_on(server):
    for word in (b"CREATE ", b"DELETE "):
        [answer] = pipelined(server.monitor, [word + b"q" * 100_000])
        assert answer.startswith("error: a request is one frame of at most 4096 bytes") and answer.count("\n") == 1
    [answer] = pipelined(server.monitor, [b"CREATE " + b"q" * 4000])
    assert answer.startswith("error: queue name must be 1 to 255 bytes")
    assert list(server.stats()["queues"]) == ["default"]


def test_thousands_of_creates_stop_at_max_queues_and_as_many_deletes_leave_the_server_as_it_was(make_server):
    srv = make_server(max_queues=1_000)
    names = [b"flood.%05d" % i for i in range(10_000)]
    answers = pipelined(srv.monitor, [b"CREATE " + name for name in names])
    made = [a for a in answers if a.startswith("{")]
    refused = [a for a in answers if a.startswith("error: queue full")]
    assert (len(made), len(refused)) == (999, 9_001), "the default queue is one of the 1,000"
    assert len(srv.stats()["queues"]) == 1_000
    assert answers[-1] == "error: queue full: there are 1000 queues, the most --max-queues allows\n"
    deleted = pipelined(srv.monitor, [b"DELETE " + name for name in names])
    assert sum(a.startswith('{"deleted"') for a in deleted) == 999
    assert sum(a == f"error: there is no queue {n.decode()!r}\n" for a, n in zip(deleted, names, strict=True)) == 9_001
    assert list(srv.stats()["queues"]) == ["default"]
    assert run(srv, "queue", "create", "after.the.flood").exit_code == 0


def test_routes_on_a_server_without_mqks_is_one_error_line_and_names_the_setting(server):
    assert pipelined(server.monitor, [b"ROUTES some.event", b"ROUTES"]) == [
        "error: no MQKS gateway runs on this server (--mqks-dsn)\n",
        "error: usage: ROUTES <event>\n",
    ]


def test_deleting_a_queue_bound_to_mqks_events_is_refused_and_it_stays_bound(make_server):
    from pzq.clients.mqks import MqksClient

    mqks, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=mqks)
    with MqksClient(mqks) as mq:
        mq.consume("bound", ["e"])
    line = one_error_line(run(srv, "queue", "delete", "bound", "--yes"))
    assert line == (
        "pzq: error: queue 'bound' is bound to MQKS events: delete it through MQKS (delete_queue), "
        "which unbinds it and tells its consumers"
    )
    assert "bound" in srv.stats()["queues"]
    assert pipelined(srv.monitor, [b"ROUTES e", b"ROUTES other"]) == [
        '{"event":"e","queues":["bound"],"total":1}',
        '{"event":"other","queues":[],"total":0}',
    ]


def test_a_real_monitor_reply_has_the_six_lines_then_the_wiki_spellings_with_the_same_values(server):
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"held"], [b"ready"]]))
    with client.Consumer(server.send) as consumer:
        assert consumer.receive(timeout_s=5) is not None
        assert wait_until(lambda: server.stats()["messages_inflight"] >= 1)
        lines = client.monitor_request(server.monitor, "MONITOR").splitlines()
    values = dict(line.split(": ", 1) for line in lines[:8])
    assert [line.split(": ")[0] for line in lines[:8]] == [
        *("messages", "messages_inflight", "db_size", "inflight_db_size", "syncs", "expired_messages"),
        *("messages_in_flight", "in_flightdb_size"),
    ]
    assert values["messages_in_flight"] == values["messages_inflight"] != "0"
    assert values["in_flightdb_size"] == values["inflight_db_size"] != "0"
