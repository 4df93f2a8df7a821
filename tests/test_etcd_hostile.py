"""Placement in etcd against hostile records (someone with write access to etcd) and a damaged cache
file: a real etcd and three real shards, as in tests/test_etcd_placement.py. Whatever is in etcd, the
registry goes on registering, placing and reading the records that are pzq's."""

from __future__ import annotations

import base64
import json
import shutil
import time
import urllib.request

import pytest
from etcd_cluster import EtcdCluster, EtcdShards, etcd_keys, etcd_put, needs_etcd, wait_for, where

pytestmark = [needs_etcd, pytest.mark.timeout(120)]

DEEP = b"[" * 50_000 + b"]" * 50_000  # (json.loads raises RecursionError on it, not ValueError)


def test_records_nested_past_json_depth_are_ignored_and_the_registry_goes_on(shards, etcd, prefix):
    for key in ("alive/zz", "shards/zz", "placements/deep"):
        etcd_put(etcd, prefix + key, DEEP)
    etcd_put(etcd, f"{prefix}placements/fine", json.dumps({"partitions": 0, "places": [["fine", "b"]]}).encode())
    wait_for(lambda: where(shards, "a", "fine")["placed"] == [["fine", "b"]])
    assert where(shards, "a", "deep")["placed"] is None
    wait_for(lambda: where(shards, "c", "new-one", place=True)["placed"] is not None)
    registry = shards.registry("a")
    assert registry["reachable"] and registry["alive"] == ["a", "b", "c"], registry
    assert "unexpected error" not in shards.servers["a"].log.read_text()


def etcd_put_raw(etcd: EtcdCluster, key: bytes, value: bytes) -> None:
    body = {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()}
    request = urllib.request.Request(f"{etcd.client['e0']}/v3/kv/put", data=json.dumps(body).encode())
    urllib.request.urlopen(request, timeout=5).close()


def test_a_page_of_placement_keys_that_are_not_utf8_is_read_past_not_read_again_forever(tmp_path, etcd, prefix):
    for i in range(300):  # (more than a page, there before the shards start: read in pages at once)
        etcd_put_raw(etcd, f"{prefix}placements/".encode() + b"\xff%03d" % i, b"{}")
    placed = json.dumps({"partitions": 0, "places": [["\U0010ffffz", "b"]]}).encode()
    etcd_put(etcd, f"{prefix}placements/\U0010ffffz", placed)
    shards = EtcdShards(tmp_path, etcd, "--etcd-prefix", prefix)
    try:
        wait_for(lambda: where(shards, "a", "\U0010ffffz")["placed"] == [["\U0010ffffz", "b"]])
        wait_for(lambda: where(shards, "c", "new-one", place=True)["placed"] is not None)
        time.sleep(2)
        registry = shards.registry("a")
        assert registry["reachable"] and registry["alive"] == ["a", "b", "c"], registry
        assert registry["calls_total"] < 200, registry
    finally:
        shards.close()


def test_where_place_needs_the_right_to_produce_to_the_queue(make_server, tenants, etcd, prefix):
    from pzq.clients.api import ApiClient, ApiError

    from conftest import free_tcp_endpoint

    endpoint, _ = free_tcp_endpoint()
    config = tenants.config()
    make_server(api_dsn=endpoint, unauthenticated="monitor", shard="a", etcd=etcd.urls, etcd_prefix=prefix, **config)
    stranger = ApiClient(endpoint, timeout_s=10, curve=tenants.curve("stranger"))
    orders = ApiClient(endpoint, timeout_s=10, curve=tenants.curve("orders"))
    try:
        with pytest.raises(ApiError) as caught:
            stranger.call("WHERE", queue="payroll", place=1)
        assert caught.value.code == "not-permitted", caught.value
        assert stranger.call("WHERE", queue="payroll")["placed"] is None, "WHERE alone needs no right"
        wait_for(lambda: orders.call("WHERE", queue="orders.a", place=1)["placed"] is not None)
        time.sleep(1)
        assert orders.call("WHERE", queue="payroll")["placed"] is None, "nothing placed for the stranger"
    finally:
        stranger.close()
        orders.close()


def test_placements_lost_by_an_etcd_restored_from_an_older_state_are_written_back_not_placed_again(
    tmp_path, monkeypatch
):
    from pzq.placement import choose
    from pzq.shards import Shard

    def home(queue: str, names: str) -> str:
        return choose(queue, 0, [Shard(n, api_dsn="tcp://127.0.0.1:1") for n in names]).places[0][1]

    queue = next(f"q{i}" for i in range(1000) if home(f"q{i}", "abc") == "c")  # (on c once c is alive)
    for part in ("etcd", "ab", "c"):
        (tmp_path / part).mkdir()
    etcd = EtcdCluster(tmp_path / "etcd", members=1)
    first = late = None
    try:
        first = EtcdShards(tmp_path / "ab", etcd, names=("a", "b"))
        placed = wait_for(lambda: where(first, "a", queue, place=True)["placed"])
        assert placed == [[queue, home(queue, "ab")]]
        etcd.stop_all()  # (etcd restored from a backup older than the placement: here, from nothing)
        shutil.rmtree(tmp_path / "etcd" / "e0")
        etcd.start_all()
        wait_for(lambda: first.registry("a")["reachable"] and first.registry("a")["alive"] == ["a", "b"], 20)
        wait_for(lambda: f"/pzq/placements/{queue}" in etcd_keys(etcd, "/pzq/"), 20)  # (written back)
        monkeypatch.setattr(EtcdShards, "wait_registered", lambda self: None)  # (c alone: a and b too)
        late = EtcdShards(tmp_path / "c", etcd, names=("c",))  # (a shard that never saw the placement)
        wait_for(lambda: first.registry("a")["alive"] == ["a", "b", "c"], 20)
        assert wait_for(lambda: where(late, "c", queue, place=True)["placed"]) == placed
    finally:
        for made in (late, first):
            if made is not None:
                made.close()
        etcd.close()


