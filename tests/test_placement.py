"""Placement records (pzq/placement.py), pure: what etcd keeps of a queue's places, read back exactly,
and a record that is not pzq's refused before it could place anything."""

from __future__ import annotations

import json
import time

import pytest

from pzq import placement
from pzq.shards import Shard


def shards(*names: str) -> list[Shard]:
    return [Shard(name, api_dsn=f"tcp://127.0.0.1:{i + 1}") for i, name in enumerate(names)]


def test_a_placement_reads_back_as_it_was_written():
    chosen = placement.choose("orders", 4, shards("a", "b", "c"))
    assert placement.decode("orders", chosen.encode()) == chosen
    assert [name for name, _ in chosen.places] == ["orders#0", "orders#1", "orders#2", "orders#3"]


def test_a_queue_of_one_partition_is_the_queue_alone_on_one_shard():
    chosen = placement.choose("orders", 1, shards("a", "b", "c"))
    assert chosen.partitions == 0
    assert len(chosen.places) == 1 and chosen.places[0][0] == "orders"


def test_the_same_shards_in_any_order_give_the_same_placement():
    assert placement.choose("q", 6, shards("a", "b", "c")) == placement.choose("q", 6, shards("c", "a", "b"))


def test_partitions_spread_over_every_alive_shard():
    chosen = placement.choose("q", 6, shards("a", "b", "c"))
    assert sorted(shard for _, shard in chosen.places) == ["a", "a", "b", "b", "c", "c"]


def test_shard_of_names_the_shard_of_a_partition_and_none_for_a_stranger():
    chosen = placement.choose("q", 2, shards("a", "b"))
    assert {chosen.shard_of("q#0"), chosen.shard_of("q#1")} == {"a", "b"}
    assert chosen.shard_of("q#2") is None and chosen.shard_of("other") is None


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"partitions": 2}',
        b'{"partitions": 2, "places": [["q#0", "a"]]}',
        b'{"partitions": 0, "places": [["other", "a"]]}',
        b'{"partitions": 0, "places": [["q", "../etc"]]}',
        b'{"partitions": 5000, "places": []}',
        b'{"partitions": 0, "places": [["q", 7]]}',
        b"{" + b" " * placement.RECORD_MAX_BYTES + b"}",
    ],
)
def test_a_record_that_is_not_pzqs_is_refused(data):
    with pytest.raises(placement.BadRecord):
        placement.decode("q", data)


def test_a_member_record_reads_back_with_its_store_id():
    shard = Shard("a", api_dsn="tcp://10.0.0.1:11133", monitor_dsn="tcp://10.0.0.1:11134")
    assert placement.decode_member(placement.encode_member(shard, "id1")) == (shard, "id1")


@pytest.mark.parametrize("raw", [b"{}", b'{"name": "bad name"}', b'{"name": "a", "api_dsn": 5}', b"\xff"])
def test_a_member_record_that_is_not_pzqs_is_refused(raw):
    with pytest.raises(placement.BadRecord):
        placement.decode_member(raw)


def test_base_queue_strips_a_partition_suffix_only():
    assert placement.base_queue("q#3") == "q"
    assert placement.base_queue("q") == "q"
    assert placement.base_queue("q#03") == "q#03"
    assert json.loads(placement.choose("q", 0, shards("a")).encode()) == {"partitions": 0, "places": [["q", "a"]]}


DEEP = b"[" * 100_000 + b"]" * 100_000  # (json raises RecursionError, not ValueError, on it)


def test_a_record_nested_past_json_depth_is_a_bad_record_not_a_recursion_error():
    with pytest.raises(placement.BadRecord):
        placement.decode("orders", b'{"partitions": 0, "places": ' + DEEP + b"}")
    with pytest.raises(placement.BadRecord):
        placement.decode_member(DEEP)
    with pytest.raises(placement.BadRecord):
        placement.loads(DEEP)


def test_a_cache_file_nested_past_json_depth_is_unreadable_not_a_server_that_cannot_start(tmp_path):
    from pzq import placement_cache

    path = tmp_path / "placements.json"
    path.write_bytes(b'{"shards": [], "placements": {"q": ' + DEEP + b"}}")
    assert placement_cache.load(str(path), 1 << 30, "/pzq/") is None


