"""`pzq bench --protocol spark`: rows per second through the Spark connector on a local[2] session and
a real pzq server.

Each run fills a fresh queue with N small messages (API PRODUCE, 1,000 per request), then times:
  snapshot     a batch read (spark.read.format("pzq") ... .count()) of the N messages;
  stream read  a streaming query (format pzq -> noop sink) from start until all N rows are processed
               (leases, fetches, and the acknowledging commits of every batch but the last);
  sink         a DataFrame of N rows written into a queue (format pzq, durable before each task ends).
Spark start-up is not counted; the first run also pays for Spark's JIT warm-up. Beside each rate, the
CPU it cost (µs a row): the server's, and every process's (this one, Spark's JVM and Python workers, the
server): on a shared machine the rates swing with the load, the CPU a row much less.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pzq.bench.report import machine, medians
from pzq.bench.server import PzqServer
from pzq.clients.api import ApiClient
from pzq.errors import PzqError

PRODUCE_BATCH = 1000  # messages per API PRODUCE


@dataclasses.dataclass(frozen=True)
class SparkOptions:
    messages: int = 100_000
    runs: int = 3
    batch: int | None = None  # maxMessagesPerBatch (None: the connector's default)
    size: int = 100  # body bytes
    server_args: tuple[str, ...] = ()
    master: str = "local[2]"  # or spark://HOST:PORT (a standalone cluster: the API is then on TCP)


def _timed(count: int, seconds: float, unit: str, rate: str, cpu: tuple[float, float] | None = None) -> dict:
    out = {unit: count, "seconds": round(seconds, 6), rate: round(count / seconds)}
    if cpu is not None:  # (server, all processes: CPU seconds over the phase) -> µs a row
        out["server_cpu_us"], out["cpu_us"] = (round(c / count * 1e6, 2) for c in cpu)
    return out


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live process below it (Spark's JVM and its
    Python workers, the server), with what their reaped children used, from /proc."""
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, CPU seconds)
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # (gone meanwhile)
        stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
    total = 0.0
    for pid, (_, cpu) in stats.items():
        at, seen = pid, 0
        while at and at != root and at in stats and seen < 64:  # (up the parents: is root one of them?)
            at, seen = stats[at][0], seen + 1
        if at == root:
            total += cpu
    return total


class _Cpu:
    """CPU seconds of the server and of every process since ``start``."""

    def __init__(self, server: PzqServer):
        self.server = server
        self.start()

    def start(self) -> None:
        self.at = (self.server.cpu_seconds(), tree_cpu_seconds(os.getpid()))

    def spent(self) -> tuple[float, float]:
        return self.server.cpu_seconds() - self.at[0], tree_cpu_seconds(os.getpid()) - self.at[1]


def one_run(
    spark, api: ApiClient, endpoint: str, run: int, options: SparkOptions, checkpoints: str, server: PzqServer
) -> dict:
    n, queue = options.messages, f"rate{run}"
    body = b"x" * options.size
    t0 = time.perf_counter()
    for i in range(0, n, PRODUCE_BATCH):
        api.produce([(queue, body)] * min(PRODUCE_BATCH, n - i))
    produce = _timed(n, time.perf_counter() - t0, "messages", "msg_s")

    cpu = _Cpu(server)
    t0 = time.perf_counter()
    count = spark.read.format("pzq").option("endpoint", endpoint).option("queue", queue).load().count()
    snapshot = _timed(count, time.perf_counter() - t0, "rows", "rows_s", cpu.spent())

    cpu.start()
    t0 = time.perf_counter()
    reader = spark.readStream.format("pzq").option("endpoint", endpoint).option("queue", queue)
    if options.batch is not None:
        reader = reader.option("maxMessagesPerBatch", options.batch)
    query = reader.load().writeStream.format("noop").option("checkpointLocation", f"{checkpoints}/ck{run}").start()
    query.processAllAvailable()
    seconds = time.perf_counter() - t0
    spent = cpu.spent()
    progress = query.lastProgress["sources"][0] if query.lastProgress else {}
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    in_batches = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    query.stop()
    leased = api.offsets(queue, "spark")[1]
    if leased != n:
        raise PzqError(f"spark: the stream leased {leased} of {n}: {progress}")
    stream = _timed(leased, seconds, "rows", "rows_s", spent)
    # The same rows over the micro-batches' own time (Spark's triggerExecution), without the query's
    # start (its Python source worker, the checkpoint) and the idle poll that ends processAllAvailable.
    stream_batches = {**_timed(leased, in_batches, "rows", "rows_s"), "batches": len(batches)}
    # Where the batches' time went (Spark's own phases, summed; ms): latestOffset is the planning (the
    # leases), addBatch the reading (the fetches), walCommit and commitOffsets Spark's checkpoint.
    phases: dict[str, int] = {}
    for p in batches:
        for phase, ms in p["durationMs"].items():
            if phase != "triggerExecution":
                phases[phase] = phases.get(phase, 0) + ms
    stream_batches["phases_ms"] = phases

    df = spark.range(n).selectExpr(f"repeat('x', {options.size}) AS body").cache()
    df.count()
    t0 = time.perf_counter()
    df.write.format("pzq").option("endpoint", endpoint).option("queue", f"sink{run}").mode("append").save()
    seconds = time.perf_counter() - t0
    df.unpersist()
    stored = api.info(f"sink{run}")["depth"]
    if stored != n:
        raise PzqError(f"spark: the sink stored {stored} of {n} rows")
    sink = _timed(stored, seconds, "rows", "rows_s")
    return {
        "messages": n,
        "produce": produce,
        "stream": stream,
        "stream_batches": stream_batches,
        "snapshot": snapshot,
        "sink": sink,
    }


