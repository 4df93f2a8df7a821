"""The Spark pipeline (scripts/spark_pipeline.py) submitted to a real Spark standalone cluster on this
machine: a master and two one-core workers started with pyspark's own ``bin/spark-class``, the
pipeline sent with ``bin/spark-submit``, a real pzq server in a subprocess with its API on loopback TCP.

The second test kills the driver (SIGKILL to its whole process group) in the middle of a batch three
times - while the batch reads its events, once it has written its Parquet, once it has stored part of its
results - and restarts it on the same checkpoint each time: the Parquet output and the results queue
must each end with every expected aggregate exactly once. Run with ``-s`` to see the transcript.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from pzq.bench.spark_cluster import StandaloneCluster, stop_group
from pzq.clients.api import ApiClient
from pzq.errors import PzqError

from conftest import free_tcp_endpoint, wait_until
from shard_servers import Shards

pyspark = pytest.importorskip("pyspark")
pa_dataset = pytest.importorskip("pyarrow.dataset")

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "scripts" / "spark_pipeline.py"
SPARK_HOME = Path(pyspark.__file__).resolve().parent  # pyspark's wheel carries bin/, jars/ and the launcher
NOON = 1795262400  # 2026-11-21T12:00:00Z, epoch seconds
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
# Two state partitions (Spark's default 200 make a small run last over a minute on two cores), UTC.
SUBMIT_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.executor.memory": "512m",
    # Each run starts a driver and its executors: 11 short-lived JVMs in this module, whose startup
    # (class loading, the C2 compiler's threads) was most of its time on two cores. C1 only and the
    # serial collector start faster and take less CPU from each other; the batches here are small.
    "spark.driver.extraJavaOptions": JVM_OPTIONS,
    "spark.executor.extraJavaOptions": JVM_OPTIONS,
}


# -- the cluster --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Cluster:
    """A running standalone master and its workers; ``url`` is what spark-submit's --master takes."""

    root: Path
    env: dict[str, str]
    url: str
    webui: int
    work_dirs: list[Path]

    def state(self) -> dict:
        """The master's JSON (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui}/json/", timeout=5) as reply:
            return json.loads(reply.read())

    def submit(self, log: Path, *args: str, conf: dict[str, str] | None = None) -> subprocess.Popen:
        """``spark-submit --master URL scripts/spark_pipeline.py ARGS`` in its own process group."""
        argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.url]
        for name, value in {**SUBMIT_CONF, **(conf or {})}.items():
            argv += ["--conf", f"{name}={value}"]
        argv += [str(PIPELINE), *args]
        with open(log, "ab") as out:
            return subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env, cwd=self.root
            )

    def executor_logs(self, app_id: str) -> dict[Path, Path]:
        """work dir of each worker -> the stderr of the executor it ran for ``app_id`` (if any)."""
        found = {}
        for work in self.work_dirs:
            logs = sorted((work / app_id).glob("*/stderr"))
            if logs:
                found[work] = logs[0]
        return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A standalone master and two workers (one core, 1 GiB each), stopped after the module."""
    root = tmp_path_factory.mktemp("spark-cluster")
    try:
        with StandaloneCluster(root, workers=2, cores=1, memory="1g") as running:
            yield Cluster(root, running.env, running.url, running.webui, running.work_dirs)
    except PzqError as exc:
        pytest.fail(str(exc))


# -- pzq, events and results --------------------------------------------------------------------------


def start_api_server(process_server):
    """A subprocess server with its API on a free loopback TCP port; .api is a client, .endpoint its address."""
    for attempt in range(3):
        endpoint, _ = free_tcp_endpoint()
        try:
            srv = process_server("--api-dsn", endpoint)
        except RuntimeError as exc:  # the free port was taken before the server bound it: choose again
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
            continue
        srv.endpoint = endpoint
        srv.api = ApiClient(endpoint, timeout_s=30)
        return srv
    raise AssertionError("unreachable")


