"""A queue of partitions: `pzq queue create Q --partitions K` asks every shard of the list (real servers
on real sockets and stores), each keeping K and making the partitions the list places on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pzq import shards
from pzq.cli import cli
from pzq.clients.admin import AdminRefused, admin_request
from pzq.errors import ExitCode

from conftest import ProcessServer, ThreadServer, make_config

pytestmark = pytest.mark.timeout(120)
ENV = {"PZQ_CONFIG": None, "PZQ_CLUSTER": None, "PZQ_MONITOR_DSN": None}


def write_list(tmp_path: Path, names: tuple[str, ...]) -> str:
    path = tmp_path / "shards.toml"
    path.write_text("".join(f'[[shard]]\nname = "{n}"\nmonitor_dsn = "ipc://{tmp_path}/{n}/monitor"\n' for n in names))
    return str(path)


def start_shard(tmp_path: Path, name: str, listed: str) -> ThreadServer:
    (tmp_path / name).mkdir(exist_ok=True)
    return ThreadServer(make_config(tmp_path / name, shard=name, cluster=listed))


@pytest.fixture
def three(tmp_path):
    listed = write_list(tmp_path, ("a", "b", "c"))
    servers = {}
    try:
        for name in ("a", "b", "c"):
            servers[name] = start_shard(tmp_path, name, listed)
        yield listed, servers
    finally:
        for server in servers.values():
            server.stop()


def create(*args: str):
    return CliRunner().invoke(cli, ["queue", "create", *args], env=ENV)


def where(server, queue: str) -> dict:
    answer = admin_request(server.monitor, ["WHERE", queue], timeout_s=10)
    assert isinstance(answer, dict)
    return answer


def test_every_shard_keeps_the_count_and_holds_exactly_the_partitions_the_list_places_on_it(three):
    listed, servers = three
    done = create("orders", "--partitions", "6", "--cluster", listed)
    assert done.exit_code == 0, done.output
    places = shards.load(listed).place("orders", 6)
    held_everywhere = []
    for name, server in servers.items():
        answer = where(server, "orders")
        assert answer["partitions"] == 6
        assert answer["places"] == [[queue, shard.name] for queue, shard in places]
        mine = [queue for queue, shard in places if shard.name == name]
        assert answer["held"] == [[queue, 0] for queue in mine]
        held_everywhere += mine
        assert f"shard {name}: 'orders' has 6 partitions" in done.output
    assert sorted(held_everywhere) == sorted(f"orders#{i}" for i in range(6))


def test_creating_it_again_is_no_error_and_another_count_is_refused_changing_nothing(three):
    listed, servers = three
    assert create("orders", "--partitions", "4", "--cluster", listed).exit_code == 0
    again = create("orders", "--partitions", "4", "--cluster", listed)
    assert again.exit_code == 0 and again.output.count("(all there already)") == 3, again.output
    other = create("orders", "--partitions", "5", "--cluster", listed)
    assert other.exit_code == ExitCode.FAILURE
    assert "has 4 partitions, not 5" in other.stderr and "run the command again" in other.stderr
    assert all(where(server, "orders")["partitions"] == 4 for server in servers.values())
    assert all(len(where(server, "orders")["held"]) <= 4 for server in servers.values())


def test_a_shard_that_does_not_answer_makes_the_command_exit_1_naming_it_and_a_rerun_finishes(tmp_path):
    listed = write_list(tmp_path, ("a", "b"))
    a = start_shard(tmp_path, "a", listed)
    try:
        done = create("orders", "--partitions", "8", "--cluster", listed, "--timeout", "1s")
        assert done.exit_code == ExitCode.FAILURE
        assert "not done on b" in done.stderr and "shard a: 'orders' has 8 partitions" in done.output
        b = start_shard(tmp_path, "b", listed)
        try:
            rerun = create("orders", "--partitions", "8", "--cluster", listed)
            assert rerun.exit_code == 0, rerun.output
            held = where(a, "orders")["held"] + where(b, "orders")["held"]
            assert sorted(name for name, _ in held) == sorted(f"orders#{i}" for i in range(8))
        finally:
            b.stop()
    finally:
        a.stop()


def test_a_server_without_a_list_makes_every_partition_and_keeps_the_count_across_a_restart(tmp_path):
    server = ProcessServer(tmp_path).start()
    try:
        done = create("jobs", "--partitions", "3", "--monitor-dsn", server.monitor)
        assert done.exit_code == 0, done.output
        server.restart()
        answer = admin_request(server.monitor, ["WHERE", "jobs"], timeout_s=10)
        assert isinstance(answer, dict)
        assert answer["partitions"] == 3 and answer["held"] == [["jobs#0", 0], ["jobs#1", 0], ["jobs#2", 0]]
        refused = create("jobs", "--partitions", "2", "--monitor-dsn", server.monitor)
        assert refused.exit_code == ExitCode.FAILURE and "has 3 partitions, not 2" in refused.stderr
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["CREATE", "q", "0"], "partitions must be a whole number of 1 to 1024"),
        (["CREATE", "q", "1025"], "partitions must be a whole number of 1 to 1024"),
        (["CREATE", "q", "two"], "partitions must be a whole number"),
        (["CREATE", "q", "²"], "partitions must be a whole number"),
        (["CREATE", "q", "2", "3"], "usage: CREATE <queue> [partitions"),
        (["CREATE", "x" * 254, "12"], "too long for 12 partitions"),
    ],
)
def test_a_bad_count_of_partitions_is_refused_in_one_line_and_nothing_is_made(make_server, words, said):
    server = make_server()
    with pytest.raises(AdminRefused, match=said.replace("[", r"\[")):
        admin_request(server.monitor, words, timeout_s=10)
    answer = admin_request(server.monitor, ["WHERE", words[1]], timeout_s=10)
    assert isinstance(answer, dict) and answer["partitions"] == 0 and answer["held"] == []


def test_partitions_past_max_queues_are_refused_before_anything_is_kept(make_server):
    server = make_server(max_queues=5)  # (the configured queue is one of them)
    with pytest.raises(AdminRefused, match="queue full"):
        admin_request(server.monitor, ["CREATE", "q", "8"], timeout_s=10)
    answer = admin_request(server.monitor, ["WHERE", "q"], timeout_s=10)
    assert isinstance(answer, dict) and answer["partitions"] == 0 and answer["held"] == []


def test_queue_where_with_the_list_asks_every_shard_and_names_one_that_does_not_answer(three, tmp_path):
    listed, servers = three
    assert create("orders", "--partitions", "3", "--cluster", listed).exit_code == 0
    shown = CliRunner().invoke(cli, ["queue", "where", "orders", "--cluster", listed], env=ENV)
    assert shown.exit_code == 0, shown.output
    assert "queue orders: 3 partitions" in shown.output
    for queue, shard in shards.load(listed).place("orders", 3):
        assert f"{queue} -> {shard.name}" in shown.output
        assert re.search(rf"shard {shard.name}: .*{re.escape(queue)}: 0", shown.output)
    as_json = CliRunner().invoke(cli, ["queue", "where", "orders", "--cluster", listed, "--json"], env=ENV)
    answers = json.loads(as_json.output)
    assert sorted(answers) == ["a", "b", "c"] and all(answer["partitions"] == 3 for answer in answers.values())
    servers["b"].stop()
    partly = CliRunner().invoke(cli, ["queue", "where", "orders", "--cluster", listed], env=ENV)
    assert partly.exit_code == ExitCode.FAILURE
    assert "shard b: no answer" in partly.output and "no answer from b" in partly.stderr


def test_counts_kept_for_queues_of_partitions_placed_elsewhere_are_bounded_by_max_queues(tmp_path):
    listed = tmp_path / "shards.toml"  # (a list of 64 where this server is one: most queues of 2 have none here)
    listed.write_text("".join(f'[[shard]]\nname = "s{i}"\n' for i in range(64)))
    (tmp_path / "s0").mkdir()
    server = ThreadServer(make_config(tmp_path / "s0", shard="s0", cluster=str(listed), max_queues=10))
    try:
        refused = None
        for i in range(40):
            try:
                admin_request(server.monitor, ["CREATE", f"q{i}", "2"], timeout_s=10)
            except AdminRefused as exc:
                refused = (i, str(exc))
                break
        assert refused is not None and "queues of partitions kept, as many as --max-queues" in refused[1], refused
    finally:
        server.stop()


def test_a_list_entry_reaching_another_shard_is_asked_nothing_and_the_command_exits_1_naming_both(three, tmp_path):
    """The list's entry b gives c's monitor (a copy-paste slip): CREATE is not sent through it (before,
    c answered for b, the command said b made c's partitions and exited 0, b holding none)."""
    _, servers = three
    wrong = tmp_path / "wrong.toml"
    monitors = {"a": "a", "b": "c", "c": "c"}
    wrong.write_text(
        "".join(f'[[shard]]\nname = "{n}"\nmonitor_dsn = "ipc://{tmp_path}/{m}/monitor"\n' for n, m in monitors.items())
    )
    done = create("orders", "--partitions", "6", "--cluster", str(wrong))
    assert done.exit_code == ExitCode.FAILURE
    assert "shard b: the list's entry 'b' reaches" in done.stderr and "which is shard 'c'" in done.stderr
    assert "not done on b" in done.stderr
    assert where(servers["b"], "orders")["partitions"] == 0
    seen = CliRunner().invoke(cli, ["queue", "where", "orders", "--cluster", str(wrong), "--json"], env=ENV)
    assert seen.exit_code == ExitCode.FAILURE and "which is shard 'c'" in json.loads(seen.stdout)["b"]["error"]


def test_create_with_partitions_sent_to_one_shard_asks_every_shard_of_the_list_that_shard_reads(three):
    """No --cluster and no settings' list: the server of --monitor-dsn is a shard, and its list names the
    others (before, only it kept the count, the command said done and the others held none)."""
    _, servers = three
    done = create("orders", "--partitions", "6", "--monitor-dsn", servers["b"].monitor)
    assert done.exit_code == 0, done.output
    assert all(where(server, "orders")["partitions"] == 6 for server in servers.values())
    assert sum(len(where(server, "orders")["held"]) for server in servers.values()) == 6