def test_a_cache_written_under_another_etcd_prefix_is_not_read_as_this_clusters(tmp_path):
    from pzq.etcd_registry import EtcdRegistry

    me = Shard("a", api_dsn="tcp://127.0.0.1:1")
    cache = str(tmp_path / "placements.json")

    def registry(prefix: str) -> EtcdRegistry:
        return EtcdRegistry("http://127.0.0.1:9", prefix, me, "store-1", cache, 100)

    first = registry("/one/")
    first._adopt("orders", placement.choose("orders", 0, [me]).encode())
    first._members_read = {"a": (me, "store-1")}
    first._save_if_due(float("inf"))
    assert set(registry("/one").placements) == {"orders"}, "the same prefix (its trailing / or not) reads it"
    other = registry("/two/")
    assert other.placements == {} and other.view.shards is None


def test_an_unexpected_error_repeated_every_round_is_logged_once_not_every_round(tmp_path, caplog):
    from pzq.etcd_registry import EtcdRegistry

    registry = EtcdRegistry("http://127.0.0.1:9", "/p/", Shard("a"), "s", str(tmp_path / "c.json"), 10)

    def broken() -> None:
        raise RuntimeError("a bug")

    registry._register = broken  # type: ignore[method-assign]
    with caplog.at_level("WARNING", logger="pzq.etcd"):
        registry.start()
        time.sleep(1.0)
        registry.stop()
    logged = [r for r in caplog.records if "unexpected error" in r.getMessage()]
    assert len(logged) == 1, len(logged)
    assert registry.view.error.startswith("unexpected error")


def test_changed_records_are_read_a_page_a_call_however_many_changed():
    import base64

    from pzq import etcd_gateway as gw

    store = {f"/p/shards/s{i:02}".encode(): (10 + i, b"x" * 100) for i in range(40)}
    most = []

    def call(path: str, body: dict) -> dict:
        start = base64.b64decode(body["key"])
        rows = sorted((k, v) for k, v in store.items() if k >= start and v[0] >= body.get("min_mod_revision", 0))
        rows = rows[: body["limit"]]
        kvs = [{"key": gw.b64(k), "mod_revision": str(rev)} for k, (rev, _) in rows]
        if not body.get("keys_only"):
            most.append(len(rows))
            for kv, (_, (_, value)) in zip(kvs, rows, strict=True):
                kv["value"] = gw.b64(value)
        return {"kvs": kvs}

    held: dict = {}
    for _ in range(10):
        held = gw.read_changed(call, "/p/shards/", 1025, held)
    assert held == store
    assert max(most) <= 8, most  # (etcd_gateway.CHANGED_PAGE)


def test_placements_are_read_a_small_page_a_call_and_a_long_read_goes_on_at_the_next_round(tmp_path):
    import base64

    from pzq import etcd_gateway as gw
    from pzq import etcd_registry
    from pzq.etcd_registry import EtcdRegistry

    me = Shard("a", api_dsn="tcp://127.0.0.1:1")
    registry = EtcdRegistry("http://127.0.0.1:9", "/p/", me, "s", str(tmp_path / "c.json"), 10_000)
    store = {f"/p/placements/q{i:04}".encode(): placement.choose(f"q{i:04}", 0, [me]).encode() for i in range(600)}
    pages = []

    def call(path: str, body: dict) -> dict:
        time.sleep(0.01)  # (a slow etcd: 10 ms a call)
        start = base64.b64decode(body["key"])
        rows = sorted((k, v) for k, v in store.items() if k >= start)
        pages.append(min(len(rows), body["limit"]))
        kvs = [{"key": gw.b64(k), "value": gw.b64(v)} for k, v in rows[: body["limit"]]]
        return {"header": {"revision": "700"}, "kvs": kvs, "more": len(rows) > body["limit"]}

    registry._call = call  # type: ignore[method-assign]
    started = time.monotonic()
    registry._read_placements()
    assert time.monotonic() - started < 0.8, "one round reads for its budget, not until the end"
    while getattr(registry, "_reading", None) is not None:
        registry._read_placements()
    assert len(registry.placements) == 600 and max(pages) <= etcd_registry.PAGE, max(pages)
