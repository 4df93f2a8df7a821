"""The clients of a cluster (pzq/clients/cluster.py, cluster_native.py): a queue located over real
shards (each a real server with its own store and sockets), the native producer spreading over them and
the consumer reading them all, acks going home, a shard that is down stalling only its own, the API's
PRODUCE routed by queue, and `pzq produce`/`pzq consume --cluster`."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients.admin import admin_request
from pzq.clients.api import ApiClient
from pzq.clients.cluster import Cluster
from pzq.clients.cluster_api import ClusterApi
from pzq.clients.cluster_consume import ShardedConsumer
from pzq.clients.cluster_native import LANE_BATCHES, RETRY_S, ShardedProducer
from pzq.clients.native import Producer
from pzq.config import DEFAULT_LIMITS
from pzq.errors import ClientError, ConfigError, ExitCode
from pzq.shards import load

from conftest import ProcessServer, ThreadServer, make_config, wait_until

pytestmark = pytest.mark.timeout(120)
NAMES = ("a", "b", "c")


def write_list(path: Path, endpoints: dict[str, dict[str, str]]) -> str:
    lines = []
    for name, dsns in endpoints.items():
        lines.append("[[shard]]")
        lines.append(f'name = "{name}"')
        lines += [f'{key} = "{value}"' for key, value in dsns.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def dsns(where: Path) -> dict[str, str]:
    return {
        "receive_dsn": f"ipc://{where}/receive",
        "send_dsn": f"ipc://{where}/send",
        "consume_dsn": f"ipc://{where}/consume",
        "api_dsn": f"ipc://{where}/api",
        "monitor_dsn": f"ipc://{where}/monitor",
    }


class Shards:
    """Real in-process servers, one a shard, each with its own store and ipc sockets, and their list."""

    def __init__(self, tmp_path: Path, names=NAMES):
        self.servers: dict[str, ThreadServer] = {}
        self.path = write_list(tmp_path / "shards.toml", {name: dsns(tmp_path / name) for name in names})
        self.list = load(self.path)
        for name in names:
            (tmp_path / name).mkdir()
            cfg = make_config(tmp_path / name, api_dsn=dsns(tmp_path / name)["api_dsn"], shard=name, cluster=self.path)
            self.servers[name] = ThreadServer(cfg)

    def depth(self, name: str, queue: str = "default") -> int:
        return self.servers[name].stats()["queues"].get(queue, {}).get("depth", 0)

    def depths(self, queue: str = "default") -> dict[str, int]:
        return {name: self.depth(name, queue) for name in self.servers}

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()


@pytest.fixture
def shards(tmp_path):
    made = Shards(tmp_path)
    yield made
    made.stop()


def bodies(n: int, prefix: str = "m") -> list[list[bytes]]:
    return [[f"{prefix}{i}".encode()] for i in range(n)]


def drain(consumer: ShardedConsumer, want: int, most: int = 100) -> list[tuple[bytes, str]]:
    """Receive (and ack) until ``want`` messages came: [(body, shard)]."""
    got: list[tuple[bytes, str]] = []
    while len(got) < want:
        batch = consumer.receive(most, timeout_s=5)
        assert batch, f"only {len(got)} of {want} came"
        got += [(body[0], consumer.shard_of(key) or "") for key, body in batch]
        assert consumer.ack([key for key, _ in batch]).count == len(batch)
    return got


def test_a_queue_of_one_partition_goes_whole_to_its_home_shard_and_comes_back_from_it(shards):
    cluster = Cluster.from_file(shards.path)
    home = shards.list.home("default").name
    where = cluster.locate("default")
    assert where.partitions == 0 and [s.name for _, s in where.produce_to] == [home] and not where.unreachable
    with ShardedProducer(cluster, "default", batch=10) as producer:
        results = producer.send_many(bodies(50))
    assert all(r.ok for r in results) and len(results) == 50
    assert shards.depths() == {name: 50 if name == home else 0 for name in NAMES}
    with ShardedConsumer(cluster, "default") as consumer:
        got = drain(consumer, 50)
    assert [body for body, _ in got] == [b"m%d" % i for i in range(50)], "one shard: its order kept"
    assert {shard for _, shard in got} == {home} and shards.depths() == dict.fromkeys(NAMES, 0)


def test_partitions_spread_the_batches_over_the_shards_in_turn_and_the_consumer_reads_them_all(shards):
    cluster = Cluster.from_file(shards.path)
    with ShardedProducer(cluster, "default", batch=10, partitions=3, stall_s=10) as producer:
        assert all(r.ok for r in producer.send_many(bodies(90)))
    assert shards.depths() == dict.fromkeys(NAMES, 30), "three partitions on three shards: a third each"
    with ShardedConsumer(cluster, "default", partitions=3) as consumer:
        got = drain(consumer, 90, most=10)
        assert consumer.receive(10, timeout_s=0.2) == []
    assert sorted(body for body, _ in got) == sorted(b[0] for b in bodies(90)), "each message once"
    assert {shard for _, shard in got} == set(NAMES)
    assert shards.depths() == dict.fromkeys(NAMES, 0)
    assert all(srv.stats()["queues"]["default"]["inflight"] == 0 for srv in shards.servers.values()), "acks went home"


def test_the_consumer_takes_the_shards_in_turn_not_one_until_it_is_empty(shards):
    cluster = Cluster.from_file(shards.path)
    with ShardedProducer(cluster, "default", batch=20, partitions=3, stall_s=10) as producer:
        assert all(r.ok for r in producer.send_many(bodies(60)))
    with ShardedConsumer(cluster, "default", partitions=3, prefetch=10) as consumer:
        first = consumer.receive(5, timeout_s=5)
        turns = [consumer.shard_of(first[0][0])]
        consumer.ack([key for key, _ in first])

        def handed() -> int:
            return sum(srv.stats()["queues"]["default"]["inflight"] for srv in shards.servers.values())

        wait_until(lambda: handed() == 40)  # (every shard's consumer has its 15 granted: all are ready)
        for _ in range(5):
            batch = consumer.receive(5, timeout_s=5)
            turns.append(consumer.shard_of(batch[0][0]))
            consumer.ack([key for key, _ in batch])
    assert set(turns[:3]) == set(NAMES) and turns[3:] == turns[:3], turns


def test_nacked_messages_go_back_to_the_shards_they_came_from(shards):
    cluster = Cluster.from_file(shards.path)
    with ShardedProducer(cluster, "default", batch=10, partitions=3, stall_s=10) as producer:
        assert all(r.ok for r in producer.send_many(bodies(30)))
    with ShardedConsumer(cluster, "default", partitions=3) as consumer:
        keys = []
        while len(keys) < 30:
            batch = consumer.receive(10, timeout_s=5)
            assert batch
            keys += [key for key, _ in batch]
        assert consumer.nack(keys).count == 30
        assert consumer.nack(keys).refused == keys, "settled already: refused, not sent anywhere"
    inflight = {name: srv.stats()["queues"]["default"]["inflight"] for name, srv in shards.servers.items()}
    assert shards.depths() == dict.fromkeys(NAMES, 10) and inflight == dict.fromkeys(NAMES, 0)


def test_messages_with_a_key_go_to_the_same_shard_every_time(shards):
    cluster = Cluster.from_file(shards.path)
    keys = [f"customer-{i % 7}" for i in range(70)]
    with ShardedProducer(cluster, "default", partitions=3) as producer:
        assert all(r.ok for r in producer.send_many(bodies(70), keys=keys))
    with ShardedConsumer(cluster, "default", partitions=3) as consumer:
        got = drain(consumer, 70)
    shard_of_key: dict[str, set[str]] = {}
    for body, shard in got:
        shard_of_key.setdefault(keys[int(body[1:])], set()).add(shard)
    assert all(len(where) == 1 for where in shard_of_key.values()), shard_of_key
    assert len({next(iter(where)) for where in shard_of_key.values()}) > 1, "seven keys over three shards"


def test_a_shard_that_is_down_fails_only_its_own_messages_and_takes_no_more_for_a_while(shards):
    cluster = Cluster.from_file(shards.path)
    shards.servers["b"].stop()
    with ShardedProducer(cluster, "default", batch=10, partitions=3, timeout_s=0.5) as producer:
        first = producer.send_many(bodies(30))
        failed = [r for r in first if not r.ok]
        assert len(failed) == 10 and all(r.error.startswith("shard b: ") for r in failed), failed[:1]
        again = producer.send_many(bodies(30, "n"))
    assert all(r.ok for r in again), "the shard that failed is left out of the next turns"
    assert shards.depth("a") + shards.depth("c") == 50


def test_a_queue_s_home_that_is_down_fails_each_of_its_messages_once_naming_it(shards):
    home = shards.list.home("default").name
    shards.servers[home].stop()
    with ShardedProducer(Cluster.from_file(shards.path), "default", timeout_s=0.3) as producer:
        results = producer.send_many(bodies(250))
    assert len(results) == 250, "a result for each, the ones never sent too"
    assert {r.error for r in results} == {f"shard {home}: no ack from the server within 300ms (to the batch probe)"}


def test_a_shard_list_endpoint_no_client_can_connect_to_is_raised_not_counted_as_a_shard_down(shards, tmp_path):
    listed = {"a": dsns(Path(shards.path).parent / "a"), "z": {"receive_dsn": "tcp://127.0.0.1"}}
    path = write_list(tmp_path / "bad.toml", listed)
    with ShardedProducer(Cluster.from_file(path), "default", partitions=2, batch=5) as producer:
        with pytest.raises(ConfigError, match="tcp://HOST:PORT"):
            producer.send_many(bodies(20))


def test_a_shard_that_is_down_does_not_keep_the_consumer_from_the_others(shards):
    cluster = Cluster.from_file(shards.path)
    with ShardedProducer(cluster, "default", batch=10, partitions=3) as producer:
        assert all(r.ok for r in producer.send_many(bodies(30)))
    shards.servers["b"].stop()
    started = time.monotonic()
    with ShardedConsumer(cluster, "default", partitions=3) as consumer:
        got = drain(consumer, 20)
        assert consumer.receive(10, timeout_s=0.3) == []
        assert "b" in consumer.errors
    assert {shard for _, shard in got} == {"a", "c"} and time.monotonic() - started < 10


def test_a_shard_that_is_down_is_asked_again_without_a_pause_in_reading_the_others(shards):
    cluster = Cluster.from_file(shards.path)
    with ShardedProducer(cluster, "default", batch=10, partitions=3) as producer:
        assert all(r.ok for r in producer.send_many(bodies(900)))
    shards.servers["b"].stop()
    longest = 0.0
    with ShardedConsumer(cluster, "default", partitions=3) as consumer:
        until = time.monotonic() + RETRY_S + 1.5  # (b is asked again once, its HELLO unanswered for 1 s)
        while time.monotonic() < until:
            started = time.monotonic()
            batch = consumer.receive(1, timeout_s=5)
            longest = max(longest, time.monotonic() - started)
            assert batch and consumer.ack([batch[0][0]]).count == 1
            time.sleep(0.01)
        assert "b" in consumer.errors
    assert longest < 0.8, f"a receive took {longest:.2f} s: the others waited for b's HELLO (1 s)"


def test_a_consumer_waiting_on_empty_shards_longer_than_their_idle_time_gets_the_next_message_at_once(tmp_path):
    limits = dataclasses.replace(DEFAULT_LIMITS, consume_idle_s=0.3)
    servers = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        cfg = make_config(tmp_path / name, limits=limits, api_dsn=dsns(tmp_path / name)["api_dsn"])
        servers[name] = ThreadServer(cfg)
    try:
        path = write_list(tmp_path / "shards.toml", {name: dsns(tmp_path / name) for name in servers})
        cluster = Cluster.from_file(path)
        sent = []

        def produce_later() -> None:
            time.sleep(0.8)  # (the servers' idle time, more than twice: they would have forgotten a silent one)
            sent.append(time.monotonic())
            with ShardedProducer(cluster, "default", partitions=2) as producer:
                assert all(r.ok for r in producer.send_many(bodies(1)))

        with ShardedConsumer(cluster, "default", partitions=2) as consumer:
            later = threading.Thread(target=produce_later)
            later.start()
            batch = consumer.receive(10, timeout_s=10)
            came = time.monotonic()
            later.join()
            assert len(batch) == 1 and consumer.ack([batch[0][0]]).count == 1
        assert came - sent[0] < 1.5, f"{came - sent[0]:.2f} s: its credit was kept (it said it is still here)"
    finally:
        for srv in servers.values():
            srv.stop()


def test_a_shard_that_comes_back_is_read_again(tmp_path):
    names = ("a", "b")
    servers = {name: ProcessServer(tmp_path / name, "--api-dsn", dsns(tmp_path / name)["api_dsn"]) for name in names}
    for name in names:
        (tmp_path / name).mkdir()
        servers[name].start()
    try:
        path = write_list(tmp_path / "shards.toml", {name: dsns(tmp_path / name) for name in names})
        cluster = Cluster.from_file(path)
        with ShardedProducer(cluster, "default", batch=5, partitions=2) as producer:
            assert all(r.ok for r in producer.send_many(bodies(20)))
        servers["b"].stop(signal.SIGKILL)
        with ShardedConsumer(cluster, "default", partitions=2) as consumer:
            assert len(drain(consumer, 10)) == 10 and "b" in consumer.errors
            servers["b"].start()  # (its acknowledged messages waited on its disk)
            got = drain(consumer, 10)
        assert {shard for _, shard in got} == {"b"}
    finally:
        for srv in servers.values():
            srv.stop(signal.SIGKILL)


def test_a_batch_sent_again_after_a_lost_ack_is_stored_once_on_the_shard_it_went_to(tmp_path):
    names = ("a", "b")
    servers = {name: ProcessServer(tmp_path / name, "--api-dsn", dsns(tmp_path / name)["api_dsn"]) for name in names}
    for name in names:
        (tmp_path / name).mkdir()
        servers[name].start()
    try:
        path = write_list(tmp_path / "shards.toml", {name: dsns(tmp_path / name) for name in names})
        with ShardedProducer(Cluster.from_file(path), "default", batch=10, partitions=2, timeout_s=2.0) as producer:
            assert all(r.ok for r in producer.send_many(bodies(20))), "both shards known"
            stopped = servers["b"].proc
            assert stopped is not None
            # (its ack is late: the producer sends b's batch again at 2 s, b wakes at 2.5 s, 1.5 s before it gives up)
            stopped.send_signal(signal.SIGSTOP)
            threading.Timer(2.5, stopped.send_signal, (signal.SIGCONT,)).start()
            results = producer.send_many(bodies(20, "n"))
            resent = producer.resent()
        assert all(r.ok for r in results) and resent == {"a": 0, "b": 1}
        depths = {name: servers[name].stats()["queues"]["default"]["depth"] for name in names}
        assert depths == {"a": 20, "b": 20}, "every message once, each on the shard its batch went to"
    finally:
        for srv in servers.values():
            if srv.proc is not None and srv.proc.poll() is None:
                srv.proc.send_signal(signal.SIGCONT)
            srv.stop(signal.SIGKILL)


def test_an_answer_to_where_that_is_not_pzq_s_is_taken_as_knowing_nothing(tmp_path):
    import zmq

    from pzq.protocols import api

    impostor = zmq.Context.instance().socket(zmq.ROUTER)
    impostor.bind(f"ipc://{tmp_path}/api")
    path = write_list(tmp_path / "shards.toml", {"a": {"api_dsn": f"ipc://{tmp_path}/api"}})
    answers = iter([{"partitions": "many", "held": 5}, {"partitions": 10**9, "held": [7, ["orders", 1], []]}])

    def answer() -> None:
        for _ in range(2):
            if not impostor.poll(5000):
                return
            peer, empty, request_id, _, _ = impostor.recv_multipart()
            impostor.send_multipart([peer, empty, request_id, *api.request(b"", "OK", next(answers))[2:]])

    thread = threading.Thread(target=answer)
    thread.start()
    try:
        with Cluster.from_file(path) as cluster:
            first = cluster.locate("orders")
            second = cluster.locate("orders", fresh=True)
    finally:
        thread.join(5)
        impostor.close(linger=0)
    assert first.partitions == 0 and second.partitions == 0 and first.produce_to == second.produce_to
    assert [q for q, _ in second.consume_from] == ["orders"], "the one well-formed held name, once"


def test_a_shard_that_stops_answering_holds_only_the_batches_it_was_handed_and_the_others_take_the_rest(tmp_path):
    names = ("a", "b")
    servers = {name: ProcessServer(tmp_path / name, "--api-dsn", dsns(tmp_path / name)["api_dsn"]) for name in names}
    for name in names:
        (tmp_path / name).mkdir()
        servers[name].start()
    stopped = None
    try:
        path = write_list(tmp_path / "shards.toml", {name: dsns(tmp_path / name) for name in names})
        with ShardedProducer(Cluster.from_file(path), "default", partitions=2, timeout_s=1.0) as producer:
            assert all(r.ok for r in producer.send_many(bodies(400))), "both shards known"
            stopped = servers["b"].proc
            assert stopped is not None
            stopped.send_signal(signal.SIGSTOP)
            results = producer.send_many(bodies(20_000, "n"))
        failed = [r for r in results if not r.ok]
        # (in flight, one packed waiting for room in the window, the next one taken, those waiting in the lane)
        held = (producer.window + 2 + LANE_BATCHES) * producer.batch
        assert 0 < len(failed) <= held and all(r.error.startswith("shard b: no ack") for r in failed), {
            r.error for r in failed
        }
        assert servers["a"].stats()["queues"]["default"]["depth"] == 200 + 20_000 - len(failed)
    finally:
        if stopped is not None:
            stopped.send_signal(signal.SIGCONT)
        for srv in servers.values():
            srv.stop(signal.SIGKILL)


def test_locate_names_a_shard_that_does_not_answer_and_keeps_its_places(shards):
    cluster = Cluster.from_file(shards.path, cache_s=0)
    shards.servers["c"].stop()
    started = time.monotonic()
    where = cluster.locate("orders", partitions=3)
    assert time.monotonic() - started < 3, "asked at once, a second each at most"
    assert where.unreachable == ("c",)
    assert [(q, s.name) for q, s in where.produce_to] == [(q, s.name) for q, s in shards.list.place("orders", 3)]


def test_a_located_queue_is_answered_at_once_while_a_shard_that_is_down_is_asked_again_behind(shards):
    shards.servers["c"].stop()
    with Cluster.from_file(shards.path, cache_s=0) as cluster:
        started = time.monotonic()
        first = cluster.locate("orders")
        asked = time.monotonic() - started
        started = time.monotonic()
        again = [cluster.locate("orders") for _ in range(20)]
        assert time.monotonic() - started < asked / 2, "the last answer is used while the shards are asked"
    assert first.unreachable == ("c",) and all(where.produce_to == first.produce_to for where in again)


def test_the_api_s_produce_puts_each_queue_on_its_home_and_a_call_again_with_its_key_stores_nothing(shards):
    cluster = Cluster.from_file(shards.path)
    queues = [f"q{i}" for i in range(6)]
    messages = [(queue, f"{queue}-{i}".encode()) for queue in queues for i in range(3)]
    with ClusterApi(cluster, timeout_s=10) as routed:
        first = routed.produce(messages, key="k1")
        again = routed.produce(messages, key="k1")
    assert first["count"] == 18 and not first["duplicate"] and again["duplicate"]
    for queue in queues:
        home = shards.list.home(queue).name
        assert shards.depths(queue) == {name: 3 if name == home else 0 for name in NAMES}, queue


def test_the_api_s_produce_names_a_shard_that_failed_and_the_key_to_call_again_with(shards):
    cluster = Cluster.from_file(shards.path)
    queues = [f"q{i}" for i in range(12)]
    down = shards.list.home(queues[0]).name
    shards.servers[down].stop()
    with ClusterApi(cluster, timeout_s=0.5, attempt_s=0.25) as routed:
        with pytest.raises(ClientError, match=f"shard {down}: .*call again with key k2"):
            routed.produce([(queue, b"x") for queue in queues], key="k2")
    stored = sum(shards.depth(name, queue) for name in NAMES if name != down for queue in queues)
    assert stored == sum(shards.list.home(q).name != down for q in queues), "the others stored theirs"


def create_everywhere(shards: Shards, queue: str, partitions: int) -> None:
    for srv in shards.servers.values():
        assert admin_request(srv.monitor, ["CREATE", queue, str(partitions)], timeout_s=10)


def test_a_cluster_learned_from_one_shard_s_where_is_the_whole_list(shards):
    cluster = Cluster.from_server(shards.list.named("b").api_dsn)
    assert cluster.shards == shards.list
    with pytest.raises(ClientError, match="no answer to WHERE"):
        Cluster.from_server(f"ipc://{Path(shards.path).parent}/nobody", where_timeout_s=0.2)


def test_the_partitions_a_queue_was_created_with_are_found_on_the_shards_and_produced_and_read_over(shards):
    create_everywhere(shards, "default", 3)
    cluster = Cluster.from_file(shards.path)
    where = cluster.locate("default")
    assert where.partitions == 3 and where.produce_to == tuple(shards.list.place("default", 3))
    with ShardedProducer(cluster, "default", batch=10, stall_s=10) as producer:
        assert all(r.ok for r in producer.send_many(bodies(90)))
    assert shards.depths() == dict.fromkeys(NAMES, 30), "no count given: the shards' count"
    with ShardedConsumer(cluster, "default") as consumer:
        assert len(drain(consumer, 90)) == 90


def test_a_queue_a_seed_client_made_on_a_shard_that_is_not_its_home_is_found_and_consumed(shards):
    home = shards.list.home("default").name
    other = next(name for name in NAMES if name != home)
    with Producer(shards.list.named(other).receive_dsn) as seed:  # (a PZQ producer pinned to its server)
        assert all(r.ok for r in seed.produce_many([[b"pinned %d" % i] for i in range(5)]))
    cluster = Cluster.from_file(shards.path)
    where = cluster.locate("default")
    assert [s.name for _, s in where.produce_to] == [home], "its place stays its home"
    assert ("default", shards.list.named(other)) in where.consume_from, "held there: read there"
    with ShardedConsumer(cluster, "default") as consumer:
        got = drain(consumer, 5)
    assert sorted(body for body, _ in got) == [b"pinned %d" % i for i in range(5)] and {s for _, s in got} == {other}
    assert shards.depth(other) == 0


def test_a_named_queue_made_through_another_shard_s_api_is_held_there_and_located(shards):
    home = shards.list.home("orders").name
    other = next(name for name in NAMES if name != home)
    with ApiClient(shards.list.named(other).api_dsn, timeout_s=10) as seed:
        seed.produce([("orders", b"kept where it was made")])
    where = Cluster.from_file(shards.path).locate("orders")
    assert [(q, s.name) for q, s in where.consume_from] == [("orders", home), ("orders", other)]


def test_the_api_s_produce_spreads_a_partitioned_queue_over_its_places_and_stores_a_repeat_once(shards):
    create_everywhere(shards, "orders", 6)
    cluster = Cluster.from_file(shards.path)
    messages = [("orders", b"o%d" % i) for i in range(60)]
    with ClusterApi(cluster, timeout_s=10) as routed:
        first = routed.produce(messages, key="k3")
        again = routed.produce(messages, key="k3")
    assert first["count"] == 60 and again["duplicate"] and again["count"] == 60
    for queue, shard in shards.list.place("orders", 6):
        assert shards.depth(shard.name, queue) == 10, (queue, shard.name)


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def test_pzq_produce_and_consume_with_cluster_route_over_the_shards(shards):
    lines = "\n".join(f"line {i}" for i in range(30)) + "\n"
    done = CliRunner().invoke(cli, ["produce", "--cluster", shards.path, "--batch", "10"], input=lines)
    assert done.exit_code == 0, done.output
    assert "30 stored, 0 refused" in done.stderr
    home = shards.list.home("default").name
    assert shards.depths() == {name: 30 if name == home else 0 for name in NAMES}
    done = run("consume", "--cluster", shards.path, "-n", "30", "--json")
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [row["body"][0] for row in rows] == [f"line {i}" for i in range(30)]
    assert {row["shard"] for row in rows} == {home} and shards.depths() == dict.fromkeys(NAMES, 0)


def test_pzq_consume_with_cluster_exits_no_message_when_no_shard_has_one(shards):
    done = run("consume", "--cluster", shards.path, "--timeout", "300ms")
    assert done.exit_code == ExitCode.NO_MESSAGE and "no message came within" in done.stderr


def test_pzq_consume_with_cluster_says_in_one_line_that_no_shard_listens(tmp_path):
    path = write_list(tmp_path / "shards.toml", {name: dsns(tmp_path / name) for name in NAMES})
    done = run("consume", "--cluster", path, "--timeout", "5s")
    assert done.exit_code == ExitCode.NOT_LISTENING and done.stderr.count("\n") == 1
    assert done.stderr.startswith("pzq: error: no shard of 'default' could be reached: shard ")
    home = load(path).home("default").name  # (a queue of one partition is read from its home alone)
    assert f"shard {home}: nothing listens at ipc://{tmp_path}/{home}/consume" in done.stderr


def test_a_bad_shard_list_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[shard]]\nname = 'a'\nreceive = 'x'\n")
    for command in ("produce", "consume"):
        done = run(command, "--cluster", str(bad), "x" if command == "produce" else "-n1")
        assert done.exit_code == ExitCode.CONFIG and done.stderr.count("\n") == 1, done.output
        assert str(bad) in done.stderr and "unknown keys" in done.stderr


def test_pzq_produce_with_cluster_names_the_shard_nothing_listens_at_and_exits_1(shards):
    home = shards.list.home("default").name
    shards.servers[home].stop()
    started = time.monotonic()
    done = run("produce", "--cluster", shards.path, "--timeout", "30s", "one", "two")
    assert done.exit_code == ExitCode.FAILURE and time.monotonic() - started < 5, "not after --timeout"
    assert f"refused: shard {home}: nothing listens at" in done.stderr and "0 stored, 2 refused" in done.stderr


def test_pzq_produce_and_consume_follow_the_settings_cluster_and_the_partitions_the_shards_keep(shards):
    create_everywhere(shards, "default", 3)
    env = {"PZQ_CLUSTER": shards.path, "PZQ_CONFIG": None}
    done = CliRunner().invoke(cli, ["produce", "--batch", "10"], input="".join(f"{i}\n" for i in range(60)), env=env)
    assert done.exit_code == 0 and "60 stored, 0 refused" in done.stderr, done.output
    assert shards.depths() == dict.fromkeys(NAMES, 20)
    done = run("consume", "-n", "60", env=env)
    assert done.exit_code == 0 and sorted(map(int, done.stdout.split())) == list(range(60))
    assert shards.depths() == dict.fromkeys(NAMES, 0)
    nowhere = {f"PZQ_{n}_DSN": f"ipc://{Path(shards.path).parent}/nowhere-{n}" for n in ("SEND", "CONSUME")}
    done = run("consume", "--cluster", "", "--timeout", "300ms", env={**env, **nowhere})  # ('': one server)
    assert done.exit_code == ExitCode.NOT_LISTENING and "nowhere-" in done.stderr, done.output


def test_a_list_entry_pointing_at_another_shard_is_never_produced_to_and_the_error_names_both(shards, tmp_path):
    """The list's entry for the home of "default" gives another shard's endpoints (a copy-paste slip): its
    WHERE answers as that other shard, so nothing goes there (it would be stored on a shard the queue does
    not live on, read by nobody who locates it) and the error names both."""
    home = shards.list.home("default").name
    other = next(name for name in NAMES if name != home)
    swapped = {name: dsns(tmp_path / (other if name == home else name)) for name in NAMES}
    cluster = Cluster.from_file(write_list(tmp_path / "wrong.toml", swapped))
    where = cluster.locate("default")
    assert where.wrong == (home,) and f"shard {other!r}" in cluster.wrong[home]
    assert where.unreachable == (home,)  # (a reader knowing only that, as the Spark source, takes it as down)
    with ShardedProducer(cluster, "default", batch=10, timeout_s=2) as producer:
        results = producer.send_many(bodies(20))
    assert not any(r.ok for r in results) and f"shard {home}: " in results[0].error
    assert f"shard {other!r}" in results[0].error
    with ClusterApi(cluster, timeout_s=5) as api, pytest.raises(ClientError, match=f"shard {other!r}"):
        api.produce([("default", b"x")])
    assert shards.depths() == dict.fromkeys(NAMES, 0)


def test_many_queues_located_at_once_each_get_the_count_the_shards_keep_none_taken_for_a_busy_refusal(shards):
    """40 queues located in one round (ClusterApi.route does so): each shard refuses a client's requests
    past its share waiting (16) with ERR busy, which had been taken as "a server without WHERE", so
    the queues past it were placed as queues of no partitions, their messages stored in Q, not Q#i."""
    names = [f"p{i}" for i in range(40)]
    for name in names:
        create_everywhere(shards, name, 3)
    where = Cluster.from_file(shards.path).locate_many(names)
    assert {name: where[name].partitions for name in names} == dict.fromkeys(names, 3)
    assert all(not where[name].unreachable for name in names)


