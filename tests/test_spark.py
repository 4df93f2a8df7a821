"""The Spark connector against a real server and one real local[2] Spark session for the module."""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path

import pytest

from pzq.clients import native as client
from pzq.clients.api import ApiClient

from conftest import local_spark

pyspark = pytest.importorskip("pyspark")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def spark():
    session = local_spark("local[2]", "pzq-tests")
    yield session
    session.stop()


@pytest.fixture
def api_server(process_server, tmp_path):
    """A subprocess server with its API on ipc; .api is a client, .endpoint its address."""
    endpoint = f"ipc://{tmp_path}/api"
    srv = process_server("--api-dsn", endpoint)
    srv.endpoint = endpoint
    srv.api = ApiClient(endpoint, timeout_s=30)
    yield srv
    srv.api.close()


def produce(api: ApiClient, queue: str, bodies: list[bytes]) -> None:
    for i in range(0, len(bodies), 1000):
        api.produce([(queue, b) for b in bodies[i : i + 1000]])


def stream(spark, srv, queue: str, **options):
    reader = spark.readStream.format("pzq").option("endpoint", srv.endpoint).option("queue", queue)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def to_memory(spark, srv, queue: str, checkpoint: Path, **options):
    """A started query copying ``queue`` into the in-memory table of the same name."""
    return (
        stream(spark, srv, queue, **options)
        .writeStream.format("memory")
        .queryName(queue)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


class Batches:
    """A foreachBatch sink that records every batch's rows, attempts included (a file, so that it is
    shared with Spark's Python worker)."""

    def __init__(self, path: Path, fail_batch: int | None = None):
        self.path = path
        self.fail_batch = fail_batch

    def __call__(self, df, batch_id: int) -> None:
        rows = [(r.seq, r.key, bytes(r.body), r.deliveries) for r in df.orderBy("seq").collect()]
        with open(self.path, "a") as out:
            out.write(json.dumps({"batch": batch_id, "rows": [[s, k, b.decode(), d] for s, k, b, d in rows]}) + "\n")
        if batch_id == self.fail_batch:
            self.fail_batch = None
            raise RuntimeError(f"failing batch {batch_id} on purpose")

    def read(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []


def test_a_stream_reads_every_message_complete_and_in_queue_order_per_partition(spark, api_server, tmp_path):
    bodies = [b"message-%04d" % i for i in range(250)]
    produce(api_server.api, "events", bodies)
    query = (
        stream(spark, api_server, "events", maxMessagesPerBatch=100, numPartitions=2)
        .selectExpr("*", "spark_partition_id() AS part")
        .writeStream.format("memory")
        .queryName("ordered")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        rows = spark.sql("SELECT seq, body, queue, key, deliveries, enqueued_at, part FROM ordered").collect()
    finally:
        query.stop()
    assert sorted(bytes(r.body) for r in rows) == bodies
    assert sorted(r.seq for r in rows) == list(range(250))
    assert {r.queue for r in rows} == {"events"} and {r.deliveries for r in rows} == {1}
    assert all(len(r.key) == 32 and r.enqueued_at is not None for r in rows)
    for part in {r.part for r in rows}:  # within a partition, seq order is queue order
        in_part = [r for r in rows if r.part == part]
        assert [bytes(r.body) for r in sorted(in_part, key=lambda r: r.seq)] == sorted(bytes(r.body) for r in in_part)


def test_nothing_leaves_the_queue_until_spark_commits_the_batch(spark, api_server, tmp_path):
    api = api_server.api
    produce(api, "lagged", [b"a%d" % i for i in range(30)])
    query = to_memory(spark, api_server, "lagged", tmp_path / "ck", maxMessagesPerBatch=1000)
    try:
        query.processAllAvailable()
        assert spark.sql("SELECT count(*) AS n FROM lagged").first().n == 30
        # Spark commits batch N to the source only when it plans batch N+1: all 30 are still stored.
        assert api.info("lagged")["depth"] == 30
        produce(api, "lagged", [b"b0"])
        query.processAllAvailable()
        assert api.info("lagged")["depth"] == 1  # batch 0 committed and deleted; batch 1 still held
    finally:
        query.stop()


def test_a_batch_larger_than_one_lease_call_is_read_whole(spark, api_server, tmp_path):
    api = api_server.api
    produce(api, "wide", [b"w%d" % i for i in range(12_000)])  # (a lease call stops after 10 ms of work)
    query = to_memory(spark, api_server, "wide", tmp_path / "ck", maxMessagesPerBatch=12_000)
    try:
        query.processAllAvailable()
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert batches == [12_000]
    finally:
        query.stop()


def test_a_restart_on_the_same_checkpoint_replays_the_uncommitted_batch_identically(spark, api_server, tmp_path):
    api = api_server.api
    produce(api, "replay", [b"r%d" % i for i in range(40)])
    sink = Batches(tmp_path / "batches.jsonl", fail_batch=1)

    def run():
        return (
            stream(spark, api_server, "replay", maxMessagesPerBatch=15)
            .writeStream.option("checkpointLocation", str(tmp_path / "ck"))
            .foreachBatch(sink)
            .start()
        )

    query = run()
    with pytest.raises(Exception, match="on purpose"):
        query.awaitTermination(120)
    failed = [b for b in sink.read() if b["batch"] == 1]
    assert len(failed) == 1
    sink.fail_batch = None
    query = run()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    attempts = [b for b in sink.read() if b["batch"] == 1]
    assert len(attempts) == 2 and attempts[1]["rows"] == attempts[0]["rows"]  # same seqs, keys, bodies
    seen = {row[2] for b in sink.read() for row in b["rows"]}
    assert seen == {f"r{i}" for i in range(40)}


def test_killing_the_server_with_sigkill_between_batches_loses_nothing(spark, api_server, tmp_path):
    api = api_server.api
    produce(api, "killed", [b"k%d" % i for i in range(50)])
    query = to_memory(spark, api_server, "killed", tmp_path / "ck", maxMessagesPerBatch=20)
    try:
        query.processAllAvailable()
        api_server.restart(signal.SIGKILL)
        produce(api, "killed", [b"k%d" % i for i in range(50, 80)])
        query.processAllAvailable()
        api_server.restart(signal.SIGKILL)
        produce(api, "killed", [b"k80"])
        query.processAllAvailable()
        seen = [bytes(r.body) for r in spark.sql("SELECT body FROM killed").collect()]
    finally:
        query.stop()
    assert set(seen) == {b"k%d" % i for i in range(81)}
    assert len(seen) == 81  # and none twice: every lease survived the kills
    assert api.info("killed")["depth"] == 1  # only the last, uncommitted batch is still stored


def test_the_sink_stores_rows_that_native_consumers_receive(spark, api_server):
    df = spark.createDataFrame([(f"row-{i}",) for i in range(20)], "body string")
    df.write.format("pzq").option("endpoint", api_server.endpoint).option("queue", "default").mode("append").save()
    got = []
    with client.Consumer(api_server.send) as consumer:
        while len(got) < 20 and (delivery := consumer.receive(timeout_s=5)) is not None:
            got.append(b"".join(delivery.body))
            consumer.ack(delivery)
    assert sorted(got) == sorted(b"row-%d" % i for i in range(20))


def test_a_streaming_sink_routes_rows_by_their_queue_column_and_a_rerun_batch_is_stored_once(
    spark, api_server, tmp_path
):
    api = api_server.api
    produce(api, "in", [b"x%d" % i for i in range(10)])
    query = (
        stream(spark, api_server, "in")
        .selectExpr("body", "CASE WHEN seq % 2 = 0 THEN 'even' ELSE 'odd' END AS queue")
        .writeStream.format("pzq")
        .option("endpoint", api_server.endpoint)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert api.info("even")["depth"] == 5 and api.info("odd")["depth"] == 5
    # The same write named by the same key (what a re-run batch is) stores nothing more.
    df = spark.createDataFrame([("again",)], "body string")
    for _ in range(2):
        (
            df.write.format("pzq")
            .option("endpoint", api_server.endpoint)
            .option("queue", "even")
            .option("dedupKey", "batch-7")
            .mode("append")
            .save()
        )
    assert api.info("even")["depth"] == 6


def test_a_batch_read_is_a_snapshot_that_changes_nothing(spark, api_server):
    api = api_server.api
    produce(api, "snap", [b"s%d" % i for i in range(120)])
    df = (
        spark.read.format("pzq")
        .option("endpoint", api_server.endpoint)
        .option("queue", "snap")
        .option("numPartitions", 3)
        .load()
    )
    rows = df.collect()
    assert sorted(r.seq for r in rows) == list(range(1, 121))
    assert {bytes(r.body) for r in rows} == {b"s%d" % i for i in range(120)}
    assert api.info("snap")["depth"] == 120
    assert spark.read.format("pzq").option("endpoint", api_server.endpoint).option("queue", "none").load().count() == 0


def test_the_pipeline_aggregates_json_events_per_key_and_window_into_parquet(spark, api_server, tmp_path):
    spec = importlib.util.spec_from_file_location("spark_pipeline", ROOT / "scripts" / "spark_pipeline.py")
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    events = []
    for second in range(0, 120, 5):  # two one-minute windows, keys a and b
        events.append({"key": "a", "ts": f"2026-11-21T12:{second // 60:02d}:{second % 60:02d}Z", "value": 1.0})
        events.append({"key": "b", "ts": 1795262400 + second, "value": float(second)})  # epoch 12:00:00Z
    events.append({"key": "a", "ts": "2026-11-21T12:10:00Z", "value": 0.0})  # moves the watermark on
    bodies = [json.dumps(e).encode() for e in events] + [b"not json", b'{"key": "a"}']
    produce(api_server.api, "events", bodies)
    output, checkpoint = tmp_path / "agg", tmp_path / "ck"
    query = pipeline.start(
        spark,
        endpoint=api_server.endpoint,
        queue="events",
        group="pipeline",
        output=str(output),
        checkpoint=str(checkpoint),
        results_queue="results",
    )
    try:
        query.processAllAvailable()
        produce(
            api_server.api, "events", [json.dumps({"key": "c", "ts": "2026-11-21T12:11:00Z", "value": 1.0}).encode()]
        )
        query.processAllAvailable()
    finally:
        query.stop()
    result = {
        (r.window_start.strftime("%H:%M"), r.key): (r.events, r.total)
        for r in spark.read.parquet(str(output)).collect()
    }
    assert result == {
        ("12:00", "a"): (12, 12.0),
        ("12:01", "a"): (12, 12.0),
        ("12:00", "b"): (12, float(sum(range(0, 60, 5)))),
        ("12:01", "b"): (12, float(sum(range(60, 120, 5)))),
    }
    assert api_server.api.info("results")["depth"] == 4


def test_an_available_now_query_reads_what_is_there_stops_and_the_next_run_acknowledges_it(spark, api_server, tmp_path):
    api = api_server.api
    produce(api, "nightly", [b"n%d" % i for i in range(25)])

    sink = Batches(tmp_path / "batches.jsonl")

    def run() -> int:
        before = sum(len(b["rows"]) for b in sink.read())
        query = (
            stream(spark, api_server, "nightly", maxMessagesPerBatch=10)
            .writeStream.foreachBatch(sink)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )
        assert query.awaitTermination(120)
        return sum(len(b["rows"]) for b in sink.read()) - before

    assert run() == 25
    assert api.info("nightly")["depth"] == 25  # the last batch is acknowledged when the next one is planned
    produce(api, "nightly", [b"late"])
    assert run() == 1
    assert api.info("nightly")["depth"] == 1


def test_a_page_goes_to_spark_as_one_arrow_batch_with_the_same_values_as_its_rows():
    import datetime

    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from pzq.spark.read import arrow_schema, columnar, page

    kinds = [StringType(), StringType(), LongType(), BinaryType(), TimestampType(), IntegerType()]
    names = ["queue", "key", "seq", "body", "enqueued_at", "deliveries"]
    ours = StructType([StructField(n, k) for n, k in zip(names, kinds, strict=True)])

    messages = [[7, "a" * 32, 1_700_000_000_123_456, 1, b"one"], [8, "b" * 32, 0, 3, b"\x00two"]]
    (batch,) = page("events", messages, arrow_schema())
    rows = list(page("events", messages, None))
    assert batch.num_rows == 2 and [tuple(r.values()) for r in batch.to_pylist()] == rows
    assert rows[0][4] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=datetime.UTC)
    assert list(page("events", [], arrow_schema())) == []
    assert columnar(ours) and not columnar(StructType([StructField("body", StringType())]))
    assert not columnar(StructType([*ours.fields[:-1], StructField("deliveries", StringType())]))
    assert columnar(StructType([*ours.fields[:-1], StructField("deliveries", IntegerType())]))


def test_planning_a_full_batch_leases_the_next_one_ahead_and_the_next_plan_gets_exactly_those(api_server):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from pzq.spark import LeaseStreamReader, Options

    api = api_server.api
    produce(api, "ahead", [b"a%d" % i for i in range(250)])
    reader = LeaseStreamReader(Options(endpoint=api_server.endpoint, queue="ahead"))
    try:
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(100)) == {"seq": 100}
        reader._wait_ahead(30)
        assert api.offsets("ahead", "spark") == (0, 200)  # the next batch is leased while this one is read
        rows = [row for part in reader.partitions({"seq": 100}, {"seq": 200}) for row in reader.read(part)]
        assert [row[2] for row in rows] == list(range(100, 200))  # (tuples: no Arrow schema was given)
        assert [row[3] for row in rows] == [b"a%d" % i for i in range(100, 200)]
        assert reader.latestOffset({"seq": 100}, ReadMaxRows(100)) == {"seq": 200}
        reader._wait_ahead(30)
        assert api.offsets("ahead", "spark") == (0, 250)  # a short batch: 50 were there
        assert reader.latestOffset({"seq": 200}, ReadMaxRows(100)) == {"seq": 250}
        reader._wait_ahead(30)
        assert api.offsets("ahead", "spark") == (0, 250)  # not full: nothing is leased ahead
    finally:
        reader.stop()
    # A query that restarts on its checkpoint plans from its last offset and gets the same leases.
    again = LeaseStreamReader(Options(endpoint=api_server.endpoint, queue="ahead"))
    try:
        assert again.latestOffset({"seq": 100}, ReadMaxRows(100)) == {"seq": 200}
        produce(api, "ahead", [b"b%d" % i for i in range(300)])
        assert again.latestOffset({"seq": 250}, ReadAllAvailable()) == {"seq": 550}
        again._wait_ahead(30)
        assert api.offsets("ahead", "spark") == (0, 550)  # availableNow reads what is there: no lease ahead
    finally:
        again.stop()


def test_a_batch_leased_while_spark_waits_is_a_first_part_and_the_rest_is_leased_ahead_while_it_is_read(
    api_server, monkeypatch
):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    import pzq.spark.stream
    from pzq.spark import LeaseStreamReader, Options

    monkeypatch.setattr(pzq.spark.stream, "FIRST_BATCH", 100)  # (100,000 in use: too many messages for a test)
    api = api_server.api
    produce(api, "ramp", [b"a%d" % i for i in range(450)])
    reader = LeaseStreamReader(Options(endpoint=api_server.endpoint, queue="ramp", max_per_batch=300))
    try:
        assert reader.initialOffset() == {"seq": 0}
        reader._wait_ahead(30)
        assert api.offsets("ramp", "spark") == (0, 100)  # a new query's first batch is leased at once
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(300)) == {"seq": 100}  # only a first part: 100
        reader._wait_ahead(30)
        assert api.offsets("ramp", "spark") == (0, 400)  # the next batch, whole, while Spark reads that part
        assert reader.latestOffset({"seq": 100}, ReadMaxRows(300)) == {"seq": 400}
        reader._wait_ahead(30)
        assert reader.latestOffset({"seq": 400}, ReadMaxRows(300)) == {"seq": 450}  # what is left: not full
        produce(api, "ramp", [b"b%d" % i for i in range(250)])  # a burst after batches that kept up
        assert reader.latestOffset({"seq": 450}, ReadMaxRows(300)) == {"seq": 550}  # a first part again
        reader._wait_ahead(30)
        assert api.offsets("ramp", "spark") == (0, 700)
    finally:
        reader.stop()
    # A query restarted on its checkpoint finds its lease ahead made and plans it whole, as it would have.
    again = LeaseStreamReader(Options(endpoint=api_server.endpoint, queue="ramp", max_per_batch=300))
    try:
        assert again.latestOffset({"seq": 550}, ReadMaxRows(300)) == {"seq": 700}
    finally:
        again.stop()


def test_planning_a_batch_of_many_lease_calls_waits_for_one_fsync_before_spark_gets_its_end(make_server, tmp_path):
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from pzq.clients import native as client
    from pzq.config import Limits
    from pzq.spark import LeaseStreamReader, Options

    # (nothing commits by the clock; a lease call stops after its first 100 messages: 1,000 are 10 calls)
    limits = Limits(lease_call_budget_s=1e-9, lease_chunk=100)
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", commit_interval=30.0, limits=limits)
    with ApiClient(srv.config.api_dsn, timeout_s=20) as api:
        produce(api, "planned", [b"p%d" % i for i in range(1000)])
        syncs = client.stats(srv.config.monitor_dsn)["syncs"]
        reader = LeaseStreamReader(Options(endpoint=srv.config.api_dsn, queue="planned"))
        try:
            assert reader.latestOffset({"seq": 0}, ReadMaxRows(1000)) == {"seq": 1000}
            # Its last call, from 0, was answered after the commit of all ten: one fsync, not one a call.
            assert client.stats(srv.config.monitor_dsn)["syncs"] == syncs + 1
        finally:
            reader.stop()


def test_the_spark_bench_reads_and_writes_every_row_and_its_rates_are_its_counts_over_its_seconds(spark):
    """`pzq bench --protocol spark`'s run, on this module's session (its JVM is warm: a session of its own
    cost the suite a JVM's start); tests/test_bench.py runs the command itself for the other protocols."""
    from pzq.bench.spark import SparkOptions, bench

    lines: list[str] = []
    result = bench(SparkOptions(messages=300, runs=1, batch=100), lines.append, session=spark)
    run = result["runs"][0]
    assert run["messages"] == 300 and run["produce"]["messages"] == 300
    for part in ("snapshot", "stream", "sink"):
        figures = run[part]
        assert figures["rows"] == 300, (part, run)
        assert figures["seconds"] > 0 and abs(figures["rows_s"] - 300 / figures["seconds"]) <= max(
            3, 0.01 * figures["rows_s"]
        )
    assert lines[0] == "300 messages of 100 B, local[2], maxMessagesPerBatch 100"
    assert spark.range(3).count() == 3  # the session the bench was handed is still running
