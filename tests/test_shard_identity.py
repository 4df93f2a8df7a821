"""A shard's name is kept in its store: real `pzq serve` subprocesses started, stopped and started again
on the same data directory as one shard or another, with and without a shard list (--cluster)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pzq import config
from pzq.clients import native as client
from pzq.errors import ConfigError, ExitCode, WrongShard
from pzq.store import Store

from conftest import ProcessServer


def shard_list(path: Path, *names: str) -> str:
    tables = (f'[[shard]]\nname = "{name}"\nmonitor_dsn = "ipc://{path.parent}/{name}"\n' for name in names)
    path.write_text("".join(tables))
    return str(path)


def refused(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """`pzq serve` with ``extra`` on tmp_path's store, expected to exit at once: its status and its lines."""
    argv = ProcessServer(tmp_path, *extra).argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def kept_shard(tmp_path: Path) -> str:
    store = Store(tmp_path / "db", readonly=True)
    try:
        return store.catalog.shard
    finally:
        store.close()


def test_a_store_first_started_as_shard_a_refuses_to_start_as_shard_b_in_one_line_with_exit_13(
    process_server, tmp_path
):
    server = process_server("--shard", "a")
    server.stop()
    assert kept_shard(tmp_path) == "a"
    done = refused(tmp_path, "--shard", "b")
    assert done.returncode == ExitCode.WRONG_SHARD == 13
    lines = [line for line in done.stderr.splitlines() if line.startswith("pzq: error:")]
    assert len(lines) == 1 and "'a'" in lines[0] and "'b'" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert kept_shard(tmp_path) == "a"  # (the refused start changed nothing)


def test_a_store_started_again_without_a_shard_name_serves_as_the_name_it_keeps(process_server, tmp_path):
    server = process_server("--shard", "a")
    server.stop()
    again = ProcessServer(tmp_path).start()  # (no --shard)
    try:
        assert again.stats()["shard"] == "a"  # (STATS and MONITOR say which shard they read)
        assert "\nshard: a\n" in client.monitor_request(again.monitor, timeout_s=10)
    finally:
        again.stop()
    assert "shard 'a'" in again.log.read_text()
    assert kept_shard(tmp_path) == "a"


def test_a_store_that_served_without_a_shard_name_takes_the_first_name_it_is_given_and_keeps_it(
    process_server, tmp_path
):
    process_server().stop()
    assert kept_shard(tmp_path) == ""
    ProcessServer(tmp_path, "--shard", "s1").start().stop()
    assert kept_shard(tmp_path) == "s1"
    assert refused(tmp_path, "--shard", "s2").returncode == ExitCode.WRONG_SHARD


def test_a_cluster_without_a_shard_name_given_or_kept_is_refused_and_leaves_no_store_behind(tmp_path):
    cluster = shard_list(tmp_path / "shards.toml", "a", "b")
    done = refused(tmp_path, "--cluster", cluster)
    assert done.returncode == ExitCode.CONFIG
    assert "no shard name" in done.stderr and "--shard" in done.stderr
    assert not (tmp_path / "db").exists()


def test_a_shard_name_not_in_the_cluster_list_is_refused_naming_the_list(tmp_path):
    cluster = shard_list(tmp_path / "shards.toml", "a", "b")
    done = refused(tmp_path, "--shard", "c", "--cluster", cluster)
    assert done.returncode == ExitCode.CONFIG
    assert "'c'" not in done.stderr or "not in the shard list" in done.stderr
    assert "a, b" in done.stderr
    assert not (tmp_path / "db").exists()


def test_a_cluster_without_shard_serves_as_the_kept_name_when_the_list_has_it_and_refuses_when_not(
    process_server, tmp_path
):
    process_server("--shard", "b").stop()
    cluster = shard_list(tmp_path / "shards.toml", "a", "b")
    ProcessServer(tmp_path, "--cluster", cluster).start().stop()
    other = shard_list(tmp_path / "other.toml", "a", "c")
    done = refused(tmp_path, "--cluster", other)
    assert done.returncode == ExitCode.CONFIG
    assert "'b'" in done.stderr and "a, c" in done.stderr


def test_the_shard_and_cluster_settings_come_from_flags_the_environment_and_the_file(tmp_path):
    cluster = shard_list(tmp_path / "shards.toml", "east", "west")
    file = tmp_path / "pzq.toml"
    file.write_text(f'shard = "east"\ncluster = "{cluster}"\n')
    assert (config.load(None, {}, file).shard, config.load(None, {}, file).cluster) == ("east", cluster)
    assert config.load(None, {"PZQ_SHARD": "west"}, file).shard == "west"
    assert config.load({"shard": "west"}, {}, None).shard == "west"


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"shard": "-a"}, "--shard"),
        ({"shard": "a b"}, "--shard"),
        ({"shard": "x" * 64}, "--shard"),
        ({"cluster": "/nonexistent/shards.toml"}, "--cluster"),
    ],
)
def test_a_bad_shard_name_or_an_unreadable_shard_list_is_refused_naming_its_option(flags, said):
    with pytest.raises(ConfigError, match=said):
        config.load(flags, {}, None)


def test_a_shard_list_that_is_not_toml_or_names_a_shard_twice_is_refused_naming_cluster(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[shard]\n")
    with pytest.raises(ConfigError, match="--cluster: shard list .*not TOML"):
        config.load({"cluster": str(bad)}, {}, None)
    bad.write_text('[[shard]]\nname = "a"\n[[shard]]\nname = "a"\n')
    with pytest.raises(ConfigError, match="twice"):
        config.load({"cluster": str(bad)}, {}, None)


def test_the_store_keeps_its_shard_name_through_a_rollback_and_refuses_another(tmp_path):
    store = Store(tmp_path / "db")
    try:
        assert store.catalog.claim_shard("") == ""
        store.catalog.claim_shard("a")
        store.abort()  # (the turn rolled back: the name was never kept)
        assert store.catalog.shard == ""
        store.catalog.claim_shard("a")
        store.commit()
        assert store.catalog.claim_shard("") == "a"
        with pytest.raises(WrongShard, match="'a'.*'b'"):
            store.catalog.claim_shard("b")
    finally:
        store.close()


def test_a_shard_whose_list_entry_names_endpoints_it_does_not_serve_says_so_at_start(process_server, tmp_path):
    listed = tmp_path / "shards.toml"
    listed.write_text(
        f'[[shard]]\nname = "a"\nmonitor_dsn = "ipc://{tmp_path}/monitor"\nreceive_dsn = "ipc://{tmp_path}/elsewhere"\n'
        'api_dsn = "tcp://10.1.2.3:11133"\n'
    )
    process_server("--shard", "a", "--cluster", str(listed)).stop()
    log = (tmp_path / "server.log").read_text()
    assert f"the list gives receive_dsn ipc://{tmp_path}/elsewhere, this server binds ipc://{tmp_path}/receive" in log
    assert "the list gives api_dsn tcp://10.1.2.3:11133, which this server does not serve" in log
    assert "monitor_dsn" not in log  # (the one the list and the server agree on)
