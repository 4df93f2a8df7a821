"""Three shards as real `pzq serve` processes under faults in a loop (issue 43): SIGKILL and restart on the
same store, SIGSTOP then SIGCONT, and a power cut (tests/powercut's shim: only what an fsync made durable
survives) on the shard that runs under it. Producers write with the batched native Producer to a queue's
partitions placed by pzq.shards, consumers drain each shard with BatchConsumer, pzq's cluster clients
(ShardedProducer, ShardedConsumer: the places located by WHERE) write and read across all of them beside
those, and a ledger keeps every id whose ack a producer got and every id consumed: at the end every
acknowledged id was consumed (at least once: a fault may deliver one twice), and while a shard was down
the others' producers kept getting acks.

Each shard runs with ``--shard NAME --cluster shards.toml``. The native sockets serve one queue a server
(``--queue``): the queue here is made of one partition a shard by `pzq queue create Q --partitions 3`
(``ShardList.place(Q, 3)`` puts Q#0..2 on three different shards), each shard's native sockets serve its
partition, and a producer of a partition writes only to that partition's shard (its batch ids are that
shard's: a resend after a lost ack goes back there). At the end every shard still answers WHERE with
the partitions it was told, through its kills and power cuts.

The default run makes FAULTS faults over about SECONDS seconds; a longer soak:
``PZQ_CLUSTER_FAULTS=200 PZQ_CLUSTER_FAULT_SECONDS=600 pytest tests/test_cluster_faults.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import test_power_cut
import zmq
from test_power_cut import journaled

from pzq import shards
from pzq.clients import native as client
from pzq.clients.cluster import Cluster
from pzq.clients.cluster_consume import ShardedConsumer
from pzq.clients.cluster_native import ShardedProducer
from pzq.errors import ClientError

from conftest import steady_ports

FAULTS = int(os.environ.get("PZQ_CLUSTER_FAULTS", "21"))  # kill, stop and power cut in turn: 7 of each
SECONDS = float(os.environ.get("PZQ_CLUSTER_FAULT_SECONDS", "60"))  # the faults spread over this long
DOWN_S = 1.2  # how long a faulted shard stays down: the others must be acked meanwhile
BACK_S = 30.0  # a shard brought back is acked again within this (a loaded machine restarts slowly)
CHUNK = 50  # messages a producer sends in one batch (one send_many)
PACE_S = 0.1  # between a producer's batches: 500 messages a second a shard, light beside the suite
QUEUE = "jobs"
NAMES = ("s0", "s1", "s2")
CUT = "s0"  # the shard that runs under the power-cut shim (the others run plain)

shim = test_power_cut.shim  # (the fixture that builds the shim, shared)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(2 * SECONDS) + 240)]


def shard_ports(n: int) -> list[int]:
    """``n`` ports for the shards, below the kernel's ephemeral range and test_base_port's (conftest.steady_ports)."""
    return steady_ports(n, 12_000, 20_000)


class ShardProcess:
    """One `pzq serve` shard on its own store and free loopback ports, kept across restarts. Under the
    shim (``shim``), each start journals the data file's writes and keeps a copy of the file it began
    from: a power cut is that copy with only the journal's durable writes laid on it."""

    def __init__(self, root: Path, name: str, shim: Path | None = None):
        self.name = name
        self.dir = root / name
        self.dir.mkdir()
        self.database = self.dir / "db"
        self.log = self.dir / "server.log"
        ports = (f"tcp://127.0.0.1:{p}" for p in shard_ports(5))
        self.receive, self.send, self.consume, self.api, self.monitor = ports
        self.shim = shim
        self.queue = ""
        self.cluster = ""  # the shard list's file
        self.proc: subprocess.Popen | None = None
        self.stopped = False

    def entry(self) -> shards.Shard:
        return shards.Shard(self.name, self.receive, self.send, self.consume, self.api, self.monitor)

    def argv(self) -> list[str]:
        return [
            *(sys.executable, "-m", "pzq", "serve", "--database", str(self.database), "--queue", self.queue),
            *("--receive-dsn", self.receive, "--send-dsn", self.send, "--consume-dsn", self.consume),
            *("--monitor-dsn", self.monitor, "--ack-timeout", "2s", "--disk-reserve", "0", "--log-level", "warning"),
            *("--phpmq-dsn", "", "--emqp-frontend-dsn", "", "--emqp-backend-dsn", "", "--emqp-publish-dsn", ""),
            *("--mqks-dsn", "", "--api-dsn", self.api),
            *("--shard", self.name, "--cluster", self.cluster),
        ]

    def start(self) -> None:
        env = None
        if self.shim is not None:
            data, base, journal = self.database / "data.mdb", self.dir / "base.mdb", self.dir / "journal"
            base.unlink(missing_ok=True)
            journal.unlink(missing_ok=True)
            if data.exists():
                shutil.copyfile(data, base)
            env = {**os.environ, "LD_PRELOAD": str(self.shim), "PZQ_POWERCUT_JOURNAL": str(journal)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        deadline = time.monotonic() + BACK_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                client.monitor_request(self.monitor, timeout_s=0.2)
                return
            except ClientError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer MONITOR: {self.log.read_text()[-2000:]}") from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def pause(self, paused: bool) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)
        self.stopped = paused

    def power_cut(self) -> int:
        """SIGKILL, then leave the data file as a power cut would: the file this run began from with only
        its durable writes on it (and no lock file: it lives in memory). Returns the writes lost."""
        assert self.shim is not None
        self.kill()
        base, data = self.dir / "base.mdb", self.database / "data.mdb"
        image = bytearray(base.read_bytes() if base.exists() else b"")
        records = journaled(self.dir / "journal")
        for durable, offset, chunk in records:
            if durable:
                if len(image) < offset + len(chunk):
                    image.extend(bytes(offset + len(chunk) - len(image)))
                image[offset : offset + len(chunk)] = chunk
        if len(image) < 2 * 4096:  # not even LMDB's meta pages reached the disk: an empty store
            data.unlink(missing_ok=True)
        else:
            data.write_bytes(image)
        (self.database / "lock.mdb").unlink(missing_ok=True)
        return sum(1 for durable, _, _ in records if not durable)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.stopped:
                self.pause(False)
            self.kill()


@dataclasses.dataclass
class Ledger:
    """What the clients saw: per shard, the bodies acked and when each ack came; every body consumed."""

    acked: dict[str, set[bytes]]
    ack_times: dict[str, list[float]]
    consumed: set[bytes] = dataclasses.field(default_factory=set)
    consumed_total: int = 0
    consume_times: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, names: tuple[str, ...]) -> Ledger:
        return cls({name: set() for name in (*names, "cluster")}, {name: [] for name in names})

    def acks_between(self, name: str, begin: float, end: float) -> int:
        return sum(1 for t in self.ack_times[name] if begin <= t <= end)

    def last_ack(self, name: str) -> float:
        times = self.ack_times[name]
        return times[-1] if times else 0.0

    def all_acked(self) -> set[bytes]:
        return set().union(*self.acked.values())


