"""WHERE and the shard list under hostile and mistaken clients (issue 43's review): big answers asked and
never read, and lists whose entries point at a server that is not the shard they name. Real servers in
threads of the test, real sockets."""

from __future__ import annotations

import threading
from pathlib import Path

import msgpack
import pytest
import zmq

from pzq import shards
from pzq.clients import native as client
from pzq.clients.admin import admin_request
from pzq.clients.api import ApiClient
from pzq.clients.cluster import Cluster
from pzq.config import Limits
from pzq.errors import ConfigError
from pzq.protocols import api as api_proto
from pzq.server.where import Where
from pzq.store import Store
from pzq.store.catalog import MOST_PARTITIONS

from conftest import free_tcp_endpoint, wait_until

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


def long_list(tmp_path: Path, count: int = 1024) -> str:
    """A list of ``count`` shards (the most a list may name), s0 first; the others never reached."""
    path = tmp_path / "shards.toml"
    with open(path, "w") as out:
        for i in range(count):
            host = f"10.{i // 250}.{i % 250}.1"
            out.write(f'[[shard]]\nname = "s{i}"\nreceive_dsn = "tcp://{host}:11131"\napi_dsn = "tcp://{host}:11133"\n')
            out.write(f'send_dsn = "tcp://{host}:11132"\nconsume_dsn = "tcp://{host}:11134"\n\n')
    return str(path)


def test_api_wheres_of_a_long_list_asked_and_never_read_are_refused_busy_before_they_raise_the_memory_alarm(
    make_server, tmp_path
):
    """Each answer of a 1,024-shard list is ~113 KB: 40 clients asking 16 each and reading none held them
    all in their pipes, past an 8 MiB high-water mark, and the alarm refused every producer."""
    api_dsn, _ = free_tcp_endpoint()
    srv = make_server(
        api_dsn=api_dsn,
        shard="s0",
        cluster=long_list(tmp_path),
        memory_high_water=8 * MiB,
        memory_low_water=6 * MiB,
    )
    ctx = zmq.Context()
    args = {"queue": "orders"}
    try:
        socks = []
        for i in range(40):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 1)
            sock.setsockopt(zmq.RCVBUF, 4096)
            sock.connect(api_dsn)
            for n in range(16):
                sock.send_multipart(api_proto.request(f"h{i}-{n}".encode(), "WHERE", args))
            socks.append(sock)
        memory = srv.server.alarm
        assert wait_until(lambda: memory.refused_replies_total > 0 or memory.raised_total > 0, timeout_s=30)
        assert memory.raised_total == 0
        with client.Producer(srv.receive, timeout_s=10) as producer:
            assert producer.produce([b"served"]).ok  # (before: "queue full: memory alarm")
        with ApiClient(api_dsn, timeout_s=10) as api:  # (an honest WHERE, once the flood goes)
            for sock in socks:
                sock.close(0)
            assert api.call("WHERE", queue="orders")["shard"] == "s0"
        assert memory.raised_total == 0
    finally:
        ctx.term()


def test_a_cluster_is_not_learned_from_a_server_that_is_no_shard_of_the_list_it_gives(tmp_path):
    """An impostor (a real ROUTER answering WHERE) says it is shard "x" and gives a list without x: its
    list is not believed (before: taken whole, every queue then placed by it)."""
    dsn = f"ipc://{tmp_path}/impostor"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(dsn)

    def answer() -> None:
        if router.poll(10_000):
            frames = router.recv_multipart()
            request = api_proto.parse_request(frames)
            assert isinstance(request, api_proto.Request)
            listed = [{"name": "a", "api_dsn": f"ipc://{tmp_path}/a"}]
            where = {"shard": "x", "shards": listed, "partitions": 0, "places": [], "held": []}
            router.send_multipart(api_proto.ok(request, where))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(ConfigError, match="is shard 'x', not in the list it gives"):
            Cluster.from_server(dsn)
    finally:
        thread.join(10)
        router.close(0)
        ctx.term()


def test_held_names_only_the_partitions_a_placement_can_give_however_many_q_hash_queues_clients_made(tmp_path):
    """Clients may make Q#0 to Q#9999 (queues of their own names): WHERE Q lists Q#0 to Q#1023 at most,
    so its work and its answer stay bounded (10,000 such names of 255 bytes: 8-31 ms, 2.6 MB, before)."""
    store = Store(tmp_path / "db")
    try:
        store.catalog.max_queues = 3_000
        for i in range(2_000):
            store.queue(shards.partition_name("q", i))
        store.commit()
        where = Where("", None, store.catalog)
        held = [name for name, _ in where("q")["held"]]
        assert held == [shards.partition_name("q", i) for i in range(shards.MAX_PARTITIONS)]
        assert where("q#1500")["held"] == [["q#1500", 0]]
    finally:
        store.close()


