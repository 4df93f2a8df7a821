"""`pzq bench --protocol emqp`: job throughput of N trivial jobs through one real eventmq JobManager,
via pzq or via eventmq's own router (the reference).

Needs eventmq 0.3.13 (scripts/test installs it), and psutil for the reference (its router imports
it). The reference broker is eventmq's own Router, run in its own process from the same installed
package (nothing of it is part of pzq). Each job appends one byte to a file, so completion is counted
the same way for both brokers (the reference never forwards REPLYs). One job is run before the clock
starts, which proves the JobManager connected and ready; the clock runs from the first of the N
defer_jobs to the N-th finished job.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pzq.bench.report import machine, medians
from pzq.bench.server import PzqServer, free_ports
from pzq.errors import PzqError

BROKERS = ("pzq", "reference")
QUEUE = "jobs"
JOB = f"{__name__}.tally"  # what the JobManager imports and runs


@dataclasses.dataclass(frozen=True)
class EmqpOptions:
    jobs: int = 5000
    concurrent: int = 4  # the JobManager's job processes
    broker: str = "both"
    server_args: tuple[str, ...] = ()
    timeout_s: float = 600.0


def tally(path: str) -> None:
    """The job: append one byte, so that the file's size counts finished jobs, whoever ran them."""
    with open(path, "ab") as f:
        f.write(b".")


def _spawn(code: str, cwd: str, name: str) -> subprocess.Popen:
    """A Python process of eventmq's, in its own session; its stderr in ``cwd/name.log``."""
    with open(os.path.join(cwd, f"{name}.log"), "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", code], cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log
        )


def _check_alive(processes: list[tuple[str, subprocess.Popen | None, str]]) -> None:
    """A broker or JobManager that died would leave the jobs waiting for the whole timeout: say so now.
    ``processes``: (name, process, its log file)."""
    for name, proc, log in processes:
        if proc is not None and proc.poll() is not None:
            try:
                with open(log, "rb") as f:
                    tail = f.read()[-400:].decode("utf-8", "replace").strip()
            except OSError:
                tail = ""
            raise PzqError(f"emqp: the {name} exited with {proc.returncode}: {tail or '(nothing in its log)'}")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its job processes too
    except ProcessLookupError:
        pass
    proc.wait(10)


def run(broker: str, options: EmqpOptions) -> dict:
    """Start the broker and one JobManager, run the jobs; the figures of that broker."""
    from eventmq.client.messages import defer_job
    from eventmq.sender import Sender

    workdir = tempfile.mkdtemp(prefix=f"pzq-bench-emqp-{broker}-")
    pzq: PzqServer | None = None
    router: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    try:
        if broker == "pzq":
            pzq = PzqServer(gateways=("emqp",), transport="ipc", args=options.server_args, prefix="pzq-bench-emqp-")
            pzq.start()
            front, back = pzq.emqp_frontend, pzq.emqp_backend
        else:
            front, back, admin = (f"tcp://127.0.0.1:{p}" for p in free_ports(3))
            router = _spawn(
                "import logging; logging.disable(logging.CRITICAL); from eventmq.router import Router; "
                f"Router().start(frontend_addr={front!r}, backend_addr={back!r}, administrative_addr={admin!r})",
                workdir,
                "router",
            )
        worker = _spawn(
            "from eventmq.jobmanager import JobManager; "
            f"JobManager(queues=[[10, {QUEUE!r}]], concurrent_jobs={options.concurrent})"
            f".jobmanager_main(broker_addr={back!r})",
            workdir,
            "jobmanager",
        )
        watched = [
            ("JobManager", worker, os.path.join(workdir, "jobmanager.log")),
            ("reference router", router, os.path.join(workdir, "router.log")),
            ("pzq server", pzq.proc if pzq else None, pzq.log if pzq else ""),
        ]
        tally_file = Path(workdir) / "tally"
        sender = Sender()
        sender.connect(front)

        def finished() -> int:
            return tally_file.stat().st_size if tally_file.exists() else 0

        def wait_for(count: int) -> None:
            deadline = time.monotonic() + options.timeout_s
            while finished() < count:
                _check_alive(watched)
                if time.monotonic() > deadline:
                    raise PzqError(f"emqp {broker}: {finished()} of {count} jobs finished in {options.timeout_s:g} s")
                if sender.zsocket.poll(10):  # ACKs: read so they do not pile up; the poll is the wait
                    sender.recv_multipart()

        defer_job(sender, JOB, args=[str(tally_file)], queue=QUEUE)
        wait_for(1)
        t0 = time.monotonic()
        for _ in range(options.jobs):
            defer_job(sender, JOB, args=[str(tally_file)], queue=QUEUE)
            while sender.zsocket.poll(0):
                sender.recv_multipart()
        wait_for(1 + options.jobs)
        seconds = time.monotonic() - t0
        done = finished() - 1
        sender.zsocket.close(0)
    finally:
        for proc in (worker, router):
            if proc is not None:
                _kill(proc)
        if pzq is not None:
            pzq.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "jobs": options.jobs,
        "finished": done,
        "seconds": round(seconds, 6),
        "jobs_s": round(options.jobs / seconds),
    }


def bench(options: EmqpOptions, echo: Callable[[str], None] = print) -> dict:
    """Each broker asked for, one after the other; a line each as it ends."""
    result = {}
    for broker in BROKERS if options.broker == "both" else (options.broker,):
        result[broker] = run(broker, options)
        echo(
            f"{broker:<10} {options.jobs} trivial jobs, one JobManager x{options.concurrent}: "
            f"{result[broker]['jobs_s']:,.0f} jobs/s"
        )
    return {"machine": machine(), "options": dataclasses.asdict(options), "runs": [result], "median": medians([result])}