def produce(shard: ShardProcess, ledger: Ledger, ctx: zmq.Context, stop: threading.Event) -> None:
    """Batches of CHUNK to ``shard`` every PACE_S until ``stop``; a batch whose ack never came (the shard
    was down past the producer's timeout and one resend) is not in the ledger, and the next goes on a new
    producer (a consumer may still find it: the ledger asks only that what was acked is consumed)."""
    producer: client.Producer | None = None
    seq = 0
    try:
        while not stop.is_set():
            bodies = [[b"%s %08d" % (shard.name.encode(), seq + i)] for i in range(CHUNK)]
            seq += CHUNK
            try:
                producer = producer or client.Producer(shard.receive, timeout_s=1.0, ctx=ctx)
                results = producer.send_many(bodies, batch=CHUNK, window=1)
            except ClientError:
                if producer is not None:
                    producer.close()
                producer = None
                continue
            now = time.monotonic()
            ok = [body[0] for body, result in zip(bodies, results, strict=True) if result.ok]
            ledger.acked[shard.name].update(ok)
            if ok:
                ledger.ack_times[shard.name].append(now)
            stop.wait(PACE_S)
    finally:
        if producer is not None:
            producer.close()


def produce_sharded(listing: str, ledger: Ledger, stop: threading.Event) -> None:
    """pzq's ShardedProducer over the whole cluster (the places located by WHERE), a batch of CHUNK to each
    shard in turn every 3 PACE_S; what it was acked for goes to the ledger as "cluster" (a shard that is
    down fails its batch, and is left out for a while: the others take the next ones)."""
    cluster = Cluster.from_file(listing)
    producer: ShardedProducer | None = None
    seq = 0
    try:
        while not stop.is_set():
            bodies = [[b"cluster %08d" % (seq + i)] for i in range(3 * CHUNK)]
            seq += len(bodies)
            try:
                producer = producer or ShardedProducer(cluster, QUEUE, timeout_s=1.0, batch=CHUNK, window=1)
                results = producer.send_many(bodies)
            except ClientError:
                if producer is not None:
                    producer.close()
                producer = None
                continue
            ledger.acked["cluster"].update(body[0] for body, r in zip(bodies, results, strict=True) if r.ok)
            stop.wait(3 * PACE_S)
    finally:
        if producer is not None:
            producer.close()
        cluster.close()