def window_events(minute: int, keys: str, per_key: int) -> list[dict]:
    """``per_key`` events of each key inside the one-minute window 12:MM, timestamps both ways."""
    events = []
    for key in keys:
        for i in range(per_key):
            second = NOON + minute * 60 + (i * 59) // per_key
            ts = (
                second
                if i % 2
                else datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            )
            events.append({"key": key, "ts": ts, "value": float(i % 7 + ord(key) % 5)})
    return events


def tick(minute: int) -> dict:
    """An event that moves the watermark to 12:MM minus 30 s, closing the windows before it."""
    return {"key": "tick", "ts": NOON + minute * 60, "value": 0.0}


def expected(events: list[dict], *, closed_before_minute: int) -> list[tuple]:
    """(window minute, key, events, total) of every window that ends before 12:MM - 30 s, sorted."""
    windows: dict[tuple[int, str], list[float]] = {}
    for e in events:
        ts = e["ts"] if isinstance(e["ts"], int) else datetime.datetime.fromisoformat(e["ts"]).timestamp()
        windows.setdefault(((int(ts) - NOON) // 60, e["key"]), []).append(e["value"])
    return sorted((m, k, len(v), sum(v)) for (m, k), v in windows.items() if m + 1 < closed_before_minute)


def produce(api: ApiClient, queue: str, bodies: list[bytes]) -> None:
    for i in range(0, len(bodies), 1000):
        api.produce([(queue, b) for b in bodies[i : i + 1000]])


def minute_of(ts) -> int:
    if isinstance(ts, str):
        ts = datetime.datetime.fromisoformat(ts)
    if ts.tzinfo is None:  # Parquet INT96 reads as naive UTC
        ts = ts.replace(tzinfo=datetime.UTC)
    return (int(ts.timestamp()) - NOON) // 60


def parquet_rows(output: Path) -> list[tuple] | None:
    """(window minute, key, events, total, batch_id) of every Parquet row under ``output``; None while
    Spark is replacing files (a read that races a batch's overwrite)."""
    if not output.exists():
        return []
    try:
        table = pa_dataset.dataset(output, format="parquet", partitioning="hive").to_table()
    except (OSError, ValueError):  # (pyarrow's errors derive from these)
        return None
    return sorted(
        (minute_of(r["window_start"]), r["key"], r["events"], r["total"], r["batch_id"]) for r in table.to_pylist()
    )


def queue_bodies(api: ApiClient, queue: str) -> list[bytes]:
    """Every message ``queue`` stores, read without consuming (SNAPSHOT)."""
    info = api.info(queue)
    if info["depth"] == 0:
        return []
    bodies, after = [], info["first"]
    while after < info["next"]:
        messages, after = api.snapshot(queue, after, info["next"], 1000)
        bodies += [bytes(m[4]) for m in messages]
    return bodies


def queue_results(api: ApiClient, queue: str) -> list[tuple]:
    rows = [json.loads(b) for b in queue_bodies(api, queue)]
    return sorted((minute_of(r["window_start"]), r["key"], r["events"], r["total"]) for r in rows)


# -- the checkpoint -----------------------------------------------------------------------------------


def batch_ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()) if directory.exists() else []


def offsets_entry(checkpoint: Path, batch: int) -> tuple[int, int]:
    """(watermark ms, the source's end seq) that the checkpoint's offset log holds for ``batch``."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return json.loads(lines[1])["batchWatermarkMs"], json.loads(lines[2])["seq"]


def in_flight(checkpoint: Path) -> list[int]:
    """Batches planned (in the offset log) but not committed."""
    return sorted(set(batch_ids(checkpoint / "offsets")) - set(batch_ids(checkpoint / "commits")))


def clock(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%H:%M:%S")


def batches_run(log: Path) -> list[int]:
    """Batch ids whose tasks a driver ran (Spark tags its task log lines with them)."""
    return sorted({int(b) for b in re.findall(r"\[batchId = (\d+)\]", log.read_text(errors="replace"))})


class TaskLog:
    """The batch ids a driver has started tasks for so far, read from its log as it grows."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.partial = b""
        self.started: set[int] = set()

    def batches_started(self) -> set[int]:
        if self.path.exists():
            with open(self.path, "rb") as log:
                log.seek(self.pos)
                chunk = log.read()
            self.pos += len(chunk)
            *lines, self.partial = (self.partial + chunk).split(b"\n")
            for line in lines:
                match = re.search(rb"\[batchId = (\d+)\] Starting task", line)
                if match:
                    self.started.add(int(match[1]))
        return self.started


def app_id(log: Path) -> str:
    match = re.search(r"app-\d{14}-\d{4}", log.read_text(errors="replace"))
    assert match, f"no application id in {log}"
    return match[0]


# -- the tests ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_pipeline_submitted_to_a_standalone_cluster_writes_exactly_the_expected_aggregates(
    cluster, process_server, tmp_path
):
    srv = start_api_server(process_server)
    events = window_events(0, "ab", 12) + window_events(1, "ab", 12) + [tick(10)]
    bodies = [json.dumps(e).encode() for e in events] + [b"not json", b'{"key": "a"}', b'{"key": "a", "ts": "x"}']
    produce(srv.api, "events", bodies)
    output, checkpoint, log = tmp_path / "agg", tmp_path / "ck", tmp_path / "submit.log"
    started = time.monotonic()
    driver = cluster.submit(
        log,
        "--endpoint",
        srv.endpoint,
        "--queue",
        "events",
        "--output",
        str(output),
        "--checkpoint",
        str(checkpoint),
        "--results-queue",
        "results",
    )
    try:
        returncode = driver.wait(timeout=180)
    finally:
        stop_group(driver, signal.SIGKILL)
    assert returncode == 0, log.read_text(errors="replace")[-5000:]
    took = time.monotonic() - started

    want = expected(events, closed_before_minute=10)
    assert [(m, k) for m, k, _, _ in want] == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert [row[:4] for row in parquet_rows(output)] == want
    assert queue_results(srv.api, "results") == want
    assert offsets_entry(checkpoint, batch_ids(checkpoint / "offsets")[-1])[1] == len(bodies)  # every message read
    wait_until(lambda: srv.api.info("events")["depth"] == 0, timeout_s=10)  # and acknowledged

    # It ran on the cluster: the master lists the application as finished, and each worker ran an
    # executor of it that ran tasks.
    app = app_id(log)
    completed = wait_until(lambda: {a["id"]: a for a in cluster.state()["completedapps"] if a["id"] == app}, 10)
    assert completed[app]["state"] == "FINISHED" and completed[app]["name"] == "pzq-pipeline"
    executors = cluster.executor_logs(app)
    assert set(executors) == set(cluster.work_dirs)
    assert sum(len(re.findall(r"Running task", p.read_text(errors="replace"))) for p in executors.values()) > 0
    print(f"\ncluster run: application {app} on {len(executors)} workers, {took:.1f} s from submit to exit")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_killing_the_driver_mid_batch_and_restarting_it_leaves_every_result_exactly_once_in_parquet_and_queue(
    cluster, process_server, tmp_path
):
    srv = start_api_server(process_server)
    api = srv.api
    output, checkpoint = tmp_path / "agg", tmp_path / "ck"
    args = ["--endpoint", srv.endpoint, "--queue", "events", "--output", str(output)]
    args += ["--checkpoint", str(checkpoint), "--results-queue", "results", "--follow"]
    transcript: list[str] = []
    phases = [  # each phase's tick closes the windows of the phase before it
        window_events(0, "abc", 50) + window_events(1, "abc", 50) + [tick(5)],
        window_events(5, "abc", 50) + window_events(6, "abc", 50) + [tick(10)],
        window_events(10, "abc", 50) + window_events(11, "abc", 50) + [tick(20)],
    ]
    produced: list[dict] = []
    drivers: list[tuple[subprocess.Popen, Path, float]] = []  # (spark-submit, its log, when started)

    def send(phase: int) -> None:
        produced.extend(phases[phase])
        produce(api, "events", [json.dumps(e).encode() for e in phases[phase]])

    def start_driver() -> None:
        # One executor a run (the first test shows both workers running one): four drivers with two
        # executors each were 12 JVMs starting on two cores; exactly once does not hang on how many
        # executors read the batch that was killed.
        log = tmp_path / f"driver-{len(drivers) + 1}.log"
        drivers.append((cluster.submit(log, *args, conf={"spark.cores.max": "1"}), log, time.time()))

    def query_id() -> str:
        return json.loads((checkpoint / "metadata").read_text())["id"]

    def state() -> str:
        rows = parquet_rows(output)
        return (
            f"offsets {batch_ids(checkpoint / 'offsets')}, commits {batch_ids(checkpoint / 'commits')}, "
            f"Parquet rows {'?' if rows is None else len(rows)}, results queue {api.info('results')['depth']}"
        )

    def drained(closed_before_minute: int) -> bool:
        """All produced events read and committed, and the windows they close written."""
        ids = batch_ids(checkpoint / "offsets")
        if not ids or in_flight(checkpoint) or offsets_entry(checkpoint, ids[-1])[1] < len(produced):
            return False
        rows = parquet_rows(output)
        want = expected(produced, closed_before_minute=closed_before_minute)
        return rows is not None and {r[:2] for r in rows} >= {w[:2] for w in want}

    def closing_batch(first: int) -> int | None:
        """The first batch from ``first`` on whose watermark is raised: it writes the windows it closes."""
        for n in batch_ids(checkpoint / "offsets"):
            if n >= max(first, 1) and offsets_entry(checkpoint, n)[0] > offsets_entry(checkpoint, n - 1)[0]:
                return n
        return None

    def kill_when(moment, why: str) -> int:
        """Wait for ``moment()`` -> (batch, note) and SIGKILL the driver's process group at once."""
        driver, log, _ = drivers[-1]
        batch, note = wait_until(moment, timeout_s=150, interval_s=0.005)
        stop_group(driver, signal.SIGKILL)
        transcript.append(
            f"run {len(drivers)}: SIGKILL with batch {batch} in flight, {why}: {note}; "
            f"batches it ran tasks for: {batches_run(log)}; after the kill: {state()}"
        )
        return batch

    started = time.monotonic()
    try:
        # Run 1: phase 0 read and its windows written; then phase 1 sent, and the driver killed while
        # the batch reading it (a data batch: it closes no window yet) runs its tasks.
        send(0)
        start_driver()
        wait_until(lambda: drained(5), timeout_s=150, interval_s=0.2)
        transcript.append(f"run 1: caught up: {state()}")
        send(1)
        tasks = TaskLog(drivers[-1][1])

        def reading():
            n = next((n for n in in_flight(checkpoint) if n in tasks.batches_started()), None)
            return None if n is None else (n, "its tasks started")

        killed = kill_when(reading, "reading phase 1's events")

        # Run 2 on the same checkpoint re-runs that batch, then runs the one whose raised watermark closes
        # phase 1's windows: killed once that one's Parquet is written, before its results are stored.
        start_driver()
        depth = api.info("results")["depth"]

        def parquet_written():
            n = closing_batch(killed)
            if n is None:
                return None
            if n in batch_ids(checkpoint / "commits"):
                return n, "MISSED: already committed"
            done = output / f"query_id={query_id()}" / f"batch_id={n}" / "_SUCCESS"
            if done.exists() and done.stat().st_mtime >= drivers[-1][2]:
                before, after = offsets_entry(checkpoint, n - 1)[0], offsets_entry(checkpoint, n)[0]
                stored = api.info("results")["depth"] - depth
                return n, f"watermark {clock(before)} -> {clock(after)}, Parquet written, {stored} results stored"
            return None

        killed = kill_when(parquet_written, "writing the windows it closes")

        # Run 3 re-runs it again: killed once its results are (partly) in the queue, before its commit.
        start_driver()

        def results_stored():
            n = closing_batch(killed)
            if n is None:
                return None
            if n in batch_ids(checkpoint / "commits"):
                return n, "MISSED: already committed"
            stored = api.info("results")["depth"] - depth
            return (n, f"{stored} of its results stored, not committed") if stored > 0 else None

        kill_when(results_stored, "storing its results")

        # Run 4 re-runs it a third time, reads phase 2 as it comes, and is stopped once drained.
        start_driver()
        wait_until(lambda: drained(10), timeout_s=150, interval_s=0.2)
        transcript.append(f"run 4: caught up: {state()}")
        send(2)
        wait_until(lambda: drained(20), timeout_s=90, interval_s=0.2)
        stop_group(drivers[-1][0], signal.SIGTERM, timeout_s=30)
        transcript.append(
            f"run 4: phase 2 read, stopped (SIGTERM); batches it ran tasks for: {batches_run(drivers[-1][1])}"
        )
    finally:
        for driver, _, _ in drivers:
            stop_group(driver, signal.SIGKILL)

    want = expected(produced, closed_before_minute=20)
    assert len(want) == 20  # 3 keys x 6 windows, and the ticks of minutes 5 and 10
    rows = parquet_rows(output)
    results = queue_results(api, "results")
    last = batch_ids(checkpoint / "offsets")[-1]
    apps = {a["id"]: a["state"] for a in cluster.state()["completedapps"]}
    transcript.append(
        f"end: {state()}; last batch {last} ends at lease seq {offsets_entry(checkpoint, last)[1]} of "
        f"{len(produced)} events; Parquet {len(rows)} rows ({len({r[:2] for r in rows})} distinct windows), "
        f"results queue {len(results)} ({len(set(results))} distinct), expected {len(want)}; "
        f"applications {[(app_id(log), apps.get(app_id(log))) for _, log, _ in drivers]}; "
        f"{time.monotonic() - started:.0f} s"
    )
    print("\n" + "\n".join(transcript))
    assert [r[:4] for r in rows] == want  # each window once, with its full count and total
    assert len({r[:2] for r in rows}) == len(rows)
    assert results == want
    assert offsets_entry(checkpoint, last)[1] == len(produced)  # every event read
    wait_until(lambda: api.info("events")["depth"] == 0, timeout_s=10)  # and acknowledged
    assert [p.name for p in output.iterdir()] == [f"query_id={query_id()}"]  # one query throughout
    assert len(drivers) == 4 and all(len(batches_run(log)) > 0 for _, log, _ in drivers)  # each ran batches


