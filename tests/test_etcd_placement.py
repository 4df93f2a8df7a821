"""Placement in etcd with real parts: a real etcd (Debian's etcd-server) on loopback and three real
`pzq serve --shard NAME --etcd URL` processes. Each shard registers, a queue is placed once however
many shards are asked at once, clients learn placement from any shard's WHERE, and with etcd away the
known queues go on while a new one is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from etcd_cluster import etcd_keys, etcd_put, needs_etcd, wait_for, where

from pzq.clients.api import ApiError
from pzq.clients.cluster import Cluster
from pzq.clients.cluster_api import ClusterApi

from conftest import ProcessServer, steady_ports

pytestmark = [needs_etcd, pytest.mark.timeout(120)]


def test_every_shard_registers_and_every_shard_lists_all_three_with_their_endpoints(shards, etcd, prefix):
    answer = where(shards, "b", "anything")
    assert {entry["name"]: entry["api_dsn"] for entry in answer["shards"]} == shards.endpoints
    assert answer["alive"] == ["a", "b", "c"] and answer["reachable"] is True
    assert answer["placed"] is None  # (asked without place: nothing placed)
    keys = etcd_keys(etcd, prefix)
    assert {f"{prefix}shards/{n}" for n in "abc"} | {f"{prefix}alive/{n}" for n in "abc"} == set(keys)


def test_a_queue_asked_of_every_shard_at_once_is_placed_once_and_every_shard_agrees(shards, etcd, prefix):
    queues = [f"q{i}" for i in range(30)]

    def ask(name: str) -> None:
        for queue in queues:
            where(shards, name, queue, place=True)

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(ask, "abc"))
    for queue in queues:
        placed = [wait_for(lambda n=n, q=queue: where(shards, n, q)["placed"]) for n in "abc"]
        assert placed[0] == placed[1] == placed[2]
    records = {k: v for k, v in etcd_keys(etcd, prefix).items() if "/placements/" in k}
    assert sorted(records) == sorted(f"{prefix}placements/{q}" for q in queues)
    homes = {json.loads(v)["places"][0][1] for v in records.values()}
    assert homes == {"a", "b", "c"}  # (30 queues over three alive shards: each gets some)


def test_the_cluster_client_produces_a_new_queue_on_its_placed_shard_only(shards):
    cluster = Cluster.from_server(shards.endpoints["c"])
    with ClusterApi(cluster, timeout_s=10) as api:
        done = api.produce([("orders", b"m%d" % i) for i in range(20)])
    home = where(shards, "a", "orders")["placed"][0][1]
    assert done["shards"] == {home: 20}
    held = {n: where(shards, n, "orders")["held"] for n in "abc"}
    assert held[home] == [["orders", 20]] and all(held[n] == [] for n in "abc" if n != home)


def test_a_produce_to_a_queue_placed_on_another_shard_is_refused_naming_that_shard(shards):
    home = Cluster.from_server(shards.endpoints["a"]).locate("jobs", place=True).places()[0][1].name
    other = next(n for n in "abc" if n != home)
    with pytest.raises(ApiError) as refused:
        shards.clients[other].produce([("jobs", b"x")])
    assert refused.value.code == "wrong-shard" and repr(home) in str(refused.value)
    assert shards.clients[home].produce([("jobs", b"x")])["count"] == 1


def test_a_plain_api_client_producing_a_new_queue_waits_while_it_is_placed(shards):
    """PRODUCE of a queue nobody placed: the shard places it (the answer ``placing`` is asked again by
    ApiClient), then stores it if it is its own, or refuses it naming its shard."""
    outcomes = {}
    for name in "abc":
        try:
            outcomes[name] = shards.clients[name].produce([(f"fresh-{name}", b"x")])["count"]
        except ApiError as exc:
            outcomes[name] = exc.code
    for name, outcome in outcomes.items():
        home = where(shards, name, f"fresh-{name}")["placed"][0][1]
        assert outcome == (1 if home == name else "wrong-shard")


def test_create_with_partitions_places_them_once_and_each_shard_makes_its_own(shards):
    argv = [sys.executable, "-m", "pzq", "queue", "create", "events", "--partitions", "6"]
    done = subprocess.run(
        [*argv, "--monitor-dsn", shards.servers["a"].monitor], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    placed = where(shards, "a", "events")["placed"]
    assert [name for name, _ in placed] == [f"events#{i}" for i in range(6)]
    for name in "abc":
        answer = where(shards, name, "events")
        assert answer["partitions"] == 6
        assert sorted(q for q, _ in answer["held"]) == sorted(q for q, s in placed if s == name)
    again = subprocess.run(
        [sys.executable, "-m", "pzq", "queue", "create", "events", "--partitions", "4", "--monitor-dsn",
         shards.servers["b"].monitor],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode != 0 and "placed with 6 partitions" in again.stderr


def test_with_etcd_away_known_queues_go_on_a_new_one_is_refused_and_placements_are_seen_soon_after_it_returns(
    shards, etcd
):
    cluster = Cluster.from_server(shards.endpoints["a"], where_timeout_s=2)
    with ClusterApi(cluster, timeout_s=10) as api:
        api.produce([("known", b"before")])
        etcd.stop_all()
        try:
            wait_for(lambda: not shards.registry("a")["reachable"], timeout=15)
            for i in range(20):  # (a known queue: stored as before, no error)
                assert api.produce([("known", b"during %d" % i)])["count"] == 1
            home = cluster.locate("known").places()[0][1].name
            with pytest.raises(ApiError) as refused:
                shards.clients[home].produce([("brand-new", b"x")])
            assert refused.value.code == "unplaced" and "etcd" in str(refused.value)
        finally:
            etcd.start_all()
    assert where(shards, home, "known")["held"] == [["known", 21]]
    wait_for(lambda: all(shards.registry(n)["reachable"] for n in "abc"), timeout=15)
    where(shards, "a", "after-return", place=True)
    started = time.monotonic()
    wait_for(lambda: all(where(shards, n, "after-return")["placed"] for n in "abc"), timeout=5)
    assert time.monotonic() - started < 2.0


def test_a_shard_restarted_while_etcd_is_away_still_serves_the_queues_it_knew(shards, etcd):
    home = Cluster.from_server(shards.endpoints["a"]).locate("remembered", place=True).places()[0][1].name
    wait_for(lambda: all(where(shards, n, "remembered")["placed"] for n in "abc"))
    time.sleep(1.2)  # (the cache file is written at most once a second: let this one be)
    etcd.stop_all()
    try:
        for name in "abc":
            shards.servers[name].restart()
        answer = where(shards, home, "remembered")
        assert answer["placed"] == [["remembered", home]] and answer["reachable"] is False
        assert shards.clients[home].produce([("remembered", b"x")])["count"] == 1
    finally:
        etcd.start_all()


def test_a_shard_whose_lease_lapsed_is_shown_gone_but_keeps_its_queues(shards):
    placed = Cluster.from_server(shards.endpoints["a"]).locate("kept", place=True).places()
    home = placed[0][1].name
    other = next(n for n in "abc" if n != home)
    shards.servers[home].stop()  # (SIGTERM: its lease is revoked at once)
    try:
        answer = wait_for(lambda: (a := where(shards, other, "kept"))["alive"] != ["a", "b", "c"] and a)
        assert home not in answer["alive"]
        assert home in [entry["name"] for entry in answer["shards"]]  # (gone, not forgotten)
        assert answer["placed"] == [["kept", home]]  # (its queues wait on its disk)
    finally:
        shards.servers[home].start()
    wait_for(lambda: where(shards, other, "kept")["alive"] == ["a", "b", "c"], timeout=10)


def test_a_second_store_under_a_registered_name_neither_registers_nor_places(shards, etcd, prefix, tmp_path):
    (tmp_path / "twin").mkdir()
    twin = ProcessServer(
        tmp_path / "twin",
        "--shard",
        "a",
        "--etcd",
        etcd.urls,
        "--etcd-prefix",
        prefix,
        "--api-dsn",
        "tcp://127.0.0.1:0",
    )
    twin.start()
    try:
        registry = wait_for(lambda: (r := twin.stats()["registry"])["conflict"] and r)
        assert "registered in etcd by another store" in registry["conflict"]
        assert json.loads(etcd_keys(etcd, prefix)[f"{prefix}shards/a"])["api_dsn"] == shards.endpoints["a"]
    finally:
        twin.stop()


def test_a_damaged_placement_record_in_etcd_is_ignored_and_logged(shards, etcd, prefix):
    etcd_put(etcd, f"{prefix}placements/broken", b"\x00not json")
    etcd_put(etcd, f"{prefix}placements/fine", json.dumps({"partitions": 0, "places": [["fine", "b"]]}).encode())
    wait_for(lambda: where(shards, "a", "fine")["placed"] == [["fine", "b"]])
    assert where(shards, "a", "broken")["placed"] is None
    assert "placement of 'broken' is not pzq's" in shards.servers["a"].log.read_text()


def test_a_server_with_etcd_and_a_shard_list_or_without_a_name_is_refused_in_one_line(tmp_path, etcd):
    base = [sys.executable, "-m", "pzq", "serve", "--database", str(tmp_path / "db"), "--etcd", etcd.urls]
    listed = tmp_path / "shards.toml"
    listed.write_text('[[shard]]\nname = "a"\n')
    for extra, said in (
        (["--shard", "a", "--cluster", str(listed)], "--etcd and --cluster"),
        ([], "no shard name"),
        (["--shard", "a", "--etcd", "etcd.example:2379"], "give etcd's client URLs"),
        (["--shard", "a", "--etcd-ca", str(listed)], "give https:// etcd URLs"),
        (["--shard", "a", "--etcd-cert", str(listed)], "--etcd-cert and --etcd-key: give both"),
    ):
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_a_dead_first_member_costs_one_failed_call_and_the_next_member_answers(etcd, prefix, tmp_path):
    from pzq.etcd_registry import EtcdRegistry
    from pzq.shards import Shard

    dead = f"http://127.0.0.1:{steady_ports(1, 30_000, 31_000)[0]}"
    registry = EtcdRegistry(f"{dead},{etcd.urls}", prefix, Shard("solo"), "id-solo", str(tmp_path / "c.json"), 100)
    registry.start()
    try:
        wait_for(lambda: registry.view.alive == frozenset({"solo"}))
        registry.place("q", 0)
        wait_for(lambda: "q" in registry.placements)
        stats = registry.stats()
        assert stats["reachable"] and stats["call_failures_total"] == 1  # (then it stays on the live one)
    finally:
        registry.stop()
    assert f"{prefix}alive/solo" not in etcd_keys(etcd, prefix)  # (a clean stop revokes its lease)


def test_pzq_produce_and_consume_with_settings_naming_etcd_find_the_queue_through_their_shard(shards, tmp_path):
    settings = tmp_path / "pzq.toml"
    settings.write_text(f'api_dsn = "{shards.endpoints["a"]}"\netcd = "{shards.etcd.urls}"\nshard = "a"\n')
    base = [sys.executable, "-m", "pzq"]
    produced = subprocess.run(
        [*base, "produce", "--config", str(settings), "one", "two", "three"], capture_output=True, text=True, timeout=60
    )
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(
        [*base, "consume", "--config", str(settings), "-n", "3", "--timeout", "10s"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["one", "three", "two"]


def test_pzq_queue_where_says_what_etcd_placed_and_which_shards_are_gone(shards):
    Cluster.from_server(shards.endpoints["a"]).locate("shown", place=True)
    argv = [sys.executable, "-m", "pzq", "queue", "where", "shown", "--monitor-dsn", shards.servers["b"].monitor]
    shown = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "etcd reachable; gone (lease lapsed): none" in shown.stdout
    assert "placed (queue -> shard):\n  shown -> " in shown.stdout
    argv[5] = "never-placed"
    assert "not placed in etcd yet" in subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


def test_a_partition_name_asked_to_be_placed_is_not_placed_alone_and_its_produce_says_why(shards):
    where(shards, "a", "solo#5", place=True)
    where(shards, "a", "solo", place=True)
    wait_for(lambda: where(shards, "b", "solo")["placed"])
    assert where(shards, "a", "solo#5")["placed"] is None
    with pytest.raises(ApiError) as refused:
        shards.clients["a"].produce([("other#5", b"x")])
    assert refused.value.code == "unplaced" and "create it with its partitions" in str(refused.value)
