#!/usr/bin/env python3
"""A Spark pipeline on pzq: JSON events from a queue, aggregated per key and event-time window with a
watermark, written to Parquet (and, if asked, the results as JSON messages into another queue).

An event is a JSON object ``{"key": "sensor-7", "ts": "2026-11-21T12:00:03Z", "value": 1.5}`` (``ts``
as ISO-8601 or epoch seconds). Messages that are not such an object are skipped. A window
is written once, when the watermark (the latest event time seen minus ``--watermark``) passes its end;
its row is ``window_start, window_end, key, events, total, mean`` under
``OUTPUT/query_id=Q/batch_id=N/`` (Q: the streaming query's id, kept in the checkpoint).

Each micro-batch overwrites its own ``batch_id=N`` directory and writes its results into the queue
under a dedup key of the query id (kept in the checkpoint) and the batch id, so a batch Spark runs again after a failure
replaces its files and stores no message twice: the output is exactly-once.

Locally (stops once the queue is drained, or runs on with --follow):
    .venv/bin/python scripts/spark_pipeline.py --queue events --output out/agg --checkpoint out/ck
On a cluster (pzq installed on every node, the API endpoint reachable from the executors):
    spark-submit --master spark://HOST:7077 scripts/spark_pipeline.py --endpoint tcp://QUEUE-HOST:11133 \\
        --queue events --output hdfs:///pzq/agg --checkpoint hdfs:///pzq/ck --follow
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pzq.spark import register  # noqa: E402 - after the path, so the script runs from a checkout

EVENT = StructType(
    [StructField("key", StringType()), StructField("ts", StringType()), StructField("value", DoubleType())]
)


def aggregate(events: DataFrame, *, window: str, watermark: str) -> DataFrame:
    """Messages read from pzq -> one row per (window, key) of valid events."""
    parsed = events.select(F.from_json(F.col("body").cast("string"), EVENT).alias("e")).select("e.*")
    # An ISO-8601 string or epoch seconds; try_ forms give NULL (a skipped event) where ANSI casts raise.
    ts = F.expr("coalesce(try_to_timestamp(ts), timestamp_seconds(try_cast(ts AS DOUBLE)))")
    valid = parsed.withColumn("ts", ts).where(
        F.col("key").isNotNull() & F.col("ts").isNotNull() & F.col("value").isNotNull()
    )
    return (
        valid.withWatermark("ts", watermark)
        .groupBy(F.window("ts", window), "key")
        .agg(F.count(F.lit(1)).alias("events"), F.sum("value").alias("total"), F.avg("value").alias("mean"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "key",
            "events",
            "total",
            "mean",
        )
    )


def start(
    spark: SparkSession,
    *,
    endpoint: str,
    queue: str,
    group: str,
    output: str,
    checkpoint: str,
    window: str = "1 minute",
    watermark: str = "30 seconds",
    results_queue: str | None = None,
    name: str = "pzq-pipeline",
    max_per_batch: int = 10_000,
    cluster: str = "",
    partitions: int = 0,
):
    """Start the pipeline's streaming query and return it. With ``cluster`` (a shard list file, read on
    the driver) the events are every shard's partitions of ``queue``, and the results go to theirs."""
    register(spark)
    shards = {"cluster": cluster} if cluster else {}
    if partitions:
        shards["queuePartitions"] = str(partitions)
    events = (
        spark.readStream.format("pzq")
        .option("endpoint", endpoint)
        .option("queue", queue)
        .option("group", group)
        .option("maxMessagesPerBatch", max_per_batch)
        .options(**shards)
        .load()
    )

    def write_batch(rows: DataFrame, batch_id: int) -> None:
        # The query id lives in the checkpoint: a re-run batch has the same one, a new checkpoint not.
        query_id = rows.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId") or name
        # A re-run batch is deduplicated chunk by chunk, and a chunk's digest covers its rows in order:
        # the same rows per partition (hash-partitioned by key) must also come out in the same order.
        rows = rows.sortWithinPartitions("window_start", "key").persist()
        try:
            rows.write.mode("overwrite").parquet(f"{output}/query_id={query_id}/batch_id={batch_id}")
            if results_queue:
                (
                    rows.select(F.to_json(F.struct(*rows.columns)).alias("body"))
                    .write.format("pzq")
                    .option("endpoint", endpoint)
                    .option("queue", results_queue)
                    .option("dedupKey", f"{query_id}:{batch_id}")
                    .options(**{k: v for k, v in shards.items() if k == "cluster"})
                    .mode("append")
                    .save()
                )
        finally:
            rows.unpersist()

    return (
        aggregate(events, window=window, watermark=watermark)
        .writeStream.outputMode("append")
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .foreachBatch(write_batch)
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:11133", help="pzq API endpoint")
    parser.add_argument("--queue", default="events")
    parser.add_argument("--group", default="pzq-pipeline", help="consumer group (one per pipeline)")
    parser.add_argument("--output", required=True, help="Parquet directory")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    parser.add_argument("--window", default="1 minute")
    parser.add_argument("--watermark", default="30 seconds")
    parser.add_argument("--results-queue", default=None, help="also send each result row as JSON here")
    parser.add_argument("--master", default=None, help="e.g. local[2]; spark-submit's --master otherwise")
    parser.add_argument("--follow", action="store_true", help="keep running (else stop once drained)")
    parser.add_argument("--cluster", default="", help="shard list file: read and write every shard's partitions")
    parser.add_argument("--partitions", type=int, default=0, help="the queue's partitions (servers without WHERE)")
    args = parser.parse_args(argv)
    builder = SparkSession.builder.appName("pzq-pipeline")
    if args.master:
        builder = builder.master(args.master)
    if (args.master or "").startswith("local"):  # Python workers run here: this interpreter has pzq
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    query = start(
        spark,
        endpoint=args.endpoint,
        queue=args.queue,
        group=args.group,
        output=args.output,
        checkpoint=args.checkpoint,
        window=args.window,
        watermark=args.watermark,
        results_queue=args.results_queue,
        cluster=args.cluster,
        partitions=args.partitions,
    )
    try:
        if args.follow:
            query.awaitTermination()
        else:
            query.processAllAvailable()
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