def consume_sharded(listing: str, ledger: Ledger, stop: threading.Event) -> None:
    """pzq's ShardedConsumer over the whole cluster, beside the shards' own consumers."""
    cluster = Cluster.from_file(listing)
    try:
        drain(lambda: ShardedConsumer(cluster, QUEUE, hello_timeout_s=1.0), ledger, stop)
    finally:
        cluster.close()


def consume(shard: ShardProcess, ledger: Ledger, ctx: zmq.Context, stop: threading.Event) -> None:
    """Drain ``shard`` with a BatchConsumer, acking each batch."""

    def new() -> client.BatchConsumer:
        return client.BatchConsumer(shard.consume, hello_timeout_s=1.0, ctx=ctx, prefetch=100)

    drain(new, ledger, stop, times=ledger.consume_times.setdefault(shard.name, []))


def drain(new, ledger: Ledger, stop: threading.Event, times: list[float] | None = None) -> None:
    """Receive and ack batches with a consumer ``new()`` makes, each id in the ledger (and when, in
    ``times``); a new consumer after any client error (its shard was killed or stopped: what the old one
    held comes back to the queue)."""
    consumer = None
    try:
        while not stop.is_set():
            try:
                consumer = consumer or new()
                batch = consumer.receive(100, timeout_s=0.2)
                if batch:
                    ledger.consumed.update(frames[0] for _, frames in batch)
                    ledger.consumed_total += len(batch)
                    if times is not None:
                        times.append(time.monotonic())
                    consumer.ack([key for key, _ in batch], timeout_s=2.0)
            except ClientError:
                if consumer is not None:
                    consumer.close()
                consumer = None
                stop.wait(0.1)
    finally:
        if consumer is not None:
            consumer.close()


