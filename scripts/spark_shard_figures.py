#!/usr/bin/env python3
"""Spark's streaming read of one partitioned queue on one shard and across N shards: rows a second from
the query's start to processAllAvailable's return, the same messages and partitions each way.

    .venv/bin/python scripts/spark_shard_figures.py [--shards 1,3] [--partitions 6] [--count 300000] [--runs 2]

Each shard is a `pzq serve --shard sI --cluster LIST` subprocess on its own store in a temporary
directory (API on a free loopback port); the queue is made with `pzq queue create --partitions K` and
filled through each partition's shard's API; the query reads it with `.option("cluster", LIST)` on a
local[2] session into the noop sink. On a machine of 2 cores Spark and the shards share them: the
figure shows what the streams cost, not what more cores would give (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # (runs from a checkout)

from pzq.clients import native  # noqa: E402
from pzq.clients.api import ApiClient  # noqa: E402
from pzq.errors import ClientError  # noqa: E402
from pzq.shards import load  # noqa: E402


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_shards(root: Path, n: int) -> tuple[Path, list[subprocess.Popen]]:
    """``n`` shards s0..s(n-1) and their list root/shards.toml, each answering its monitor."""
    listed = root / "shards.toml"
    names = [f"s{i}" for i in range(n)]
    listed.write_text(
        "\n".join(
            f'[[shard]]\nname = "{name}"\napi_dsn = "tcp://127.0.0.1:{_port()}"\nmonitor_dsn = "ipc://{root}/{name}.mon"\n'
            for name in names
        )
    )
    procs = []
    for shard in load(str(listed)).shards:
        argv = [sys.executable, "-m", "pzq", "serve", "--shard", shard.name, "--cluster", str(listed)]
        argv += ["--database", str(root / shard.name), "--api-dsn", shard.api_dsn, "--monitor-dsn", shard.monitor_dsn]
        argv += ["--disk-reserve", "0"]
        argv += [x for p in ("receive", "send", "consume") for x in (f"--{p}-dsn", f"ipc://{root}/{shard.name}.{p}")]
        argv += [
            x for g in ("phpmq", "mqks", "emqp-frontend", "emqp-backend", "emqp-publish") for x in (f"--{g}-dsn", "")
        ]
        log = open(root / f"{shard.name}.log", "ab")  # noqa: SIM115 - the child's, for its life
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while True:
            try:
                native.monitor_request(shard.monitor_dsn, timeout_s=0.5)
                break
            except ClientError:
                if time.monotonic() > deadline or procs[-1].poll() is not None:
                    said = (root / f"{shard.name}.log").read_text()[-2000:]
                    raise SystemExit(f"shard {shard.name} did not start: {said}") from None
    return listed, procs


def fill(listed: Path, queue: str, partitions: int, count: int) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pzq",
            "queue",
            "create",
            queue,
            "--partitions",
            str(partitions),
            "--cluster",
            str(listed),
        ],
        check=True,
        capture_output=True,
    )
    places = load(str(listed)).place(queue, partitions)
    clients = {shard.name: ApiClient(shard.api_dsn, timeout_s=60) for _, shard in places}
    body = b"x" * 100
    try:
        for at in range(0, count, 1000 * len(places)):
            for i, (name, shard) in enumerate(places):
                n = min(1000, max(0, count - at - i * 1000))
                if n:
                    clients[shard.name].produce([(name, body)] * n)
    finally:
        for api in clients.values():
            api.close()


def read(spark, listed: Path, queue: str, batch: int | None) -> tuple[int, float]:
    """(rows, seconds) of a streaming query reading ``queue`` whole from its start."""
    reader = spark.readStream.format("pzq").option("cluster", str(listed)).option("queue", queue)
    if batch:
        reader = reader.option("maxMessagesPerBatch", batch)
    with tempfile.TemporaryDirectory() as checkpoint:
        started = time.monotonic()
        query = reader.load().writeStream.format("noop").option("checkpointLocation", checkpoint).start()
        try:
            query.processAllAvailable()
            took = time.monotonic() - started
            rows = sum(p["numInputRows"] for p in query.recentProgress)
        finally:
            query.stop()
    return rows, took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default="1,3", help="shard counts to measure, in this order")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=2, help="after one warm-up run that is not counted")
    parser.add_argument("--batch", type=int, default=None, help="maxMessagesPerBatch (default: the connector's)")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from pzq.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    figures = {}
    try:
        for n in [int(x) for x in args.shards.split(",")]:
            with tempfile.TemporaryDirectory(prefix="pzq-shards-") as tmp:
                listed, procs = start_shards(Path(tmp), n)
                try:
                    rates = []
                    for run in range(args.runs + 1):
                        queue = f"figures{run}"
                        fill(listed, queue, args.partitions, args.count)
                        rows, took = read(spark, listed, queue, args.batch)
                        if rows != args.count:
                            raise SystemExit(f"{n} shard(s), run {run}: read {rows} rows of {args.count}")
                        print(f"{n} shard(s), run {run}{' (warm-up)' if run == 0 else ''}: {rows / took:,.0f} rows/s")
                        rates += [rows / took] if run else []
                    figures[n] = rates
                finally:
                    for proc in procs:
                        proc.terminate()
                    for proc in procs:
                        proc.wait(timeout=30)
    finally:
        spark.stop()
    print(f"\n{args.count:,} messages of 100 B in {args.partitions} partitions, local[2], medians of {args.runs} runs:")
    for n, rates in figures.items():
        print(f"  {n} shard(s): {statistics.median(rates):>9,.0f} rows/s  ({', '.join(f'{r:,.0f}' for r in rates)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
