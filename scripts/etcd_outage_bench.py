"""Known queues while etcd is away (placement in etcd): their throughput with etcd up, stopped, and back.

    PYTHONPATH=. .venv/bin/python scripts/etcd_outage_bench.py [--up-s 20] [--outage-s 60] [--back-s 20]
        [--per-shard 2] [--producers-per-queue 1] [--batch 100] [--control] [--json FILE]

One run: a three-member etcd on loopback and three shards (`pzq serve --shard a|b|c --etcd URLS`, the
test helpers of tests/etcd_cluster.py), ``--per-shard`` queues placed on each shard before anything is
measured, and for each queue producer processes (``ClusterApi`` with keys, batches of ``--batch``, flat
out) and a consumer process (the API's LEASE, FETCH, ACK_UPTO on the queue's shard: tests/etcd_load.py).
Three phases follow one another: etcd up (``--up-s``), every etcd member stopped (``--outage-s``, the
issue's 60 s), etcd back (``--back-s``). It prints each phase's messages acked and consumed a second, the
ratio stopped / up (target >= 0.95) and stopped / the mean of up and back (a drift of the machine over
the run shared by both sides), the client errors while etcd was stopped (target 0), whether a new queue
was refused ``unplaced`` meanwhile, the seconds until a queue placed after etcd's return was seen by every
shard's WHERE (target <= 2 s), and each shard's longest loop turn and turns over 100 ms and 1 s in each
phase, the moments etcd stops and starts apart (target: none caused by etcd; ``--control`` keeps etcd up
through the middle phase: what the machine alone gives there).

The cores are shared by etcd, the shards and every client: on 2 cores their 5 s rates move between 15k
and 45k msg/s within one run, and a phase's by 10-40 % between runs (more with anything else running):
run it several times, with a ``--control`` run beside, and quote them all.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from etcd_cluster import EtcdCluster, EtcdShards  # noqa: E402
from etcd_load import Ledger, Turns, consume, place_spread, produce, seen_everywhere  # noqa: E402

from pzq.clients.api import ApiError  # noqa: E402

NAMES = ["a", "b", "c"]
WARM_S = 3.0  # after every producer was acked once, before the first phase is measured


class FirstAck(Ledger):
    """A producer child's ledger: its first ack said on ``ready`` (the phases start once every child runs)."""

    ready = None

    def note_ack(self, queue: str, bodies: list[bytes]) -> None:
        super().note_ack(queue, bodies)
        if self.ready is not None:
            self.ready.put(queue)
            self.ready = None


def produce_child(seed: str, queue: str, batch: int, stop, out, ready) -> None:
    """(A child process.) ``etcd_load.produce`` until ``stop``, then its acks and errors sent on ``out``."""
    ledger = FirstAck.of([queue])
    ledger.bodies, ledger.ready = False, ready
    produce(seed, queue, ledger, stop, batch=batch, pace_s=0)
    out.put(("produce", queue, ledger.acks_of(queue), ledger.errors))


def consume_child(endpoint: str, queue: str, stop, out) -> None:
    """(A child process.) ``etcd_load.consume`` until ``stop``, then what it consumed when, and its errors."""
    ledger = Ledger.of([queue])
    ledger.bodies = False
    consume(lambda: endpoint, queue, ledger, stop)
    out.put(("consume", queue, ledger.consume_times, ledger.errors))


def rate(events: list[tuple[float, int]], begin: float, end: float) -> float:
    return sum(n for t, n in events if begin <= t <= end) / (end - begin)


