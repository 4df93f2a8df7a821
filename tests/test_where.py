"""WHERE a queue lives: real servers of a shard list (threads of the test, and a `pzq serve` subprocess for
the CLI) asked on their API and monitor sockets, and `pzq queue where`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pzq import shards
from pzq.clients.admin import AdminRefused, admin_request
from pzq.clients.api import ApiClient, ApiError
from pzq.server.where import PLACES_CACHED, Where
from pzq.store import Store

from conftest import ProcessServer, ThreadServer, free_tcp_endpoint, make_config

pytestmark = pytest.mark.timeout(120)


def write_list(tmp_path: Path, names: tuple[str, ...]) -> str:
    path = tmp_path / "shards.toml"
    path.write_text(
        "".join(
            f'[[shard]]\nname = "{name}"\napi_dsn = "ipc://{tmp_path}/{name}/api"\n'
            f'monitor_dsn = "ipc://{tmp_path}/{name}/monitor"\n'
            for name in names
        )
    )
    return str(path)


@pytest.fixture
def cluster(tmp_path):
    """Two shards, a and b, as servers in threads, each with its API and monitor on ipc."""
    listed = write_list(tmp_path, ("a", "b"))
    servers = {}
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            cfg = make_config(tmp_path / name, api_dsn=f"ipc://{tmp_path}/{name}/api", shard=name, cluster=listed)
            servers[name] = ThreadServer(cfg)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def where_api(server: ThreadServer, queue: str) -> dict:
    with ApiClient(server.config.api_dsn, timeout_s=10) as api:
        return api.call("WHERE", queue=queue)


def where_monitor(server: ThreadServer, queue: str) -> dict:
    answer = admin_request(server.monitor, ["WHERE", queue], timeout_s=10)
    assert isinstance(answer, dict)
    return answer


def test_every_shard_answers_where_a_queue_lives_alike_on_its_api_and_its_monitor(cluster, tmp_path):
    listed = shards.load(str(tmp_path / "shards.toml"))
    home = listed.home("orders").name
    for name, server in cluster.items():
        by_api, by_monitor = where_api(server, "orders"), where_monitor(server, "orders")
        assert by_api == by_monitor
        assert by_api["shard"] == name
        assert by_api["shards"] == listed.to_dict() and [s["name"] for s in by_api["shards"]] == ["a", "b"]
        assert by_api["partitions"] == 0
        assert by_api["places"] == [["orders", home]]
        assert by_api["held"] == []


def test_a_queue_made_on_a_shard_that_is_not_its_home_shows_in_that_shards_held_never_refused(cluster, tmp_path):
    listed = shards.load(str(tmp_path / "shards.toml"))
    home = listed.home("orders").name
    stranger = "b" if home == "a" else "a"
    with ApiClient(cluster[stranger].config.api_dsn, timeout_s=10) as api:
        assert api.produce([("orders", b"1"), ("orders", b"2")])["count"] == 2
    answer = where_api(cluster[stranger], "orders")
    assert answer["held"] == [["orders", 2]]
    assert answer["places"] == [["orders", home]]  # (the list's place stands; clients read both)
    assert where_api(cluster[home], "orders")["held"] == []


def test_held_lists_the_queue_and_its_partitions_this_server_holds_with_their_depths(make_server, tmp_path):
    server = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with ApiClient(server.config.api_dsn, timeout_s=10) as api:
        api.produce([("q", b"x"), ("q#0", b"y"), ("q#3", b"z"), ("q#3", b"w"), ("q#x", b"not a partition")])
        answer = api.call("WHERE", queue="q")
    held = [["q", 1], ["q#0", 1], ["q#3", 2]]
    assert answer == {"shard": "", "shards": [], "partitions": 0, "places": [], "held": held}


def test_where_with_a_bad_queue_name_is_refused_in_one_line_on_both_sockets(make_server, tmp_path):
    server = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with ApiClient(server.config.api_dsn, timeout_s=10) as api:
        for args in ({}, {"queue": ""}, {"queue": "x" * 256}, {"queue": 7}):
            with pytest.raises(ApiError) as refused:
                api.call("WHERE", **args)
            assert refused.value.code == "bad-arguments"
    for words in (["WHERE"], ["WHERE", "a", "b"], ["WHERE", "x" * 256]):
        with pytest.raises(AdminRefused, match="usage: WHERE <queue>"):
            admin_request(server.monitor, words, timeout_s=10)
    assert server.stats()["messages"] == 0  # (and it serves on)


def test_pzq_queue_where_prints_a_shards_answer_and_its_json(process_server, tmp_path):
    listed = write_list(tmp_path, ("a", "b"))
    server = ProcessServer(tmp_path, "--shard", "b", "--cluster", listed).start()
    try:
        base = [sys.executable, "-m", "pzq", "queue", "where", "orders", "--monitor-dsn", server.monitor]
        text = subprocess.run(base, capture_output=True, text=True, timeout=30)
        as_json = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=30)
    finally:
        server.stop()
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    home = shards.load(listed).home("orders").name
    assert "server: shard b of 2 (a, b)" in text.stdout
    assert f"orders -> {home}" in text.stdout
    assert "held here: none of its queues" in text.stdout
    answer = json.loads(as_json.stdout)
    assert answer["shard"] == "b" and answer["places"] == [["orders", home]]


def test_the_places_kept_for_the_next_where_stay_under_their_bound_and_every_answer_is_the_lists(tmp_path):
    listed = shards.ShardList(tuple(shards.Shard(f"s{i}") for i in range(64)))
    store = Store(tmp_path / "db")
    try:
        for i in range(40):
            store.catalog.keep_partitions(f"p{i}", 1024)  # (40 x 1,024 places: five times the bound)
        where = Where("s0", listed, store.catalog)
        for round_ in range(2):
            for i in range(40):
                places = where(f"p{i}")["places"]
                assert places == [[name, shard.name] for name, shard in listed.place(f"p{i}", 1024)], (round_, i)
                assert where._places_held <= PLACES_CACHED
        assert where("plain")["places"] == [["plain", listed.home("plain").name]]
    finally:
        store.close()


def test_where_needs_no_right_on_the_queue_but_creating_its_partitions_needs_the_manage_right(make_server, tenants):
    endpoint, _ = free_tcp_endpoint()
    monitor, _ = free_tcp_endpoint()
    make_server(api_dsn=endpoint, monitor_dsn=monitor, **tenants.config())
    with ApiClient(endpoint, timeout_s=10, curve=tenants.curve("stranger")) as api:
        assert api.call("WHERE", queue="payroll")["held"] == []  # (names and counts: anyone let in)
    assert admin_request(monitor, ["WHERE", "payroll"], timeout_s=10, curve=tenants.curve("stranger"))
    with pytest.raises(AdminRefused, match="not permitted: .*manage right on queue 'payroll' \\(CREATE\\)"):
        admin_request(monitor, ["CREATE", "payroll", "4"], timeout_s=10, curve=tenants.curve("orders"))
    made = admin_request(monitor, ["CREATE", "payroll", "4"], timeout_s=10, curve=tenants.curve("payroll"))
    assert isinstance(made, dict) and made["made"] == [f"payroll#{i}" for i in range(4)]


def test_held_follows_partitions_made_deleted_and_found_again_after_a_restart(tmp_path):
    server = ProcessServer(tmp_path, "--api-dsn", f"ipc://{tmp_path}/api").start()
    try:
        with ApiClient(f"ipc://{tmp_path}/api", timeout_s=10) as api:
            api.produce([("q#0", b"a"), ("q#12", b"b"), ("q#1500", b"c"), ("q#03", b"not one"), ("q#2", b"d")])
            # (q#1500 is no partition a placement gives, MAX_PARTITIONS: a queue of its own name)
            assert api.call("WHERE", queue="q")["held"] == [["q#0", 1], ["q#2", 1], ["q#12", 1]]
            assert api.call("WHERE", queue="q#1500")["held"] == [["q#1500", 1]]
        admin_request(server.monitor, ["DELETE", "q#12"], timeout_s=10)
        server.restart()
        with ApiClient(f"ipc://{tmp_path}/api", timeout_s=10) as api:
            assert api.call("WHERE", queue="q")["held"] == [["q#0", 1], ["q#2", 1]]
            assert api.call("WHERE", queue="q#0")["held"] == [["q#0", 1]]
    finally:
        server.stop()
