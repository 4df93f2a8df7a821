"""One pzq server against two shards, batched end to end with the same client processes (issue 43).

    PYTHONPATH=. .venv/bin/python scripts/cluster_bench.py [--count 200000] [--runs 3] [--producers 2]
        [--consumers 2] [--window 100] [--batch-size 100] [--size 100] [--json FILE]

Each round, on fresh servers (`pzq serve` subprocesses, fsync'd commits, tcp loopback):
  1. one server: ``--producers`` batched producers (pzq.bench.batched, PZQ-BATCH/1) and ``--consumers``
     BatchConsumers, all on it, ``--count`` messages of ``--size`` bytes;
  2. two shards (``--shard sN --cluster shards.toml``), the queue's two partitions placed by pzq.shards
     (one a shard), and the same client processes, each connected to both shards as a ShardedProducer
     and a ShardedConsumer are (``--window`` in flight and ``--window`` credit at each shard): each shard
     sees the concurrency the one server saw; the same ``--count`` in all. This is the target's ratio;
  3. the two shards again, the same number of client processes, half of them on each shard (a shard
     then sees half the concurrency: fewer messages share each turn and commit, and its fixed costs a
     message grow; printed beside, as the first measure of the issue was);
  4. the same two shards again, as 3, with one SIGSTOPped once every client connected: the other shard's
     clients run their half alone while the stopped one's wait (as a stalled shard's clients do).
Every other round runs the shards first (a drift of the machine's load then favours neither), and each
ratio is of the phases of one round. It prints msg/s end to end (first message consumed to last), the
ratio two shards / one server, each server's CPU µs per message (from /proc/PID/stat: the server's CPU
over the messages it stored and delivered), the clients' (every client process's CPU, from getrusage of
the reaped children, over the phase's messages: the two cores are shared by both), how idle the machine
was for a second before the round, and the running shard's msg/s with the other stopped against its own in
phase 3; the medians of the rounds last. Every phase also counts lost messages (0 expected), and says what
a message's CPU was shared by (messages a commit, a DELIVER) and how busy the whole machine was
(/proc/stat): a machine near 100 % is measuring its clients as much as its servers.

``--profile DIR``: one round with every server under cProfile timed by its loop thread's CPU, on only while
the one-server phase and phase 2 run; prints the functions with the most CPU of their own, in µs a
message, for the one server beside shard s0 (cProfile slows both alike: compare the columns, not rates).

The machine's cores are shared by the servers and every client: on 2 cores two shards compete with
their clients for the same CPU, and the figures are noisy (10-30 % between runs): quote medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pstats
import resource
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pzq import shards
from pzq.bench.batched import run_batched_consumer, run_batched_producer
from pzq.bench.phases import mp, split
from pzq.bench.server import PzqServer
from pzq.bench.workers import ConsumerJob, ProducerJob
from pzq.clients import native as client

QUEUE = "jobs"
SHARD_NAMES = ("s0", "s1")
# `pzq serve` under cProfile timed by the loop thread's CPU (not the wall: a wait in poll is no cost), on
# from SIGUSR1 to SIGUSR2 (a phase, not the start's imports), written when serve ends (the SIGTERM of
# PzqServer.close); argv: the file, then serve's arguments. pzq handles neither signal.
PROFILED = """
import cProfile, runpy, signal, sys, time
out, sys.argv = sys.argv[1], ["pzq", *sys.argv[2:]]
profile = cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
signal.signal(signal.SIGUSR2, lambda *_: profile.disable())
try:
    runpy.run_module("pzq", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    profile.disable()
    profile.dump_stats(out)
"""


@dataclasses.dataclass
class Group:
    """The clients of one server in a phase, and what they found."""

    server: PzqServer
    count: int
    producers: int
    consumers: int
    done: Any = None
    consumed: Any = None
    results: Any = None
    produced: Any = None
    progress: Any = None
    procs: list = dataclasses.field(default_factory=list)
    others: list[PzqServer] = dataclasses.field(default_factory=list)  # more shards every client connects to
    cpu0: list[float] = dataclasses.field(default_factory=list)  # each server's CPU at the start
    marks: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)  # its commits, deliveries, DELIVERs

    @property
    def all(self) -> list[PzqServer]:
        return [self.server, *self.others]

    def mark(self) -> None:
        self.cpu0 = [s.cpu_seconds() for s in self.all]
        self.marks = [counters(s) for s in self.all]

    def spawn(self, start, window: int, batch: int, size: int) -> None:
        """Start this group's processes (each connects, then waits at ``start``)."""
        self.done, self.consumed, self.results, self.produced = mp.Event(), mp.Value("q", 0), mp.Queue(), mp.Queue()
        self.progress = progress = mp.Value("q", 0)  # (kept: a child opens it after start() let go of its args)
        per = split(self.count, self.producers)
        for i, n in enumerate(per):
            receive = tuple(s.receive for s in self.others)
            job = ProducerJob(self.server.receive, i, n, window, size, batch=batch, timeout_s=120, others=receive)
            args = (job, start, progress, self.produced)
            self.procs.append(mp.Process(target=run_batched_producer, args=args, daemon=True))
        for i in range(self.consumers):
            consume = tuple(s.consume for s in self.others)
            cjob = ConsumerJob(
                self.server.consume, i, self.producers, max(per), credit=window, idle_timeout_s=120, others=consume
            )
            args = (cjob, start, self.consumed, self.done, self.results)
            self.procs.append(mp.Process(target=run_batched_consumer, args=args, daemon=True))
        for p in self.procs:
            p.start()

    def figures(self) -> dict[str, Any]:
        """Its consumers' results: messages, seconds (first consumed to last), msg/s, lost, server CPU."""
        out = [self.results.get(timeout=60) for _ in range(self.consumers)]
        sent = [self.produced.get(timeout=60) for _ in range(self.producers)]  # (read: a full pipe holds its exit)
        cpus = [s.cpu_seconds() - c0 for s, c0 in zip(self.all, self.cpu0, strict=True)]
        ends = [[b - a for a, b in zip(m, counters(s), strict=True)] for s, m in zip(self.all, self.marks, strict=True)]
        cpu = sum(cpus)
        commits, delivered, frames = (sum(e[k] for e in ends) for k in range(3))
        received = sum(r.received for r in out)
        first = min(r.first_ns for r in out if r.first_ns)
        last = max(r.last_ns for r in out)
        per = split(self.count, self.producers)
        unique = sum(1 for i, n in enumerate(per) for j in range(n) if any(r.seen[i][j] for r in out))
        seconds = max((last - first) / 1e9, 1e-9)
        errors = [r.error for r in (*sent, *out) if r.error]
        return {
            "messages": self.count,
            "received": received,
            "lost": self.count - unique,
            "duplicated": received - unique,
            "seconds": round(seconds, 6),
            "msg_s": round(received / seconds),
            "server_cpu_s": round(cpu, 4),
            "server_cpu_us": round(cpu / self.count * 1e6, 2),
            # (what a message's CPU is shared by: the messages of a commit, of a DELIVER)
            "commits": commits,
            "per_commit": round(self.count / max(commits, 1), 1),
            "per_deliver": round(delivered / max(frames, 1), 1),
            "first_ns": first,
            "last_ns": last,
            # (each server's share when the clients reach several: its CPU over the messages it delivered)
            "servers": [
                {
                    "messages": d,
                    "server_cpu_us": round(c / max(d, 1) * 1e6, 2),
                    "per_commit": round(d / max(n, 1), 1),
                    "per_deliver": round(d / max(f, 1), 1),
                }
                for c, (n, d, f) in zip(cpus, ends, strict=True)
            ],
            **({"error": errors[0]} if errors else {}),
        }


def signal_all(servers: list[PzqServer], signum: int) -> None:
    for server in servers:
        assert server.proc is not None
        server.proc.send_signal(signum)


def counters(server: PzqServer) -> tuple[int, int, int]:
    """The server's commits, batched deliveries and DELIVER messages so far (STATS)."""
    stats = client.stats(server.monitor)
    batch = stats["native_batch"]
    return int(stats["syncs"]), int(batch["delivered_total"]), int(batch["frames_total"])


def run_groups(
    groups: list[Group], args: argparse.Namespace, *, paused: Group | None = None, profile: bool = False
) -> list[dict]:
    """Run every group's clients together, released by one barrier (``paused``'s server SIGSTOPped just
    before): the figures of every group but ``paused``, whose processes are killed once the others are
    done (they were waiting on a stopped server)."""
    workers = sum(g.producers + g.consumers for g in groups)
    start = mp.Barrier(workers + 1)
    clients0 = children_cpu()
    for g in groups:
        g.spawn(start, args.window, args.batch_size, args.size)
    try:
        if paused is not None:  # (once every client connected and probed its server, as they wait to start)
            deadline = time.monotonic() + 120
            while start.n_waiting < workers and time.monotonic() < deadline:
                time.sleep(0.01)  # (a barrier says nothing when filled: this polls it)
        for g in groups:
            g.mark()
        if paused is not None:
            assert paused.server.proc is not None
            paused.server.proc.send_signal(signal.SIGSTOP)
        profiled = [s for g in groups for s in g.all] if args.profile and profile else []
        signal_all(profiled, signal.SIGUSR1)
        start.wait(timeout=120)  # (every client connected and probed its server: the clock starts)
        machine = busy()
        running = [g for g in groups if g is not paused]
        deadline = time.monotonic() + 600
        while any(not g.done.is_set() for g in running):
            for g in running:
                if g.consumed.value >= g.count or not any(p.is_alive() for p in g.procs):
                    g.done.set()
            if time.monotonic() > deadline:
                raise SystemExit("cluster_bench: a phase took more than 600 s")
            time.sleep(0.01)  # (the shared counters have no wait primitive: this is their poll)
        used, total = (b - a for a, b in zip(machine, busy(), strict=True))
        signal_all(profiled, signal.SIGUSR2)
        out = [{**g.figures(), "machine_busy_pct": round(100 * used / max(total, 1), 1)} for g in running]
    finally:
        for g in groups:
            g.done.set()
            if g is paused:
                for p in g.procs:
                    p.kill()
                assert g.server.proc is not None
                g.server.proc.send_signal(signal.SIGCONT)
            for p in g.procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(10)
    # (every client process is reaped now, the servers not yet: the children's CPU since is the clients')
    clients = children_cpu() - clients0
    for figures in out:
        figures["clients_cpu_us"] = round(clients / sum(g.count for g in running) * 1e6, 2)
    return out


def children_cpu() -> float:
    """CPU seconds of this process's children reaped so far (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def overall(figures: list[dict]) -> dict[str, Any]:
    """Several groups as one: every message received over the span from the first consumed to the last."""
    received = sum(f["received"] for f in figures)
    seconds = max((max(f["last_ns"] for f in figures) - min(f["first_ns"] for f in figures)) / 1e9, 1e-9)
    return {"received": received, "seconds": round(seconds, 6), "msg_s": round(received / seconds)}


def servers(workdir: str, count: int, listing: str, args: argparse.Namespace) -> list[PzqServer]:
    """``count`` fresh servers: one alone (``count`` 1), or shards each serving the partition of QUEUE that
    pzq.shards places on it, listed in the shard list ``listing``."""
    if count == 1:
        made = [PzqServer(args=("--queue", QUEUE), prefix=os.path.join(workdir, "one-"))]
    else:
        names = SHARD_NAMES[:count]
        placed = shards.ShardList(tuple(shards.Shard(n) for n in names)).place(QUEUE, count)
        queue_of = {shard.name: partition for partition, shard in placed}
        made = [PzqServer(args=("--queue", queue_of[n]), prefix=os.path.join(workdir, f"{n}-")) for n in names]
        with open(listing, "w") as f:
            for name, server in zip(names, made, strict=True):
                entry = shards.Shard(name, server.receive, server.send, server.consume, "", server.monitor)
                f.write(
                    "[[shard]]\n" + "".join(f'{k} = "{v}"\n' for k, v in {"name": name, **entry.endpoints()}.items())
                )
        for name, server in zip(names, made, strict=True):
            server.argv += ["--shard", name, "--cluster", listing]
    if args.profile:  # (cProfile writes its file when serve exits on the SIGTERM of close())
        labels = ["one"] if count == 1 else list(SHARD_NAMES[:count])
        for label, server in zip(labels, made, strict=True):
            server.argv[1:3] = ["-c", PROFILED, os.path.join(args.profile, f"{label}.prof")]
    for server in made:
        server.start()
    return made


def busy() -> tuple[int, int]:
    """The machine's CPU ticks so far, (busy, all), from /proc/stat: what every process used."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # (idle and iowait)
    return sum(ticks) - idle, sum(ticks)


def idle_pct(seconds: float = 1.0) -> float:
    """How idle the whole machine was over the next ``seconds`` (%), before a round starts anything: what
    the other users of its cores left to this bench."""
    first = busy()
    time.sleep(seconds)  # (a sample of the machine's load: there is nothing to wait for)
    used, total = (b - a for a, b in zip(first, busy(), strict=True))
    return round(100 - 100 * used / max(total, 1), 1)


def one_round(workdir: str, args: argparse.Namespace, index: int) -> dict[str, Any]:
    """One server, then the two shards (their clients connected to both, then split between them, then one
    stopped); every other round the shards first, so that a drift of the machine's load favours neither."""
    listing = os.path.join(workdir, "shards.toml")
    result: dict[str, Any] = {"idle_pct": idle_pct()}

    def one_server() -> None:
        (one,) = servers(workdir, 1, listing, args)
        try:
            group = Group(one, args.count, args.producers, args.consumers)
            (result["one"],) = run_groups([group], args, profile=True)
        finally:
            one.close()

    def two_shards() -> None:
        two = servers(workdir, 2, listing, args)
        try:
            # the same client processes as the one server's, each connected to both shards
            wide = Group(two[0], args.count, args.producers, args.consumers, others=two[1:])
            (result["wide"],) = run_groups([wide], args, profile=True)
            pp, cc = split(args.producers, 2), split(args.consumers, 2)
            counts = split(args.count, 2)

            def groups() -> list[Group]:
                return [Group(s, n, p, c) for s, n, p, c in zip(two, counts, pp, cc, strict=True)]

            result["shards"] = run_groups(groups(), args)
            result["two"] = overall(result["shards"])
            paused = groups()
            (result["alone"],) = run_groups(paused, args, paused=paused[0])
        finally:
            for s in two:
                s.close()

    for phase in (one_server, two_shards) if index % 2 == 0 else (two_shards, one_server):
        phase()
    one_cpu = result["one"]["server_cpu_us"]
    result["ratio"] = round(result["wide"]["msg_s"] / result["one"]["msg_s"], 3)
    result["cpu_ratio"] = [round(s["server_cpu_us"] / one_cpu, 3) for s in result["wide"]["servers"]]
    result["split_ratio"] = round(result["two"]["msg_s"] / result["one"]["msg_s"], 3)
    result["split_cpu_ratio"] = [round(s["server_cpu_us"] / one_cpu, 3) for s in result["shards"]]
    result["alone_ratio"] = round(result["alone"]["msg_s"] / result["shards"][1]["msg_s"], 3)
    return result


def show(r: dict[str, Any], label: str) -> None:
    one, wide, two, sh, alone = r["one"], r["wide"], r["two"], r["shards"], r["alone"]
    print(f"{label} (the machine {r['idle_pct']} % idle before it):")
    print(f"  one server:  {one['msg_s']:>9,} msg/s  server CPU {one['server_cpu_us']:.2f} µs/msg  lost {one['lost']}")
    busy_pct = one["machine_busy_pct"]
    print(
        f"               {one['per_commit']} msg/commit, {one['per_deliver']} msg/DELIVER, machine busy {busy_pct} %, "
        f"clients' CPU {one['clients_cpu_us']:.2f} µs/msg"
    )
    ws = wide["servers"]
    cpus = " / ".join(f"{s['server_cpu_us']:.2f}" for s in ws)
    counts = " + ".join(f"{s['messages']:,}" for s in ws)
    print(f"  two shards, every client on both: {wide['msg_s']:>9,} msg/s ({counts} messages)")
    print(f"               server CPU {cpus} µs/msg  lost {wide['lost']}")
    commits = " / ".join(f"{s['per_commit']}" for s in ws)
    delivers = " / ".join(f"{s['per_deliver']}" for s in ws)
    print(
        f"               {commits} msg/commit, {delivers} msg/DELIVER, machine busy {wide['machine_busy_pct']} %, "
        f"clients' CPU {wide['clients_cpu_us']:.2f} µs/msg"
    )
    cpus = " / ".join(f"{s['server_cpu_us']:.2f}" for s in sh)
    rates = " + ".join(f"{s['msg_s']:,}" for s in sh)
    lost = sum(s["lost"] for s in sh)
    print(f"  two shards, half the clients on each: {two['msg_s']:>9,} msg/s ({rates})")
    print(f"               server CPU {cpus} µs/msg  lost {lost}")
    commits = " / ".join(f"{s['per_commit']}" for s in sh)
    delivers = " / ".join(f"{s['per_deliver']}" for s in sh)
    print(
        f"               {commits} msg/commit, {delivers} msg/DELIVER, machine busy {sh[0]['machine_busy_pct']} %, "
        f"clients' CPU {sh[0]['clients_cpu_us']:.2f} µs/msg"
    )
    print(
        f"  s1, s0 stopped: {alone['msg_s']:>6,} msg/s  server CPU {alone['server_cpu_us']:.2f} µs/msg  "
        f"lost {alone['lost']}"
    )
    print(
        f"  two (every client on both) / one {r['ratio']:.2f}x (target >= 1.3x); CPU/msg per shard / one server "
        f"{' / '.join(f'{c:.2f}' for c in r['cpu_ratio'])} (target within 10 %); half the clients on each: "
        f"{r['split_ratio']:.2f}x, CPU {' / '.join(f'{c:.2f}' for c in r['split_cpu_ratio'])}; "
        f"s1 alone / s1 beside s0 {r['alone_ratio']:.2f} (target >= 0.90)"
    )
    for phase in (one, wide, *sh, alone):
        if phase.get("error"):
            print(f"  (a client said: {phase['error']})")


def show_profile(directory: str, count: int, s0: int, top: int = 15) -> None:
    """The functions of one server and of shard s0 that took the most CPU of their own, in µs a message
    (one server handled ``count`` messages, s0 ``s0``), side by side."""
    stats = {label: pstats.Stats(os.path.join(directory, f"{label}.prof")) for label in ("one", "s0")}
    per = {"one": count, "s0": s0}
    own: dict[str, dict[str, float]] = {}
    for label, st in stats.items():
        table = st.stats  # type: ignore[attr-defined]  # ((file, line, name) -> (calls, ncalls, tottime, ...))
        own[label] = {f"{Path(f).name}:{line} {name}": v[2] / per[label] * 1e6 for (f, line, name), v in table.items()}
    print("the loop's CPU in each function's own code, µs a message (cProfile: slower than unprofiled)")
    print(f"  {'one':>7} {'s0':>7}  function")
    for name in sorted(own["one"], key=lambda k: -max(own["one"].get(k, 0), own["s0"].get(k, 0)))[:top]:
        print(f"  {own['one'].get(name, 0):7.2f} {own['s0'].get(name, 0):7.2f}  {name}")
    print(f"  {sum(own['one'].values()):7.2f} {sum(own['s0'].values()):7.2f}  (all)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages a phase (split over the shards)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--producers", type=int, default=2, help="producer processes, in every phase")
    parser.add_argument("--consumers", type=int, default=2, help="consumer processes, in every phase")
    parser.add_argument("--window", type=int, default=100, help="messages in flight a producer (and credit)")
    parser.add_argument("--batch-size", type=int, default=100, help="messages a batch")
    parser.add_argument("--size", type=int, default=100, help="bytes a message")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each server under cProfile (slower: read its shares, not its rates); one round; the "
        "top functions of one server and of shard s0, in µs a message",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the rounds and their medians to FILE (JSON)")
    args = parser.parse_args(argv)
    if args.producers < 2 or args.consumers < 2:
        parser.error("--producers and --consumers: at least 2 (each shard gets its half)")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="pzq-cluster-bench-") as workdir:
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
            args.runs = 1
        for i in range(args.runs):
            rounds.append(one_round(workdir, args, i))
            show(rounds[-1], f"round {i + 1}")
        if args.profile:
            show_profile(args.profile, args.count, rounds[0]["wide"]["servers"][0]["messages"])
    median = {key: statistics.median(r[key] for r in rounds) for key in ("ratio", "split_ratio", "alone_ratio")}
    for key in ("cpu_ratio", "split_cpu_ratio"):
        median[key] = [statistics.median(r[key][i] for r in rounds) for i in range(2)]
    median["idle_pct"] = statistics.median(r["idle_pct"] for r in rounds)
    print(
        f"medians of {len(rounds)} (the machine {median['idle_pct']} % idle): two shards, every client on both "
        f"/ one {median['ratio']:.2f}x, CPU/msg per shard / one server "
        f"{' / '.join(f'{c:.2f}' for c in median['cpu_ratio'])}; half the clients on each "
        f"{median['split_ratio']:.2f}x, "
        f"CPU {' / '.join(f'{c:.2f}' for c in median['split_cpu_ratio'])}; one stopped, the other keeps "
        f"{median['alone_ratio']:.2f} of its rate"
    )
    summary = {"rounds": rounds, "median": median, "options": vars(args)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    sys.exit(main() and 0)