def test_an_endpoint_named_on_the_command_line_is_that_one_server_whatever_the_settings_cluster(shards):
    """PZQ_CLUSTER (or a shard's config) names the list, and the command names one server's endpoint:
    that server is the one meant (before, the endpoint was silently ignored for the list's placement)."""
    home = shards.list.home("default").name
    other = shards.list.named(next(name for name in NAMES if name != home))
    env = {"PZQ_CLUSTER": shards.path, "PZQ_CONFIG": None}
    done = run("produce", "--receive-dsn", other.receive_dsn, "pinned", env=env)
    assert done.exit_code == 0, done.output
    assert shards.depths() == {name: 1 if name == other.name else 0 for name in NAMES}
    done = run("consume", "--consume-dsn", other.consume_dsn, "-n", "1", env=env)
    assert done.exit_code == 0 and done.stdout == "pinned\n", done.output
    both = run("produce", "--cluster", shards.path, "--receive-dsn", other.receive_dsn, "x", env=env)
    assert both.exit_code == ExitCode.CONFIG and "--cluster or --receive-dsn" in both.stderr, both.output


def test_pzq_consume_with_cluster_names_each_shard_it_left_out_when_it_ends(shards):
    """A shard that is down (or answers as another) is left out of the round: the command had ended with
    "no message came" alone, the messages that shard holds unmentioned."""
    create_everywhere(shards, "default", 3)
    down = "b"
    shards.servers[down].stop()
    done = run("consume", "--cluster", shards.path, "--timeout", "300ms")
    assert done.exit_code == ExitCode.NO_MESSAGE
    assert f"pzq: shard {down} left out: " in done.stderr, done.stderr
