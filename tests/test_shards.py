"""The shard list and placement (pzq/shards.py): pure, so every client and server places alike."""

from __future__ import annotations

import collections

import pytest

from pzq import shards
from pzq.errors import ConfigError


def _list(n: int) -> shards.ShardList:
    return shards.ShardList(tuple(shards.Shard(f"s{i}", api_dsn=f"tcp://127.0.0.1:{20000 + i}") for i in range(n)))


def test_a_queue_lives_on_one_shard_whoever_asks_and_in_whatever_order_the_list_is_written():
    forward, backward = _list(5), shards.ShardList(tuple(reversed(_list(5).shards)))
    for i in range(200):
        assert forward.home(f"q{i}").name == backward.home(f"q{i}").name


def test_queues_spread_over_the_shards_about_evenly():
    counts = collections.Counter(_list(4).home(f"queue-{i}").name for i in range(4000))
    assert set(counts) == {"s0", "s1", "s2", "s3"}
    assert min(counts.values()) > 800  # (1,000 each, give or take the hash's noise)


def test_a_shard_added_moves_only_the_queues_it_takes():
    before, after = _list(4), _list(5)
    moved = [f"q{i}" for i in range(2000) if before.home(f"q{i}").name != after.home(f"q{i}").name]
    assert all(after.home(name).name == "s4" for name in moved)
    assert 250 < len(moved) < 550  # about a fifth


def test_partitions_spread_evenly_and_the_first_is_where_the_queue_alone_would_be():
    cluster = _list(3)
    places = cluster.place("orders", 6)
    assert [name for name, _ in places] == [f"orders#{i}" for i in range(6)]
    assert collections.Counter(shard.name for _, shard in places) == {"s0": 2, "s1": 2, "s2": 2}
    assert places[0][1] == cluster.home("orders")
    assert cluster.place("orders") == [("orders", cluster.home("orders"))]


def test_a_partition_name_reads_back_and_other_names_are_not_partitions():
    assert shards.partition_of(shards.partition_name("a#b", 12)) == ("a#b", 12)
    assert shards.partition_of("orders") is None
    assert shards.partition_of("orders#01") is None
    assert shards.partition_of("#3") is None


def test_the_shard_list_file_is_read_and_its_mistakes_are_one_line(tmp_path):
    good = tmp_path / "shards.toml"
    good.write_text('[[shard]]\nname = "a"\napi_dsn = "tcp://127.0.0.1:1"\n[[shard]]\nname = "b"\n')
    cluster = shards.load(str(good))
    assert cluster.names() == ["a", "b"] and cluster.named("a").endpoints() == {"api_dsn": "tcp://127.0.0.1:1"}
    assert shards.ShardList.from_dict(cluster.to_dict()) == cluster
    for text, words in [
        ('[[shard]]\nname = "a"\n[[shard]]\nname = "a"\n', "twice"),
        ('[[shard]]\nname = "../x"\n', "letters"),
        ('[[shard]]\nname = "a"\nport = 3\n', "unknown keys"),
        ("shard = 3\n", "list of shards"),
        ("[[shard\n", "not TOML"),
        ("", "no shard"),
        ('[[shard]]\nname = "\udcff"\n', "not UTF-8"),  # (a byte 0xff; it had raised UnicodeDecodeError)
        ("x = " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),  # (it had raised RecursionError)
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(ConfigError, match=words):
            shards.load(str(bad))
    with pytest.raises(ConfigError, match="No such file"):
        shards.load(str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="not in the shard list"):
        cluster.named("c")