def test_big_records_under_shards_and_alive_are_read_once_not_at_every_poll(etcd, prefix, tmp_path):
    from pzq.etcd_registry import EtcdRegistry
    from pzq.shards import Shard

    junk = json.dumps({"name": "zz", "x": "A" * 1_400_000}).encode()  # (etcd's biggest values, about)
    for i in range(40):  # (75 MB of answer: more than a call's second to read at once)
        etcd_put(etcd, f"{prefix}{'alive' if i % 8 == 0 else 'shards'}/junk{i:02}", junk)
    me = Shard("a", api_dsn="tcp://127.0.0.1:1")
    registry = EtcdRegistry(etcd.urls, prefix, me, "store-a", str(tmp_path / "placements.json"), 100)
    received = [0]
    call = registry._call

    def counted(path: str, body: dict) -> dict:
        answer = call(path, body)
        received[0] += len(json.dumps(answer))
        return answer

    registry._call = counted  # type: ignore[method-assign]
    registry.start()
    try:
        wait_for(lambda: registry.view.alive == frozenset({"a"}) and registry.view.reachable, timeout=30)
        time.sleep(6)  # (the big records read once: a page of them a poll)
        received[0] = 0
        time.sleep(2)  # (four polls)
        assert received[0] < 200_000, f"{received[0]} bytes read from etcd in 2 s"
        assert registry.view.alive == frozenset({"a"}) and registry.view.shards.names() == ["a"]
    finally:
        registry.stop()


def test_a_member_record_claiming_another_shards_name_is_ignored(shards, etcd, prefix):
    real = {entry["name"]: entry for entry in where(shards, "a", "q")["shards"]}
    forged = {"name": "b", "api_dsn": "tcp://10.66.66.66:1", "store_id": "forged"}
    etcd_put(etcd, f"{prefix}shards/zz-forged", json.dumps(forged).encode())
    time.sleep(1.5)  # (three polls)
    answer = where(shards, "a", "q")
    assert {entry["name"]: entry for entry in answer["shards"]} == real
    assert answer["alive"] == ["a", "b", "c"]


def test_a_damaged_record_under_the_shards_own_name_is_a_named_conflict_not_an_error_every_round(
    etcd, prefix, tmp_path
):
    from pzq.etcd_registry import EtcdRegistry
    from pzq.shards import Shard

    etcd_put(etcd, f"{prefix}shards/a", b"garbage")
    me = Shard("a", api_dsn="tcp://127.0.0.1:1")
    registry = EtcdRegistry(etcd.urls, prefix, me, "store-a", str(tmp_path / "placements.json"), 100)
    registry.start()
    try:
        wait_for(lambda: registry.conflict)
        assert "is not pzq's" in registry.conflict and f"{prefix}shards/a" in registry.conflict
        time.sleep(1)
        assert registry.view.reachable, registry.view.error
    finally:
        registry.stop()


def test_a_member_that_answers_a_byte_at_a_time_costs_a_call_its_second_not_the_registry_for_ever(
    etcd, prefix, tmp_path
):
    import socket
    import threading

    from pzq.etcd_registry import EtcdRegistry
    from pzq.shards import Shard

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def trickle() -> None:  # (headers, then a byte every half second: each read is within requests' timeout)
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            conn.recv(65536)
            threading.Thread(target=_drip, args=(conn,), daemon=True).start()

    threading.Thread(target=trickle, daemon=True).start()
    slow = f"http://127.0.0.1:{listener.getsockname()[1]}"
    me = Shard("a", api_dsn="tcp://127.0.0.1:1")
    registry = EtcdRegistry(f"{slow},{etcd.urls}", prefix, me, "store-a", str(tmp_path / "placements.json"), 100)
    registry.start()
    try:
        wait_for(lambda: registry.view.alive == frozenset({"a"}))
    finally:
        started = time.monotonic()
        registry.stop()
        assert not registry.is_alive() and time.monotonic() - started < 2.5
        listener.close()
        for conn in held:
            conn.close()


def _drip(conn) -> None:
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while True:
            conn.sendall(b" ")
            time.sleep(0.5)
    except OSError:
        pass


def test_placement_records_too_big_to_read_64_within_a_second_are_read_fewer_a_call(etcd, prefix, tmp_path):
    from pzq.etcd_registry import EtcdRegistry
    from pzq.shards import Shard

    junk = json.dumps({"partitions": 0, "x": "A" * 1_400_000}).encode()  # (not pzq's: ignored once read)
    for i in range(24):  # (34 MB: a page of 64 is more than a call's second on a busy machine)
        etcd_put(etcd, f"{prefix}placements/junk{i:02}", junk)
    etcd_put(etcd, f"{prefix}placements/zz-fine", json.dumps({"partitions": 0, "places": [["zz-fine", "a"]]}).encode())
    registry = EtcdRegistry(etcd.urls, prefix, Shard("a"), "store-a", str(tmp_path / "placements.json"), 100)
    registry.start()
    try:
        wait_for(lambda: "zz-fine" in registry.placements and registry.view.reachable, timeout=60)
    finally:
        registry.stop()
    assert set(registry.placements) == {"zz-fine"}
