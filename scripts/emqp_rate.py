#!/usr/bin/env python3
"""Job throughput of N trivial jobs through one real eventmq JobManager, via pzq or the reference router.

    .venv/bin/python scripts/emqp_rate.py [--jobs 5000] [--concurrent 4] [--broker pzq|reference|both]

Needs eventmq 0.3.13 (installed by scripts/test), and psutil for the reference (pip install psutil: its
router imports it). The reference broker is eventmq's own Router, run in
its own process from the same installed package (nothing of it is committed here). Each job appends one
byte to a file, so completion is counted the same way for both brokers (the reference never forwards
REPLYs). The clock runs from the first defer_job to the N-th finished job.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"


def free_ports(n: int) -> list[int]:
    from pzq.bench.native import _free_ports

    return _free_ports(n)


def start_pzq(workdir: str, front: str, back: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            os.path.join(workdir, "db"),
            "--receive-dsn",
            f"ipc://{workdir}/r",
            "--send-dsn",
            f"ipc://{workdir}/s",
            "--monitor-dsn",
            f"ipc://{workdir}/m",
            "--phpmq-dsn",
            "",
            "--emqp-publish-dsn",
            "",
            "--api-dsn",
            "",
            "--mqks-dsn",
            "",
            "--emqp-frontend-dsn",
            front,
            "--emqp-backend-dsn",
            back,
            "--log-level",
            "warning",
        ],
        start_new_session=True,
    )


def start_reference(workdir: str, front: str, back: str) -> subprocess.Popen:
    code = (
        "import logging; logging.disable(logging.CRITICAL);"
        "from eventmq.router import Router; "
        f"Router().start(frontend_addr={front!r}, backend_addr={back!r}, "
        f"administrative_addr='tcp://127.0.0.1:{free_ports(1)[0]}')"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=workdir,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def run(broker: str, jobs: int, concurrent: int) -> float:
    from eventmq.client.messages import defer_job
    from eventmq.sender import Sender

    workdir = tempfile.mkdtemp(prefix=f"pzq-emqp-rate-{broker}-")
    ports = free_ports(2)
    front, back = (f"tcp://127.0.0.1:{p}" for p in ports)
    server = (start_pzq if broker == "pzq" else start_reference)(workdir, front, back)
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    worker = subprocess.Popen(
        [sys.executable, "-m", "eventmq_app.worker", back, "jobs", str(concurrent)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tally = Path(workdir) / "tally"
    try:
        time.sleep(2)  # let the JobManager INFORM and hear a heartbeat before the clock starts
        sender = Sender()
        sender.connect(front)
        t0 = time.monotonic()
        for _ in range(jobs):
            defer_job(sender, "eventmq_app.jobs.tally", args=[str(tally)], queue="jobs")
            while sender.zsocket.poll(0):
                sender.recv_multipart()  # ACKs: read so they do not pile up
        deadline = time.monotonic() + 600
        while (tally.stat().st_size if tally.exists() else 0) < jobs:
            if time.monotonic() > deadline:
                raise SystemExit(f"{broker}: only {tally.stat().st_size} of {jobs} jobs finished in 600 s")
            while sender.zsocket.poll(0):
                sender.recv_multipart()
            time.sleep(0.01)
        return jobs / (time.monotonic() - t0)
    finally:
        for proc in (worker, server):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrent", type=int, default=4, help="the JobManager's job processes")
    parser.add_argument("--broker", choices=["pzq", "reference", "both"], default="both")
    args = parser.parse_args()
    for broker in ["pzq", "reference"] if args.broker == "both" else [args.broker]:
        rate = run(broker, args.jobs, args.concurrent)
        print(f"{broker:<10} {args.jobs} trivial jobs, one JobManager x{args.concurrent}: {rate:,.0f} jobs/s")


if __name__ == "__main__":
    main()
