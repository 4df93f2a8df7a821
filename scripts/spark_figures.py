"""Every Spark figure of docs/performance.md in one run: streaming read, snapshot and sink rows/s, on local[2]
and on a standalone cluster (a master and two one-core workers started here from pyspark's launcher),
for 100,000 and 1,000,000 messages of 100 B.

    .venv/bin/python scripts/spark_figures.py [--counts 100000,1000000] [--runs 2] [--json spark-figures.json]

Each (master, count) pair is `pzq bench --protocol spark` (pzq/bench/spark.py) against a fresh server:
the medians of its runs are printed, after a warm-up run that is not counted. "stream read" is timed
from the query's start to processAllAvailable's return; "in batches" is the same rows over the
micro-batches' own time (Spark's triggerExecution). "CPU a row" is the CPU every process of the run
spent a row (on a shared machine the rates swing with the load; this much less).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # (runs from a checkout)

from pzq.bench import spark  # noqa: E402
from pzq.bench.report import medians  # noqa: E402
from pzq.bench.spark_cluster import StandaloneCluster  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="100000,1000000")
    parser.add_argument("--runs", type=int, default=2, help="per case, after one warm-up run that is not counted")
    parser.add_argument("--batch", type=int, default=None, help="maxMessagesPerBatch (default: the connector's)")
    parser.add_argument("--no-cluster", action="store_true", help="local[2] only")
    parser.add_argument("--json", default="spark-figures.json")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    rows: list[dict] = []

    def measure(master: str) -> None:
        for count in counts:
            result = spark.bench(spark.SparkOptions(count, args.runs + 1, args.batch, 100, (), master))
            counted = result["runs"][1:]  # (the first run pays for Spark's and the JIT's warm-up)
            ratios = [r["stream"]["rows_s"] / r["snapshot"]["rows_s"] for r in counted]  # (each against its own run)
            master_name = "local[2]" if master.startswith("local") else "standalone"
            rows.append({"master": master_name, "count": count, **medians(counted), "ratios": ratios})

    measure("local[2]")
    if not args.no_cluster:
        with tempfile.TemporaryDirectory() as tmp, StandaloneCluster(Path(tmp), workers=2, cores=1) as cluster:
            measure(cluster.url)
    print()
    print(
        f"{'master':<11} {'messages':>9} {'stream read':>12} {'in batches':>11} {'snapshot':>9} {'sink':>9} "
        f"{'read/snapshot':>14}  each run's"
    )
    for r in rows:
        stream, batches, snapshot, sink = (r[f"{k}.rows_s"] for k in ("stream", "stream_batches", "snapshot", "sink"))
        print(
            f"{r['master']:<11} {r['count']:>9,} {stream:>12,.0f} {batches:>11,.0f} {snapshot:>9,.0f} {sink:>9,.0f} "
            f"{stream / snapshot:>13.2f}x  " + " ".join(f"{x:.2f}x" for x in r["ratios"])
        )
    print("\nCPU a row (µs; every process: this one, Spark's JVM and workers, the server; and the server's):")
    heads = ("stream all", "server", "snapshot all", "server", "ratio")
    print(f"{'master':<11} {'messages':>9} " + " ".join(f"{h:>{len(h) + 1}}" for h in heads))
    for r in rows:
        cpu = [r.get(f"{k}.{c}", 0.0) for k in ("stream", "snapshot") for c in ("cpu_us", "server_cpu_us")]
        ratio = cpu[2] / cpu[0] if cpu[0] else 0.0  # (snapshot's CPU a row over the stream's: the rate ratio's ceiling)
        print(
            f"{r['master']:<11} {r['count']:>9,} {cpu[0]:>11.1f} {cpu[1]:>7.1f} {cpu[2]:>13.1f} {cpu[3]:>7.1f} "
            f"{ratio:>5.2f}x"
        )
    print("\nwhere the micro-batches' time went (ms, Spark's phases summed over the batches of the median run):")
    for r in rows:
        prefix = "stream_batches.phases_ms."  # (medians() flattened the dict into dotted keys)
        phases = {k.removeprefix(prefix): v for k, v in r.items() if k.startswith(prefix)}
        top = sorted(phases.items(), key=lambda kv: -kv[1])[:6]
        print(f"{r['master']:<11} {r['count']:>9,} " + "  ".join(f"{k} {v:,.0f}" for k, v in top))
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\nJSON written to {args.json} (rows/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
