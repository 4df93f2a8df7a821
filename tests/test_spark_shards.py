"""The Spark connector across shards: three real `pzq serve` processes (each its own store and ports)
listed in a shard list file, and a real local Spark session reading a partitioned queue as one source
and writing to it as one sink (docs/spark.md, "Shards")."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from etcd_cluster import EtcdCluster, EtcdShards, needs_etcd

from conftest import local_spark, wait_until
from shard_servers import NAMES, Shards

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def spark():
    # local[2,4]: a task may fail three times and be run again, as on a cluster (a shard down too long)
    session = local_spark("local[2,4]", "pzq-shard-tests")
    yield session
    session.stop()


@pytest.fixture
def shards(tmp_path):
    made = Shards(tmp_path)
    yield made
    made.close()


def stream(spark, shards: Shards, queue: str, **options):
    reader = spark.readStream.format("pzq").option("cluster", str(shards.path)).option("queue", queue)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def running(query) -> bool:
    """True while ``query`` runs; its error, raised, once it failed (a wait ends at once, with the reason)."""
    if not query.isActive and query.exception() is not None:
        raise AssertionError(f"the query failed: {query.exception()}")
    return True


class Batches:
    """A foreachBatch sink recording every batch's bodies (attempts included) in a file; ``before``
    runs first with the batch id (a fault to inject while the batch is read)."""

    def __init__(self, path: Path, before=None):
        self.path, self.before = path, before

    def __call__(self, df, batch_id: int) -> None:
        if self.before is not None:
            self.before(batch_id)
        bodies = sorted(bytes(r.body).decode() for r in df.select("body").collect())
        with open(self.path, "a") as out:
            out.write(json.dumps({"batch": batch_id, "bodies": bodies}) + "\n")

    def read(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []

    def bodies(self) -> list[str]:
        """Every body of the last attempt of each batch (a re-run batch replaces its attempt before)."""
        last = {b["batch"]: b["bodies"] for b in self.read()}
        return sorted(body for bodies in last.values() for body in bodies)


def test_a_queue_of_six_partitions_on_three_shards_is_read_whole_exactly_once_and_acknowledged(spark, shards, tmp_path):
    bodies = [b"m%04d" % i for i in range(900)]
    shards.create("events", 6)
    sent = shards.produce("events", 6, bodies)
    assert sorted(sent) == list(NAMES)  # every shard holds some of its partitions
    query = (
        stream(spark, shards, "events", maxMessagesPerBatch=200)
        .writeStream.format("memory")
        .queryName("whole")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        rows = spark.sql("SELECT queue, body FROM whole").collect()
        shards.produce("events", 6, [b"late"])  # planning the next batch commits (acknowledges) the ones read
        query.processAllAvailable()
        offsets = query.lastProgress["sources"][0]["endOffset"]
    finally:
        query.stop()
    assert sorted(bytes(r.body) for r in rows) == bodies  # each once
    assert {r.queue for r in rows} == {f"events#{i}" for i in range(6)}
    assert set(json.loads(offsets)["streams"] if isinstance(offsets, str) else offsets["streams"]) == {
        f"{shard.name}/{name}" for name, shard in shards.list.place("events", 6)
    }
    assert sum(shards.depth("events", 6).values()) == 1  # only the late one, not yet committed


def test_a_snapshot_reads_every_shards_partitions_and_changes_nothing(spark, shards):
    # (the queue was not created: queuePartitions says its count, as for servers that predate WHERE)
    bodies = [b"s%03d" % i for i in range(300)]
    shards.produce("snap", 4, bodies)
    df = (
        spark.read.format("pzq")
        .option("cluster", str(shards.path))
        .option("queue", "snap")
        .option("queuePartitions", 4)
        .option("numPartitions", 3)
        .load()
    )
    assert sorted(bytes(r.body) for r in df.collect()) == bodies
    assert sum(shards.depth("snap", 4).values()) == 300


def test_the_sink_places_each_chunk_by_its_key_so_a_rewrite_of_the_same_batch_stores_nothing(spark, shards):
    df = spark.createDataFrame([(f"row-{i}",) for i in range(3000)], "body string").repartition(3)

    def write() -> None:
        (
            df.write.format("pzq")
            .option("cluster", str(shards.path))
            .option("queue", "out")
            .option("dedupKey", "job-1")
            .mode("append")
            .save()
        )

    shards.create("out", 3)
    write()
    first = shards.depth("out", 3)
    assert sum(first.values()) == 3000
    assert sum(1 for n in first.values() if n) >= 2  # chunks went to more than one partition
    write()  # a re-run: the same chunks under the same keys go to the same partitions, stored there once
    assert shards.depth("out", 3) == first


def test_a_shard_down_while_batches_are_planned_keeps_its_offset_and_its_rows_come_once_it_is_back(
    spark, shards, tmp_path
):
    sink = Batches(tmp_path / "batches.jsonl")

    def start():
        return (
            stream(spark, shards, "down", shardTimeout=1)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )

    def offsets(query) -> dict:
        end = query.lastProgress["sources"][0]["endOffset"]
        return (json.loads(end) if isinstance(end, str) else end)["streams"]

    first = [b"d%03d" % i for i in range(90)]
    shards.create("down", 3)
    shards.produce("down", 3, first)
    query = start()
    try:
        wait_until(lambda: running(query) and len(sink.bodies()) == 90, timeout_s=120, interval_s=0.2)
        query.processAllAvailable()  # (its progress is posted after the batch the sink saw: wait for it)
        before = offsets(query)
    finally:
        query.stop()
    second = shards.produce("down", 3, [b"e%03d" % i for i in range(90)])  # on every shard, none read yet
    (b_key,) = [key for key in before if key.startswith("b/")]
    shards.servers["b"].stop(signal.SIGKILL)
    query = start()  # the same query, on its checkpoint, with shard b down
    try:
        others = sorted(b.decode() for b in first + second["a"] + second["c"])
        wait_until(lambda: running(query) and sink.bodies() == others, timeout_s=120, interval_s=0.2)
        query.processAllAvailable()  # (planned again with b still down)
        assert offsets(query)[b_key] == before[b_key]  # kept, not skipped
        assert sink.bodies() == others
        shards.servers["b"].start()
        want = sorted(b.decode() for b in first + [body for bodies in second.values() for body in bodies])
        wait_until(lambda: running(query) and sink.bodies() == want, timeout_s=120, interval_s=0.2)
        query.processAllAvailable()
    finally:
        query.stop()
    assert offsets(query)[b_key] == before[b_key] + len(second["b"])


def test_a_shard_sigkilled_while_a_batch_is_read_and_restarted_leaves_the_output_exactly_the_produced_ids(
    spark, shards, tmp_path
):
    back = threading.Timer(6.0, shards.servers["b"].start)

    def kill_b(batch_id: int) -> None:
        if batch_id == 1:  # the batch is planned; its tasks read (collect) after this, with b down 6 s
            shards.servers["b"].stop(signal.SIGKILL)
            back.start()

    sink = Batches(tmp_path / "batches.jsonl", before=kill_b)
    produced = [b"k%04d" % i for i in range(600)]
    shards.create("killed", 6)
    on_b = shards.produce("killed", 6, produced[:300])["b"]
    query = (
        stream(spark, shards, "killed", maxMessagesPerBatch=150, timeout=2)  # (a task gives up after 2 s)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        wait_until(lambda: running(query) and any(b["batch"] == 1 for b in sink.read()), timeout_s=120, interval_s=0.2)
        shards.produce("killed", 6, produced[300:])
        want = sorted(b.decode() for b in produced)
        wait_until(lambda: running(query) and sink.bodies() == want, timeout_s=120, interval_s=0.2)
        query.processAllAvailable()
    finally:
        query.stop()
        back.cancel()  # (a test that failed early leaves no server started after the fixture's reaping)
        if back.is_alive():
            back.join()
    assert sink.bodies() == want
    assert all(len(b["bodies"]) == len(set(b["bodies"])) for b in sink.read())
    (killed,) = [b["bodies"] for b in sink.read() if b["batch"] == 1]
    assert {body.encode() for body in killed} & set(on_b)  # b's rows of that batch were read after its restart
    # by a task run again: b stayed down longer than a task waits (``timeout`` 2 s, a resend included)
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(str(query.runId))]
    stages = [tracker.getStageInfo(stage) for job in jobs if job for stage in job.stageIds]
    assert sum(stage.numFailedTasks for stage in stages if stage) >= 1


def test_a_checkpoint_of_one_servers_offsets_reads_on_as_that_servers_stream_once_the_query_reads_the_list(shards):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from pzq.spark import LeaseStreamReader, Options, SourceReader

    a = shards.servers["a"]
    shards.clients["a"].produce([("solo", b"s%02d" % i) for i in range(30)])
    before = LeaseStreamReader(Options(endpoint=a.endpoint, queue="solo"))  # the query as it ran on one server
    try:
        assert before.latestOffset({"seq": 0}, ReadMaxRows(10)) == {"seq": 10}
        before.commit({"seq": 10})
    finally:
        before.stop()
    after = SourceReader(Options(endpoint=a.endpoint, queue="solo", cluster=str(shards.path)))
    try:
        end = after.latestOffset({"seq": 10}, ReadMaxRows(100))
        assert end["streams"]["a/solo"] == 30  # its seq is a's stream of the queue: 20 more leased from 10
        rows = [row for part in after.partitions({"seq": 10}, end) for row in after.read(part)]
        assert sorted(row[3] for row in rows) == [b"s%02d" % i for i in range(10, 30)]
        after.commit(end)
        assert shards.clients["a"].info("solo")["depth"] == 0
    finally:
        after.stop()


def test_a_query_given_one_shards_endpoint_finds_the_list_by_where_and_reads_a_queue_held_off_its_home_too(
    spark, shards, tmp_path
):
    home = shards.list.home("found").name
    elsewhere = next(name for name in NAMES if name != home)
    third = next(name for name in NAMES if name not in (home, elsewhere))
    shards.clients[home].produce([("found", b"h%02d" % i) for i in range(50)])
    # (what a seed-protocol client connected to another shard makes: the queue, held there, not refused)
    shards.clients[elsewhere].produce([("found", b"x%02d" % i) for i in range(40)])
    query = (
        spark.readStream.format("pzq")
        .option("endpoint", shards.servers[third].endpoint)  # no cluster option: its WHERE names the list
        .option("queue", "found")
        .load()
        .writeStream.format("memory")
        .queryName("found")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        rows = spark.sql("SELECT body FROM found").collect()
        offsets = query.lastProgress["sources"][0]["endOffset"]
    finally:
        query.stop()
    assert sorted(bytes(r.body) for r in rows) == [b"h%02d" % i for i in range(50)] + [b"x%02d" % i for i in range(40)]
    ends = (json.loads(offsets) if isinstance(offsets, str) else offsets)["streams"]
    assert ends == {f"{home}/found": 50, f"{elsewhere}/found": 40}


@needs_etcd
def test_over_shards_registered_in_etcd_the_sink_places_a_new_queue_and_a_stream_reads_it_whole_once(spark, tmp_path):
    """No shard list anywhere: three shards registered in a real etcd; the sink, given one shard's
    endpoint, has the queue placed (by its first PRODUCE's WHERE) and writes each chunk where etcd
    placed it; a stream given another shard's endpoint reads every partition once."""
    (tmp_path / "etcd").mkdir()
    etcd = EtcdCluster(tmp_path / "etcd", members=1)
    shards = None
    try:
        shards = EtcdShards(tmp_path, etcd)
        created = subprocess.run(
            [sys.executable, "-m", "pzq", "queue", "create", "placed", "--partitions", "6",
             "--monitor-dsn", shards.servers["a"].monitor],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        rows = [(f"e-{i:04d}",) for i in range(1200)]
        (
            spark.createDataFrame(rows, "body string")
            .repartition(3)
            .write.format("pzq")
            .option("endpoint", shards.endpoints["b"])
            .option("queue", "placed")
            .option("dedupKey", "etcd-job")
            .mode("append")
            .save()
        )
        query = (
            spark.readStream.format("pzq")
            .option("endpoint", shards.endpoints["c"])
            .option("queue", "placed")
            .load()
            .writeStream.format("memory")
            .queryName("placed_by_etcd")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        try:
            query.processAllAvailable()
            read = spark.sql("SELECT queue, body FROM placed_by_etcd").collect()
        finally:
            query.stop()
        assert sorted(bytes(r.body).decode() for r in read) == [body for (body,) in rows]
        placed = shards.clients["a"].call("WHERE", queue="placed")["placed"]
        by_shard = {shard for _, shard in placed}
        assert by_shard == {"a", "b", "c"} and {r.queue for r in read} <= {name for name, _ in placed}
    finally:
        if shards is not None:
            shards.close()
        etcd.close()