def this_pzq_first(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for the bench's child processes: this pzq's tree first on their path, and not their
    working directory. Spark's Python processes and the server run ``python -m``, which puts the working
    directory first: run from another pzq checkout, they measured that checkout's connector and server."""
    root = str(Path(__file__).resolve().parent.parent.parent)
    path = [root, *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)]
    return {**environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(path)}


@contextlib.contextmanager
def _children_run_this_pzq() -> Iterator[None]:
    """``this_pzq_first`` in this process's environment (what the server and Spark's JVM inherit) while
    the bench runs; as it was after."""
    before = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "PYTHONPATH")}
    os.environ.update(this_pzq_first(os.environ))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def bench(options: SparkOptions, echo: Callable[[str], None] = print, session: Any = None) -> dict:
    """A local[2] session and one server for every run; a row per run as it ends. ``session``: a running
    SparkSession to use and leave running (the tests' own, whose JVM is already warm), instead of one of
    ``options.master`` started and stopped here."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from pzq.spark import Options, register

    runs = []
    local = options.master.startswith("local")
    api_transport = "ipc" if local else "tcp"  # (executors of a cluster reach the server over TCP)
    server = PzqServer(gateways=("api",), transport="ipc", api_transport=api_transport, args=options.server_args)
    with _children_run_this_pzq(), server:
        builder = SparkSession.builder.master(options.master).config("spark.ui.enabled", "false")
        if not local:  # every executor runs this interpreter, which has pzq installed
            builder = builder.config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        spark = session or builder.config("spark.sql.shuffle.partitions", "2").getOrCreate()
        try:
            spark.sparkContext.setLogLevel("ERROR")
            register(spark)
            with ApiClient(server.api, timeout_s=60) as api:
                n, size, batch = options.messages, options.size, options.batch
                which = f"{batch:,}" if batch is not None else f"{Options.max_per_batch:,} (the connector's default)"
                echo(f"{n:,} messages of {size} B, {options.master}, maxMessagesPerBatch {which}")
                echo(
                    f"{'run':>3} {'produce msg/s':>14} {'stream read rows/s':>19} {'in batches':>11} "
                    f"{'snapshot rows/s':>16} {'sink rows/s':>12} {'read/snapshot':>14} {'batches':>8}"
                )
                for run in range(1, options.runs + 1):
                    r = one_run(spark, api, server.api, run, options, server.workdir, server)
                    runs.append(r)
                    echo(  # (the stream against the snapshot of the same run: the machine's load moves both)
                        f"{run:>3} {r['produce']['msg_s']:>14,.0f} {r['stream']['rows_s']:>19,.0f} "
                        f"{r['stream_batches']['rows_s']:>11,.0f} {r['snapshot']['rows_s']:>16,.0f} "
                        f"{r['sink']['rows_s']:>12,.0f} {r['stream']['rows_s'] / r['snapshot']['rows_s']:>13.2f}x "
                        f"{r['stream_batches']['batches']:>8}"
                    )
        finally:
            if session is None:
                spark.stop()
    return {"machine": machine(), "options": dataclasses.asdict(options), "runs": runs, "median": medians(runs)}
