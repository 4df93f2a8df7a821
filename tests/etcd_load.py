"""Load on a cluster kept in etcd (tests/etcd_cluster.py's ``EtcdShards``), shared by
tests/test_etcd_faults.py and scripts/etcd_outage_bench.py: producers through ``ClusterApi`` with keys
(a call that failed is made again with its key: what a shard stored, it stores once), consumers reading
each queue's place through the API (LEASE, FETCH, ACK_UPTO), a ``Ledger`` of what was acked, consumed
and refused (each error with its time), and ``Turns``, the shards' loop turns over 100 and 1000 ms from
their STATS, with the windows a test stopped a shard in (SIGSTOP mid-turn makes one long turn) set apart.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from pzq.clients.api import ApiClient
from pzq.clients.cluster import Cluster
from pzq.clients.cluster_api import ClusterApi
from pzq.errors import ClientError, PzqError

GROUP = "ledger"


@dataclasses.dataclass
class Ledger:
    """Per queue: the bodies acked and when each call was; every body consumed; each client error."""

    acked: dict[str, set[bytes]]
    ack_times: dict[str, list[float]]
    consumed: set[bytes] = dataclasses.field(default_factory=set)
    consumed_total: int = 0
    # (when, queue or "consume QUEUE", error): a producer's or a consumer's
    errors: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)
    consume_times: list[tuple[float, int]] = dataclasses.field(default_factory=list)  # (when, how many)
    bodies: bool = True  # False: counts and times only (a benchmark's hours of messages)

    @classmethod
    def of(cls, queues: list[str]) -> Ledger:
        return cls({q: set() for q in queues}, {q: [] for q in queues})

    def all_acked(self) -> set[bytes]:
        return set().union(*self.acked.values())

    def last_ack(self, queue: str) -> float:
        times = self.ack_times[queue]
        return times[-1] if times else 0.0

    def acks_between(self, queue: str, begin: float, end: float) -> int:
        """Messages acked to ``queue`` by calls that ended between ``begin`` and ``end``."""
        return sum(n for t, n in self.acks_of(queue) if begin <= t <= end)

    def acks_of(self, queue: str) -> list[tuple[float, int]]:
        """(when, how many) of each call acked to ``queue``."""
        return list(zip(self.ack_times[queue], self._counts.get(queue, []), strict=False))  # (one being noted: left)

    def errors_between(self, begin: float, end: float) -> list[tuple[float, str, str]]:
        return [e for e in self.errors if begin <= e[0] <= end]

    def note_ack(self, queue: str, bodies: list[bytes]) -> None:
        if self.bodies:
            self.acked[queue].update(bodies)
        self._counts.setdefault(queue, []).append(len(bodies))  # (before its time: acks_of pairs them)
        self.ack_times[queue].append(time.monotonic())

    def __post_init__(self) -> None:
        self._counts: dict[str, list[int]] = {}


def produce(
    seed: str, queue: str, ledger: Ledger, stop: threading.Event, *, batch: int = 20, pace_s: float = 0.05
) -> None:
    """Batches of ``batch`` to ``queue`` through a ClusterApi of the cluster ``seed`` (a shard's API
    endpoint) names, every ``pace_s`` (0: flat out), until ``stop``. A call that raises is counted in the
    ledger's errors and made again with the same key and bodies until it is acked (or ``stop``)."""
    cluster = Cluster.from_server(seed)
    api = ClusterApi(cluster, timeout_s=20, attempt_s=2)
    seq = 0
    try:
        while not stop.is_set():
            bodies = [b"%s %08d" % (queue.encode(), seq + i) for i in range(batch)]
            key = f"{queue}-{seq}"
            seq += batch
            while not stop.is_set():
                try:
                    api.produce([(queue, body) for body in bodies], key=key)
                except PzqError as exc:
                    ledger.errors.append((time.monotonic(), queue, f"{type(exc).__name__}: {exc}"[:300]))
                    stop.wait(0.2)
                    continue
                ledger.note_ack(queue, bodies)
                break
            if pace_s:
                stop.wait(pace_s)
    finally:
        api.close()
        cluster.close()


