#!/usr/bin/env python3
"""Rows per second through the Spark connector on a local[2] session and a real pzq server.

    .venv/bin/python scripts/spark_rate.py [--messages 100000] [--runs 3] [--batch 20000]

Each run fills a fresh queue with N small messages (API PRODUCE, 1,000 per request), then times:
  stream read  a streaming query (format pzq -> noop sink) from start until all N rows are processed
               (leases, fetches, and the acknowledging commits of every batch but the last);
  snapshot     a batch read (spark.read.format("pzq") ... .count()) of the same N messages;
  sink         a DataFrame of N rows written into a queue (format pzq, durable before each task ends).
Spark start-up is not counted; the first run also pays for Spark's JIT warm-up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pzq.clients.api import ApiClient  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=20_000, help="maxMessagesPerBatch")
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="pzq-spark-rate-")
    endpoint = f"ipc://{workdir}/api"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            f"{workdir}/db",
            "--receive-dsn",
            f"ipc://{workdir}/r",
            "--send-dsn",
            f"ipc://{workdir}/s",
            "--monitor-dsn",
            f"ipc://{workdir}/m",
            "--api-dsn",
            endpoint,
            "--phpmq-dsn",
            "",
            "--emqp-frontend-dsn",
            "",
            "--emqp-backend-dsn",
            "",
            "--emqp-publish-dsn",
            "",
            "--mqks-dsn",
            "",
            "--log-level",
            "warning",
        ],
        start_new_session=True,
    )
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from pzq.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    n = args.messages
    body = b"x" * args.size
    try:
        with ApiClient(endpoint, timeout_s=60) as api:
            print(f"{n:,} messages of {args.size} B, local[2], maxMessagesPerBatch {args.batch:,}")
            print(
                f"{'run':>3} {'produce msg/s':>14} {'stream read rows/s':>19} {'snapshot rows/s':>16} "
                f"{'sink rows/s':>12}"
            )
            for run in range(1, args.runs + 1):
                queue = f"rate{run}"
                t0 = time.perf_counter()
                for i in range(0, n, 1000):
                    api.produce([(queue, body)] * min(1000, n - i))
                produce_rate = n / (time.perf_counter() - t0)

                t0 = time.perf_counter()
                count = spark.read.format("pzq").option("endpoint", endpoint).option("queue", queue).load().count()
                snapshot_rate = count / (time.perf_counter() - t0)

                t0 = time.perf_counter()
                query = (
                    spark.readStream.format("pzq")
                    .option("endpoint", endpoint)
                    .option("queue", queue)
                    .option("maxMessagesPerBatch", args.batch)
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", f"{workdir}/ck{run}")
                    .start()
                )
                query.processAllAvailable()
                read_rate = n / (time.perf_counter() - t0)
                rows = query.lastProgress["sources"][0] if query.lastProgress else {}
                query.stop()
                if api.offsets(queue, "spark")[1] != n:
                    raise SystemExit(f"the stream leased {api.offsets(queue, 'spark')[1]} of {n}: {rows}")

                df = spark.range(n).selectExpr(f"repeat('x', {args.size}) AS body").cache()
                df.count()
                t0 = time.perf_counter()
                df.write.format("pzq").option("endpoint", endpoint).option("queue", f"sink{run}").mode("append").save()
                sink_rate = n / (time.perf_counter() - t0)
                df.unpersist()
                if api.info(f"sink{run}")["depth"] != n:
                    raise SystemExit("the sink did not store every row")
                print(
                    f"{run:>3} {produce_rate:>14,.0f} {read_rate:>19,.0f} {snapshot_rate:>16,.0f} {sink_rate:>12,.0f}"
                )
    finally:
        spark.stop()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
