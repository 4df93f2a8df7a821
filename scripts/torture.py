#!/usr/bin/env python3
"""Torture benchmark: hostile clients against a fresh `pzq serve` each, with one honest client per
protocol running beside them, each in its own process (native producer with a window of 1, native
consumer, PHPMQ, MQKS, eMQP request to a worker, API produce). Every case prints a markdown table row:
what the hostile client achieved, each honest client's wait p50/p99/longest in ms, the server's peak
anonymous RSS (RssAnon: LMDB's file-backed pages left out), and PASS/FAIL against the targets
(p99 <= 50 ms, longest <= 100 ms, RSS < 512 MiB; a case whose outcome says NOT, its own honest
victim harmed, fails too).

    PYTHONPATH=$PWD .venv/bin/python scripts/torture.py            # every case, full size
    PYTHONPATH=$PWD .venv/bin/python scripts/torture.py --short    # small sizes (CI's smoke run)
    PYTHONPATH=$PWD .venv/bin/python scripts/torture.py --case emqp-bad-cron --case big-messages
    PYTHONPATH=$PWD .venv/bin/python scripts/torture.py --before db15207   # that revision's server
    git archive db15207 | tar -x -C /tmp/old && PYTHONPATH=/tmp/old .venv/bin/python scripts/torture.py

The hostile and honest clients speak the wire themselves (nothing of pzq is imported), so the same
script measures whichever tree is on PYTHONPATH: `python -m pzq serve` is that tree's server.
--strict exits 1 when a case fails its targets; otherwise the exit code is 0 whatever was measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torture_cases as cases  # noqa: E402 - the script's own directory, whatever the working one
import torture_doors as doors  # noqa: E402
import torture_emqp as emqp_cases  # noqa: E402
import torture_hostile_tcp  # noqa: E402
import torture_kept as kept  # noqa: E402
import torture_monitor  # noqa: E402
import torture_mqks as mqks  # noqa: E402
import torture_native as native  # noqa: E402
import torture_pipes as pipes  # noqa: E402
import torture_queues  # noqa: E402
import torture_routes  # noqa: E402
import torture_shards  # noqa: E402
from torture_wire import CLIENTS, HonestClients, Server  # noqa: E402

P99_MS, LONGEST_MS, RSS_MIB = 50.0, 100.0, 512.0


def _none(short: bool) -> tuple[str, ...]:
    return ()


def _partial_args(short: bool) -> tuple[str, ...]:
    return ("--max-partial-input", cases.partial_limit(short)[0], *_big_args(short))


def _big_args(short: bool) -> tuple[str, ...]:
    return ("--max-message-size", "16M")  # (messages of MiBs: the default before 1M)


def _publish_args(short: bool) -> tuple[str, ...]:
    return (*emqp_cases.publish_args(short), *_big_args(short))  # (PUBLISHes of 1 MiB and their framing)


def _console_args(short: bool) -> tuple[str, ...]:
    return ("--http-dsn", "{http}", *_big_args(short))  # (its queue's messages are 4 MiB)


def _queues_args(short: bool) -> tuple[str, ...]:
    return ("--max-queues", "150") if short else ()


def _connections_args(short: bool) -> tuple[str, ...]:
    return ("--max-connections", "100" if short else "1000")


def _gc_args(short: bool) -> tuple[str, ...]:
    return ("--gc-whole-interval", "2")  # (the whole walk every 2 s rather than every 10 minutes)


NO_NATIVE_CONSUMER = frozenset({"native-cons"})  # (the case's own consumers are what it measures)

# name: (function, full size, short size, extra `pzq serve` arguments, honest clients left out)
CASES = {
    "baseline": (cases.baseline, 3, 1, _none, frozenset()),
    "emqp-bad-cron": (cases.emqp_bad_cron, 1_000, 50, _none, frozenset()),
    "emqp-bad-cron-2500": (cases.emqp_bad_cron, 2_500, 100, _none, frozenset()),
    "cron-seconds": (cases.cron_seconds, 3_000, 100, _none, frozenset()),
    "emqp-big-headers": (cases.emqp_big_headers, 1, 1, _none, frozenset()),
    "emqp-big-headers-3": (cases.emqp_big_headers, 3, 2, _none, frozenset()),
    "api-produce-2^20": (cases.api_produce_items, 1 << 20, 1 << 16, _none, frozenset()),
    "api-info-nils": (cases.api_info_nils, 15, 2, _none, frozenset()),
    "mqks-rebind": (cases.mqks_rebind, 20, 3, _none, frozenset()),
    "mqks-rebind-2conn": (cases.mqks_rebind_two, 20, 4, _none, frozenset()),
    "big-messages": (cases.big_messages, 60, 4, _big_args, frozenset()),
    "partial-input": (cases.partial_input, 5, 5, _partial_args, frozenset()),
    "mqks-queues": (cases.mqks_queues, 11, 2, _queues_args, frozenset()),
    "max-connections": (cases.max_connections, 1_150, 115, _connections_args, frozenset()),
    "late-acker": (cases.late_acker, 80_000, 10_000, _none, NO_NATIVE_CONSUMER),
    "snapshot-30": (cases.snapshot_readers, 30, 4, _none, frozenset()),
    "snapshot-80": (cases.snapshot_readers, 80, 8, _none, frozenset()),
    "deaf-producer": (kept.deaf_producer, 40_000, 5_000, _none, frozenset()),
    "greedy-consumer": (kept.greedy_consumer, 40_000, 5_000, _none, frozenset()),
    "api-pipeline": (kept.api_pipeline, 60, 3, _none, frozenset()),
    "many-frames": (kept.many_frames, 5, 1, _none, frozenset()),
    "big-lease": (kept.big_lease, 200_000, 20_000, _none, frozenset()),
    "stream-read": (kept.stream_read, 1_000_000, 20_000, _none, frozenset()),
    "mqks-consumers": (kept.mqks_consumers, 2_000, 200, _none, frozenset()),
    "console-flood": (kept.console_flood, 20, 1, _console_args, frozenset()),
    "monitor-peek-flood": (kept.monitor_peek_flood, 16, 4, _none, frozenset()),
    **torture_monitor.CASES,
    **torture_hostile_tcp.CASES,
    **torture_queues.CASES,
    **torture_routes.CASES,
    **torture_shards.CASES,
    "emqp-deaf-subscriber": (emqp_cases.emqp_deaf_subscriber, 700, 20, _publish_args, frozenset()),
    "emqp-deaf-worker": (emqp_cases.emqp_deaf_worker, 700, 4, _big_args, frozenset()),
    "phpmq-deaf-consumer": (doors.phpmq_deaf_consumer, 700, 20, _big_args, frozenset()),
    "phpmq-big": (doors.phpmq_big, 3, 1, _big_args, frozenset()),
    "emqp-big": (doors.emqp_big, 3, 1, _big_args, frozenset()),
    "api-big": (doors.api_big, 3, 1, _big_args, frozenset()),
    "api-produce-big": (doors.api_produce_big, 2_000, 400, _none, frozenset()),
    "mqks-updates": (mqks.updates, 1_000, 20, _none, frozenset()),
    "mqks-fanout": (mqks.fanout, 100, 5, _big_args, frozenset()),
    "mqks-delete-queue": (mqks.delete_queue, 200_000, 2_000, _none, frozenset()),
    "mqks-costly-lines": (mqks.costly_lines, 30, 3, _none, frozenset()),
    "mqks-big-publish": (mqks.big_publish, 1, 1, _big_args, frozenset()),
    "mqks-bindings-gc": (mqks.bindings_gc, 880_000, 20_000, _gc_args, frozenset()),
    # (its 128,000 messages go to the queue the honest native consumer reads: that one waits its turn in FIFO order)
    "pipes-64-producers": (pipes.many_producers, 64, 16, _none, NO_NATIVE_CONSUMER),
    "pipes-oversized": (pipes.oversized_pipeline, 60, 4, _none, frozenset()),
    "native-send-deaf": (native.native_send_deaf, 700, 24, _big_args, NO_NATIVE_CONSUMER),
}


def figures(waits: list[float]) -> tuple[float, float, float]:
    """p50, p99 and longest, in ms."""
    if not waits:
        return 0.0, 0.0, 0.0
    ordered = sorted(waits)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000, ordered[-1] * 1000


def run_case(name: str, size: int, short: bool) -> tuple[str, bool]:
    """One case on a fresh server: its table row, and whether it met every target."""
    func, _, _, extra, skip = CASES[name]
    srv = Server(*extra(short))
    kinds = [kind for kind in CLIENTS if kind not in skip]
    try:
        honest = HonestClients(srv, kinds)
        srv.begin()
        try:
            outcome = func(srv, size, short)
        except Exception as exc:  # noqa: BLE001 - one case's failure is its row, the next case still runs
            outcome = f"case failed: {type(exc).__name__}: {str(exc)[:80]}"
        time.sleep(max(0.0, srv.began + (0.3 if short else 2.0) - time.monotonic()))  # (what comes after it)
        if not srv.alive():
            outcome += f" (server exited {srv.proc.returncode})"
        results = honest.finish(srv.began)
        rss = srv.peak_anon_kb / 1024
    finally:
        srv.close()
    cells, ok = [], rss < RSS_MIB and "NOT " not in outcome  # (a case's own honest victim harmed)
    for kind in CLIENTS:
        if kind in skip:
            cells.append("-")
            continue
        waits, lost = results.get(kind, ([], "no report"))
        if isinstance(lost, str):
            cells.append(f"error: {lost[:40]}")
            ok = False
            continue
        p50, p99, longest = figures(waits)
        ok = ok and bool(waits) and p99 <= P99_MS and longest <= LONGEST_MS and not lost
        cells.append(f"{p50:.1f}/{p99:.1f}/{longest:.0f}" + (f" ({lost} lost)" if lost else "") + f" n={len(waits)}")
    verdict = "PASS" if ok else "FAIL"
    return f"| {name} | {outcome.replace('|', '/')} | " + " | ".join(cells) + f" | {rss:.0f} | {verdict} |", ok


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--short", action="store_true", help="small sizes (a smoke run, under a minute)")
    parser.add_argument("--case", choices=list(CASES), action="append", help="run only these cases")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a case misses a target")
    parser.add_argument("--before", metavar="REV", help="serve a `git archive` of this revision of the repo instead")
    args = parser.parse_args()
    if args.before:
        return _run_before(args.before)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # (the connection cases hold over 1,000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    print(
        f"pzq from {_pzq_origin()}; targets: honest p99 <= {P99_MS:g} ms, longest <= {LONGEST_MS:g} ms, "
        f"server RssAnon < {RSS_MIB:g} MiB; cells are p50/p99/longest ms, n = operations measured",
        flush=True,
    )
    print("| case | hostile outcome | " + " | ".join(CLIENTS) + " | RssAnon MiB | targets |", flush=True)
    print("|---|---|" + "---|" * len(CLIENTS) + "---|---|", flush=True)
    failed = 0
    for name in args.case or CASES:
        _, full, small, _, _ = CASES[name]
        row, ok = run_case(name, small if args.short else full, args.short)
        failed += not ok
        print(row, flush=True)
    print(f"{failed} case(s) missed a target", flush=True)
    return 1 if args.strict and failed else 0


def _pzq_origin() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pzq")
    return os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else "nowhere (pzq not importable)"


def _run_before(rev: str) -> int:
    """This same script, run again with PYTHONPATH on a `git archive` of ``rev`` (so `python -m pzq
    serve` is that revision's server), the other arguments kept."""
    import shutil
    import subprocess
    import tempfile

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tree = tempfile.mkdtemp(prefix=f"pzq-torture-{rev}-")
    try:
        archive = subprocess.run(["git", "-C", repo, "archive", rev], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--before" and sys.argv[i] != "--before"]
        argv = [a for a in argv if not a.startswith("--before=")]
        env = dict(os.environ, PYTHONPATH=tree)
        return subprocess.run([sys.executable, os.path.abspath(__file__), *argv], env=env, cwd=tree).returncode
    finally:
        shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