def consume(endpoint: Callable[[], str], queue: str, ledger: Ledger, stop: threading.Event, most: int = 500) -> None:
    """Read ``queue`` on the shard whose API ``endpoint()`` gives, through LEASE, FETCH and ACK_UPTO in
    the group GROUP, every body into the ledger, until ``stop``; after a client error (its shard killed
    or stopped) a new client goes on from the group's acked offset (what was leased comes again)."""
    api: ApiClient | None = None
    at = -1
    try:
        while not stop.is_set():
            try:
                if api is None:
                    api = ApiClient(endpoint(), timeout_s=20, attempt_s=1)
                    at = api.offsets(queue, GROUP)[0]
                _, end = api.lease(queue, GROUP, at, most)
                if end <= at:
                    stop.wait(0.05)  # (the API has no waiting LEASE: an empty queue is asked again soon)
                    continue
                messages, _ = api.fetch(queue, GROUP, at, end)
                if ledger.bodies:
                    ledger.consumed.update(bytes(m[4]) for m in messages)
                ledger.consumed_total += len(messages)
                ledger.consume_times.append((time.monotonic(), len(messages)))
                api.ack_upto(queue, GROUP, end)
                at = end
            except ClientError as exc:
                ledger.errors.append((time.monotonic(), f"consume {queue}", f"{type(exc).__name__}: {exc}"[:300]))
                if api is not None:
                    api.close()
                api = None
                stop.wait(0.1)
    finally:
        if api is not None:
            api.close()


def place_spread(seed: str, per_shard: int, prefix: str = "jobs") -> dict[str, str]:
    """Queues placed in etcd (through a producer's WHERE), ``per_shard`` on each shard: {queue: shard}."""
    with Cluster.from_server(seed) as cluster:
        names = cluster.shards.names()
        chosen: dict[str, str] = {}
        for i in range(0, 400, 16):
            found = cluster.locate_many([f"{prefix}-{j}" for j in range(i, i + 16)], place=True)
            for queue, where in found.items():
                shard = where.places()[0][1].name
                if sum(1 for s in chosen.values() if s == shard) < per_shard:
                    chosen[queue] = shard
            if len(chosen) == per_shard * len(names):
                return chosen
    raise AssertionError(f"no {per_shard} queues placed on each of {names}: {chosen}")


def seen_everywhere(clients: dict[str, ApiClient], queue: str, timeout_s: float) -> float | None:
    """Place ``queue`` through the first shard's WHERE, then ask every shard's WHERE until each names its
    placement: the seconds that took from the first ask, None past ``timeout_s``."""
    begin = time.monotonic()
    first = next(iter(clients.values()))
    seen: set[str] = set()
    while time.monotonic() - begin < timeout_s:
        first.call("WHERE", queue=queue, place=1, brief=1)
        for name, api in clients.items():
            if name not in seen and api.call("WHERE", queue=queue, brief=1).get("placed"):
                seen.add(name)
        if len(seen) == len(clients):
            return time.monotonic() - begin
        time.sleep(0.02)  # (WHERE does not wait: asked again at once, a little later)
    return None


@dataclasses.dataclass
class Turns:
    """The loop turns of each shard (STATS ``gc``) over 100 and 1000 ms, and the longest, summed over
    its processes; a window a shard was stopped in (``stopped``) is counted apart (``excused``)."""

    stats: Callable[[str], dict]  # shard name -> its STATS
    pid: Callable[[str], int]
    last: dict[str, tuple[int, dict]] = dataclasses.field(default_factory=dict)
    over_100: dict[str, int] = dataclasses.field(default_factory=dict)
    over_1000: dict[str, int] = dataclasses.field(default_factory=dict)
    longest_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    excused: dict[str, int] = dataclasses.field(default_factory=dict)  # turns over 1000 ms in a stop window

    def sample(self, name: str, excused: bool = False) -> dict[str, float]:
        """Read ``name``'s figures; what changed since the last read counted (apart if ``excused``).
        Returns that change: over_100, over_1000 and the longest turn in it (0 if not longer than before)."""
        gc, pid = self.stats(name)["gc"], self.pid(name)
        was_pid, was = self.last.get(name, (pid, {}))
        if was_pid != pid:
            was = {}
        change = {
            "over_100": gc["turns_over_100ms_total"] - was.get("turns_over_100ms_total", 0),
            "over_1000": gc["turns_over_1000ms_total"] - was.get("turns_over_1000ms_total", 0),
            "longest_ms": gc["longest_turn_ms"] if gc["longest_turn_ms"] > was.get("longest_turn_ms", 0) else 0.0,
        }
        self.last[name] = (pid, gc)
        if excused:
            self.excused[name] = self.excused.get(name, 0) + int(change["over_1000"])
            return change
        self.over_100[name] = self.over_100.get(name, 0) + int(change["over_100"])
        self.over_1000[name] = self.over_1000.get(name, 0) + int(change["over_1000"])
        self.longest_ms[name] = max(self.longest_ms.get(name, 0.0), change["longest_ms"])
        return change

    def sample_all(self, names: list[str]) -> dict[str, dict[str, float]]:
        return {name: self.sample(name) for name in names}

    def shown(self) -> str:
        return ", ".join(
            f"{n}: longest {self.longest_ms[n]:.0f} ms, {self.over_100[n]} over 100 ms, {self.over_1000[n]} over 1 s"
            + (f" (+{self.excused[n]} over 1 s while SIGSTOPped)" if self.excused.get(n) else "")
            for n in sorted(self.longest_ms)
        )