def create(listing: str) -> None:
    """`pzq queue create QUEUE --partitions 3 --cluster LISTING`, as an operator makes it on every shard."""
    argv = [sys.executable, "-m", "pzq", "queue", "create", QUEUE, "--partitions", str(len(NAMES))]
    done = subprocess.run([*argv, "--cluster", listing], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def where_jobs(shard: ShardProcess) -> dict:
    """The shard's answer to the monitor's WHERE QUEUE."""
    return client.monitor_json(shard.monitor, client.monitor_request(shard.monitor, f"WHERE {QUEUE}", timeout_s=10))


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    shard: str
    begin: float
    end: float


def poll(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def fault_once(kind: str, victim: ShardProcess, ledger: Ledger) -> Fault:
    """One fault held DOWN_S, then the shard back, and acked again (or the test fails)."""
    begin = time.monotonic()
    if kind == "kill":
        victim.kill()
    elif kind == "stop":
        victim.pause(True)
    else:
        victim.power_cut()
    time.sleep(max(0.0, DOWN_S - (time.monotonic() - begin)))  # (the fault's length: nothing to poll for)
    end = time.monotonic()
    if kind == "stop":
        victim.pause(False)
    else:
        victim.start()
    assert poll(lambda: ledger.last_ack(victim.name) > end, BACK_S), (
        f"{victim.name} was not acked again within {BACK_S:g} s after a {kind}"
    )
    return Fault(kind, victim.name, begin, end)


def make_cluster(tmp_path: Path, shim: Path) -> dict[str, ShardProcess]:
    """Three shards, their list written to shards.toml, each serving the partition of QUEUE that the
    list's placement puts on it (not started)."""
    cluster = {name: ShardProcess(tmp_path, name, shim if name == CUT else None) for name in NAMES}
    listing = tmp_path / "shards.toml"
    tables = ({"name": s.name, **s.entry().endpoints()} for s in cluster.values())
    listing.write_text("".join("[[shard]]\n" + "".join(f'{k} = "{v}"\n' for k, v in t.items()) for t in tables))
    placed = shards.load(str(listing)).place(QUEUE, len(NAMES))
    for partition, shard in placed:
        cluster[shard.name].queue = partition
        cluster[shard.name].cluster = str(listing)
    assert all(s.queue for s in cluster.values()), f"a partition on each shard: {placed}"
    return cluster


def test_three_shards_under_kills_stops_and_power_cuts_lose_no_acknowledged_message_and_the_others_keep_serving(
    tmp_path, shim
):
    cluster = make_cluster(tmp_path, shim)
    listing = cluster[CUT].cluster
    ledger = Ledger.of(NAMES)
    ctx = zmq.Context()
    stop_producers, stop_consumers = threading.Event(), threading.Event()
    threads = [
        *(
            threading.Thread(target=produce, args=(s, ledger, ctx, stop_producers), daemon=True)
            for s in cluster.values()
        ),
        *(
            threading.Thread(target=consume, args=(s, ledger, ctx, stop_consumers), daemon=True)
            for s in cluster.values()
        ),
        threading.Thread(target=produce_sharded, args=(listing, ledger, stop_producers), daemon=True),
        threading.Thread(target=consume_sharded, args=(listing, ledger, stop_consumers), daemon=True),
    ]
    rng = random.Random(43)
    faults: list[Fault] = []
    try:
        for s in cluster.values():
            s.start()
        create(cluster[CUT].cluster)
        for thread in threads:
            thread.start()
        assert poll(lambda: all(ledger.ack_times.values()), BACK_S), "every shard acked before the faults"
        t0 = time.monotonic()
        for i in range(FAULTS):
            time.sleep(max(0.0, t0 + i * SECONDS / FAULTS - time.monotonic()))  # (the schedule: nothing to poll)
            kind = ("kill", "stop", "power cut")[i % 3]
            victim = cluster[CUT] if kind == "power cut" else cluster[rng.choice(NAMES)]
            faults.append(fault_once(kind, victim, ledger))
        stop_producers.set()
        acked = ledger.all_acked()
        poll(lambda: acked <= ledger.consumed, 60)
        where = {s.name: where_jobs(s) for s in cluster.values()}
    finally:
        stop_producers.set()
        stop_consumers.set()
        for thread in threads:
            thread.join(10)
        for s in cluster.values():
            s.close()
        ctx.destroy(linger=0)
    lost = acked - ledger.consumed
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages never consumed, e.g. {sorted(lost)[:5]}"
    assert {f.kind for f in faults} == {"kill", "stop", "power cut"} and len(faults) == FAULTS >= 3
    # (CHUNK / PACE_S messages a second a shard: one acked for a fifth of that over the faults did not serve)
    least = SECONDS / PACE_S * CHUNK / 5
    assert all(len(ledger.acked[name]) >= least for name in (*NAMES, "cluster")), {
        n: len(a) for n, a in ledger.acked.items()
    }
    silent = [
        (f.kind, f.shard, other)
        for f in faults
        for other in NAMES
        if other != f.shard and ledger.acks_between(other, f.begin, f.end) == 0
    ]
    assert not silent, f"shards not acked while another was down (fault, down, silent): {silent}"
    # Each shard still knows what `queue create --partitions` told it, through its kills and power cuts
    places = [[name, shard.name] for name, shard in shards.load(cluster[CUT].cluster).place(QUEUE, len(NAMES))]
    for name, answer in where.items():
        assert (answer["shard"], answer["partitions"], answer["places"]) == (name, len(NAMES), places), answer
        assert [cluster[name].queue] == [held for held, _ in answer["held"]], answer
    # Consumers are back soon after their shard: a BatchConsumer hears its connection drop and starts
    # afresh (it had waited for its keepalive, a third of the server's idle_us: ~20 s after each restart).
    # Each pause holds a fault's 1.2 s, the restart and the reconnect: 2-5 s measured on a busy machine.
    pauses = {name: max(b - a for a, b in itertools.pairwise(ts)) for name, ts in ledger.consume_times.items()}
    assert max(pauses.values()) < 12, pauses
    print(
        f"{len(faults)} faults in {faults[-1].end - faults[0].begin:.0f} s; {len(acked)} acked "
        f"({len(ledger.acked['cluster'])} through the ShardedProducer), "
        f"{ledger.consumed_total} consumed ({ledger.consumed_total - len(ledger.consumed)} again after a fault); "
        f"longest pause in a shard's deliveries: {', '.join(f'{n} {p:.1f} s' for n, p in sorted(pauses.items()))}"
    )