# -- across shards ------------------------------------------------------------------------------------


def streams_read(checkpoint: Path, batch: int) -> dict[str, int]:
    """The source's end offset of each stream (``shard/queue``) that the checkpoint holds for ``batch``."""
    return json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[2])["streams"]


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_shard_sigkilled_while_the_cluster_reads_a_batch_and_restarted_leaves_every_result_exactly_once(
    cluster, tmp_path
):
    (tmp_path / "shards").mkdir()
    shards = Shards(tmp_path / "shards")
    output, checkpoint = tmp_path / "agg", tmp_path / "ck"
    shards.create("events", 3)  # (pzq queue create events --partitions 3 --cluster LIST)
    args = ["--endpoint", shards.servers["a"].endpoint, "--cluster", str(shards.path)]
    args += ["--queue", "events", "--output", str(output), "--checkpoint", str(checkpoint)]
    args += ["--results-queue", "results", "--follow"]
    phases = [  # each phase's tick closes the windows of the phase before it
        window_events(0, "abc", 100) + window_events(1, "abc", 100) + [tick(5)],
        window_events(5, "abc", 100) + window_events(6, "abc", 100) + [tick(10)],
        window_events(10, "abc", 100) + window_events(11, "abc", 100) + [tick(20)],
    ]
    produced: list[dict] = []
    transcript: list[str] = []
    driver = None

    def send(phase: int, *, tick: bool = True) -> None:
        # A phase's tick goes once its events are all planned: a tick read from one partition before the
        # others' events would move the watermark past them, and Spark drops them as late (window 10 of
        # 'a' with 67 of its 100 events, once). Spark plans and runs batches in order, so events planned
        # before the tick are counted before the tick's watermark applies.
        events = phases[phase][:-1] if tick else phases[phase]
        produced.extend(events)
        shards.produce("events", 3, [json.dumps(e).encode() for e in events])
        if tick:
            send_tick(phase)

    def send_tick(phase: int) -> None:
        wait_until(planned_all, timeout_s=150, interval_s=0.2)
        produced.append(phases[phase][-1])
        shards.produce("events", 3, [json.dumps(phases[phase][-1]).encode()])

    def planned_all() -> bool:
        ids = batch_ids(checkpoint / "offsets")
        return bool(ids) and sum(streams_read(checkpoint, ids[-1]).values()) >= len(produced)

    def drained(closed_before_minute: int) -> bool:
        ids = batch_ids(checkpoint / "offsets")
        if not ids or in_flight(checkpoint) or sum(streams_read(checkpoint, ids[-1]).values()) < len(produced):
            return False
        rows = parquet_rows(output)
        want = expected(produced, closed_before_minute=closed_before_minute)
        return rows is not None and {r[:2] for r in rows} >= {w[:2] for w in want}

    started = time.monotonic()
    try:
        send(0, tick=False)
        log = tmp_path / "driver.log"
        driver = cluster.submit(log, *args, conf={"spark.cores.max": "1"})
        send_tick(0)
        wait_until(lambda: drained(5), timeout_s=150, interval_s=0.2)
        read_before = sum(streams_read(checkpoint, batch_ids(checkpoint / "offsets")[-1]).values())
        send(1, tick=False)

        def planned():  # a batch with phase 1's events on b planned, its tasks not yet done: b dies now
            for n in in_flight(checkpoint):
                ends = streams_read(checkpoint, n)
                if sum(ends.values()) > read_before and n >= 1:
                    b_now = sum(v for k, v in ends.items() if k.startswith("b/"))
                    b_then = sum(v for k, v in streams_read(checkpoint, n - 1).items() if k.startswith("b/"))
                    return (n, b_now - b_then) if b_now > b_then else None
            return None

        killed, on_b = wait_until(planned, timeout_s=150, interval_s=0.005)
        shards.servers["b"].stop(signal.SIGKILL)
        transcript.append(
            f"SIGKILL of shard b with batch {killed} in flight ({on_b} of its events on b): {state_of(checkpoint)}"
        )
        time.sleep(3)  # (the fault's length: b stays down while the batch's tasks read)
        shards.servers["b"].start()
        send_tick(1)
        wait_until(lambda: drained(10), timeout_s=150, interval_s=0.2)
        transcript.append(f"b restarted, phase 1 drained: {state_of(checkpoint)}")
        send(2)
        wait_until(lambda: drained(20), timeout_s=150, interval_s=0.2)
        stop_group(driver, signal.SIGTERM, timeout_s=30)
        transcript.append(f"phase 2 read, driver stopped; batches it ran tasks for: {batches_run(log)}")
        want = expected(produced, closed_before_minute=20)
        rows = parquet_rows(output)
        results = sorted(
            (minute_of(r["window_start"]), r["key"], r["events"], r["total"])
            for r in (json.loads(b) for b in shards.snapshot("results", 0))
        )
        last = batch_ids(checkpoint / "offsets")[-1]
        transcript.append(
            f"end: {len(rows)} Parquet rows, {len(results)} results, {len(want)} expected; "
            f"{sum(streams_read(checkpoint, last).values())} of {len(produced)} events read; "
            f"{time.monotonic() - started:.0f} s; depths {shards.depth('events', 3)}, last offsets "
            f"{streams_read(checkpoint, last)}"
        )
        print("\n" + "\n".join(transcript))
        assert [r[:4] for r in rows] == want  # each window once, with its full count and total
        assert results == want
        assert sum(streams_read(checkpoint, last).values()) == len(produced)  # every event read
        # and acknowledged on every shard (b too), all but the last batch: Spark commits a batch to its
        # source when it plans the next one, which the last data batch may not have been followed by
        ends, before = streams_read(checkpoint, last), streams_read(checkpoint, last - 1)
        unread = {key.partition("/")[2]: ends[key] - before[key] for key in ends}
        wait_until(lambda: all(n <= unread[q] for q, n in shards.depth("events", 3).items()), timeout_s=20)
    finally:
        if driver is not None:
            stop_group(driver, signal.SIGKILL)
        shards.close()


def state_of(checkpoint: Path) -> str:
    return f"offsets {batch_ids(checkpoint / 'offsets')}, commits {batch_ids(checkpoint / 'commits')}"