def series(events: list[tuple[float, int]], begin: float, end: float, step: float = 5.0) -> list[int]:
    """msg/s in each ``step`` seconds from ``begin`` to ``end``."""
    return [round(rate(events, begin + i * step, begin + (i + 1) * step)) for i in range(int((end - begin) // step))]


def outage(etcd: EtcdCluster, shards: EtcdShards, turns: Turns, args) -> dict:
    """Every etcd member stopped ``--outage-s``, a new queue asked for meanwhile; then etcd started again
    and a queue placed: the phases' bounds and what was seen."""
    turns.sample_all(NAMES)
    stopping = time.monotonic()
    if not args.control:
        etcd.stop_all()
    begin = time.monotonic()
    stopping_turns = turns.sample_all(NAMES)
    while not args.control and any(shards.registry(n)["reachable"] for n in NAMES) and time.monotonic() - begin < 10:
        time.sleep(0.05)
    try:
        shards.clients["a"].produce([("bench-new-while-away", b"x")], key="new-while-away")
        refused = "not refused: stored"
    except ApiError as exc:
        refused = f"{exc.code}: {exc.detail}"
    time.sleep(max(0.0, begin + args.outage_s - time.monotonic()))  # (the outage's length: nothing to poll)
    end = time.monotonic()
    during = turns.sample_all(NAMES)
    if not args.control:
        etcd.start_all()
    back = time.monotonic()
    starting_turns = turns.sample_all(NAMES)
    after_placing = seen_everywhere(shards.clients, "bench-new-after-return", timeout_s=30)
    seen = time.monotonic() - back if after_placing is not None else None
    return {
        "stopping": stopping,
        "begin": begin,
        "end": end,
        "back": back,
        "stop_all_s": begin - stopping,
        "refused": refused,
        "seen_s": seen,
        "seen_after_placing_s": after_placing,
        "turns": {"etcd stopping": stopping_turns, "etcd stopped": during, "etcd starting": starting_turns},
    }


def run(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="pzq-etcd-bench-"))
    (root / "etcd").mkdir()
    (root / "shards").mkdir()
    etcd = EtcdCluster(root / "etcd", members=3)
    shards = None
    ctx = multiprocessing.get_context("spawn")
    stop_producers, stop_consumers, out, ready = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    children = []
    try:
        shards = EtcdShards(root / "shards", etcd)
        homes = place_spread(shards.endpoints["a"], per_shard=args.per_shard, prefix="bench")
        seed = shards.endpoints["a"]
        for queue, home in homes.items():
            for _ in range(args.producers_per_queue):
                children.append(
                    ctx.Process(target=produce_child, args=(seed, queue, args.batch, stop_producers, out, ready))
                )
            children.append(
                ctx.Process(target=consume_child, args=(shards.endpoints[home], queue, stop_consumers, out))
            )
        for child in children:
            child.start()
        servers = shards.servers
        turns = Turns(lambda n: servers[n].stats(), lambda n: servers[n].proc.pid)  # type: ignore[union-attr]
        for _ in range(len(homes) * args.producers_per_queue):
            ready.get(timeout=120)  # (every producer acked once: the children are up)
        time.sleep(WARM_S)
        up_begin = time.monotonic()
        turns.sample_all(NAMES)
        for figures in (turns.over_100, turns.over_1000, turns.longest_ms):
            figures.clear()  # (the start and the warm-up are no phase's)
        time.sleep(args.up_s)
        up_end = time.monotonic()
        up_turns = turns.sample_all(NAMES)
        found = outage(etcd, shards, turns, args)
        time.sleep(max(0.0, found["back"] + args.back_s - time.monotonic()))
        back_end = time.monotonic()
        back_turns = turns.sample_all(NAMES)
        stop_producers.set()
        time.sleep(1.0)
        stop_consumers.set()
        results = [out.get(timeout=60) for _ in children]
        for child in children:
            child.join(30)
    finally:
        stop_producers.set()
        stop_consumers.set()
        for child in children:
            if child.is_alive():
                child.kill()
        if shards is not None:
            shards.close()
        etcd.close()
        shutil.rmtree(root, ignore_errors=True)
    acks = [e for kind, _, events, _ in results if kind == "produce" for e in events]
    consumed = [e for kind, _, events, _ in results if kind == "consume" for e in events]
    errors = [e for _, _, _, errs in results for e in errs]
    phases = {
        "up": (up_begin, up_end),
        "etcd stopped": (found["begin"], found["end"]),
        "back": (found["back"], back_end),
    }
    return {
        "queues": homes,
        "acked_per_s": {p: round(rate(acks, a, b)) for p, (a, b) in phases.items()},
        "consumed_per_s": {p: round(rate(consumed, a, b)) for p, (a, b) in phases.items()},
        "errors_while_stopped": [e for e in errors if found["stopping"] <= e[0] <= found["end"]],
        "errors_total": len(errors),
        "new_queue_while_stopped": found["refused"],
        "stop_all_s": round(found["stop_all_s"], 2),
        "placement_seen_s": found["seen_s"],
        "placement_seen_after_placing_s": found["seen_after_placing_s"],
        "turns": {"up": up_turns, **found["turns"], "back": back_turns},
        "series": series(acks, up_begin, back_end),
        "turns_longest_ms": turns.longest_ms,
    }


def show(found: dict, args) -> None:
    acked, consumed = found["acked_per_s"], found["consumed_per_s"]
    if args.control:
        print("CONTROL RUN: etcd was kept up through the middle phase ('etcd stopped' below)")
    print(f"queues: {found['queues']} (producers a queue: {args.producers_per_queue}, batches of {args.batch})")
    for phase in acked:
        print(f"  {phase:13} acked {acked[phase]:7,d} msg/s   consumed {consumed[phase]:7,d} msg/s")
    print(
        f"ratio etcd stopped / up: acked {acked['etcd stopped'] / acked['up']:.3f}, "
        f"consumed {consumed['etcd stopped'] / max(1, consumed['up']):.3f} (target >= 0.95); "
        f"back / up: acked {acked['back'] / acked['up']:.3f}"
    )
    both = (acked["up"] + acked["back"]) / 2  # (a drift of the machine over the run shared by both sides)
    print(f"ratio etcd stopped / the mean of up and back: acked {acked['etcd stopped'] / both:.3f}")
    print(
        f"client errors while etcd was stopped ({args.outage_s:g} s): {len(found['errors_while_stopped'])} "
        f"(target 0; {found['errors_total']} in the whole run)"
    )
    print(f"a new queue while etcd was stopped: {found['new_queue_while_stopped'][:160]}")
    print(f"stopping every etcd member took {found['stop_all_s']} s (its turns apart: 'etcd stopping')")
    seen, placing = found["placement_seen_s"], found["placement_seen_after_placing_s"]
    print(
        f"a queue placed after etcd's return seen by every shard {seen:.2f} s after etcd answered "
        f"({placing:.2f} s after it was asked for; target <= 2 s)"
        if seen is not None
        else "a queue placed after etcd's return: NOT seen by every shard within 30 s"
    )
    for phase, by_shard in found["turns"].items():
        shown = ", ".join(
            f"{n}: {t['over_100']:.0f} over 100 ms, {t['over_1000']:.0f} over 1 s"
            + (f", longest so far {t['longest_ms']:.0f} ms" if t["longest_ms"] else "")
            for n, t in sorted(by_shard.items())
        )
        print(f"turns, {phase}: {shown}")
    print(f"acked msg/s, 5 s at a time from the first phase on: {found['series']}")
    print(f"longest turn of each shard in the run: {found['turns_longest_ms']} ms (target < 100 ms from etcd)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--up-s", type=float, default=20.0)
    parser.add_argument("--outage-s", type=float, default=60.0)
    parser.add_argument("--back-s", type=float, default=20.0)
    parser.add_argument("--per-shard", type=int, default=2, help="queues placed on each shard")
    parser.add_argument("--producers-per-queue", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100, help="messages a PRODUCE")
    parser.add_argument("--control", action="store_true", help="keep etcd up through the middle phase (a control run)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    found = run(args)
    show(found, args)
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1, default=str))


if __name__ == "__main__":
    main()