def test_wheres_asked_while_acknowledged_messages_are_deleted_make_no_commit_of_their_own(make_server, tmp_path):
    """Clients ask WHERE of every shard every few seconds a queue: each had made its shard commit what was
    gathering for --commit-interval (acks' deletions), an fsync per WHERE on a busy shard."""
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", commit_interval=30.0, limits=Limits(lease_work_per_turn=100))
    with ApiClient(srv.config.api_dsn, timeout_s=20) as api:
        api.produce([("acked", b"m%d" % i) for i in range(1000)])
        end = 0
        while end < 1000:
            end = api.lease("acked", "g", end, 1000 - end)[1]
        api.ack_upto("acked", "g", 1000)  # (its reply waits for the commit of the new base; deletions gather)
        syncs = srv.stats()["syncs"]
        for _ in range(20):
            assert api.call("WHERE", queue="acked")["held"][0][0] == "acked"
        assert srv.stats()["syncs"] == syncs


def test_a_brief_where_leaves_out_the_list_and_the_places_and_cluster_clients_ask_brief(make_server, tmp_path):
    """A locate asks every shard: with a list of 1,024 shards each answer was ~113 KB, the list and the
    places, which a client reading the list itself never uses (1,024 shards: 116 MB a queue located)."""
    api_dsn = f"ipc://{tmp_path}/api"
    srv = make_server(api_dsn=api_dsn, shard="s0", cluster=long_list(tmp_path))
    with ApiClient(api_dsn, timeout_s=10) as api:
        api.produce([("orders#3", b"x")])
        whole = api.call("WHERE", queue="orders")
        brief = api.call("WHERE", queue="orders", brief=1)
    assert brief == {"shard": "s0", "partitions": 0, "held": [["orders#3", 1]]}
    assert {key: whole[key] for key in brief} == brief and len(whole["shards"]) == 1024
    assert len(msgpack.packb(brief)) < 100 < 100_000 < len(msgpack.packb(whole))
    listed = shards.ShardList((shards.Shard("s0", api_dsn=api_dsn),))
    asked = Cluster(listed)._ask_where(["orders"])["orders"]["s0"]
    assert asked == brief
    assert srv.server.alarm.raised_total == 0


def test_a_list_of_1024_shards_is_located_the_shards_asked_a_few_hundred_at_a_time(make_server, tmp_path):
    """A socket a shard, all at once, had failed with "Too many open files" (libzmq's 1,023 sockets a
    context): the one shard that serves here, s700, is heard, the others (nothing listening) are named."""
    path = tmp_path / "shards.toml"
    api_dsn = f"ipc://{tmp_path}/api"
    entries = [f'[[shard]]\nname = "s{i}"\napi_dsn = "tcp://127.0.0.1:{1 + i}"\n' for i in range(1024)]
    entries[700] = f'[[shard]]\nname = "s700"\napi_dsn = "{api_dsn}"\n'
    path.write_text("".join(entries))
    srv = make_server(api_dsn=api_dsn, shard="s700", cluster=str(path))
    assert admin_request(srv.monitor, ["CREATE", "orders", "3"], timeout_s=10)
    where = Cluster.from_file(str(path), where_timeout_s=0.2).locate("orders")
    assert where.partitions == 3 and len(where.unreachable) == 1023 and "s700" not in where.unreachable


def test_a_kept_count_of_partitions_no_pzq_keeps_is_set_aside_at_open_and_where_is_answered(make_server, tmp_path):
    """A count past 1,024 (a damaged record, a newer pzq's) had made every WHERE of its queue fail in the
    loop ("unexpected error ... rolled back"), its client waiting for an answer that never came."""
    assert MOST_PARTITIONS == shards.MAX_PARTITIONS
    (tmp_path / "l.toml").write_text('[[shard]]\nname = "a"\n')
    store = Store(tmp_path / "db")
    store.catalog.keep_partitions("q", 5000)  # (the catalog keeps what the monitor's CREATE checked)
    store.catalog.keep_partitions("fine", 8)
    store.commit()
    store.close()
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", shard="a", cluster=str(tmp_path / "l.toml"))
    with ApiClient(srv.config.api_dsn, timeout_s=5) as api:
        assert api.call("WHERE", queue="q")["partitions"] == 0
        assert api.call("WHERE", queue="fine")["partitions"] == 8
