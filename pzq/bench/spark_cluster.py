"""A Spark standalone cluster on this machine: a master and workers started from pyspark's own launcher
(``bin/spark-class``, as docs/spark.md tells operators to), for the cluster tests and the Spark figures.

Everything binds 127.0.0.1 on free ports; logs, work dirs and scratch space live under ``root``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pzq.errors import PzqError


def spark_home() -> Path:
    """pyspark's install: its wheel carries bin/, jars/ and the launcher."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    """Signal ``proc``'s process group (it leads one), wait with a timeout, then SIGKILL whatever is
    left of it (executors and Python workers a JVM started)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class StandaloneCluster:
    """``with StandaloneCluster(root, workers=2) as cluster:`` -- ``cluster.url`` is what
    ``--master`` takes; the master's JSON is ``cluster.state()``."""

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g", timeout_s: float = 90):
        self.root, self.workers, self.cores, self.memory, self.timeout_s = root, workers, cores, memory, timeout_s
        self.logs, conf, local = root / "logs", root / "conf", root / "local"
        for d in (self.logs, conf, local):
            d.mkdir(parents=True, exist_ok=True)
        self.env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf),  # empty: no spark-defaults.conf of this machine applies
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(local),
            "SPARK_LOG_DIR": str(self.logs),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # no unauthenticated REST server on 6066
            "PYSPARK_PYTHON": sys.executable,  # executors' Python workers: this interpreter, which has pzq
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        self.procs: list[subprocess.Popen] = []
        self.work_dirs: list[Path] = []
        self.url = ""
        self.webui = 0

    def __enter__(self) -> StandaloneCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        spark_class = spark_home() / "bin" / "spark-class"
        if not os.access(spark_class, os.X_OK):
            raise PzqError(f"pyspark has no launcher at {spark_class}")
        master_log = self.logs / "master.log"
        master = self._spawn(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
            + ["--port", str(_free_port()), "--webui-port", str(_free_port())],
            master_log,
        )
        # A port taken meanwhile makes Spark try the next one: read the ports it really bound.
        self.url = self._wait_for_log(master, master_log, r"Starting Spark master at (spark://\S+)")[1]
        self.webui = int(self._wait_for_log(master, master_log, r"MasterWebUI.* started at http://[^:/]+:(\d+)")[1])
        self._wait_for_log(master, master_log, r"I have been elected leader")
        for i in range(1, self.workers + 1):
            work = self.root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self.work_dirs.append(work)
            argv = [str(spark_class), "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1"]
            argv += ["--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(_free_port())]
            self._spawn([*argv, "--work-dir", str(work)], self.logs / f"worker-{i}.log")
        deadline = time.monotonic() + self.timeout_s
        while self.state().get("aliveworkers") != self.workers:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise PzqError(f"a Spark cluster process exited {proc.returncode}; logs in {self.logs}")
            if time.monotonic() > deadline:
                raise PzqError(f"the Spark workers did not register within {self.timeout_s} s; logs in {self.logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers (and their executors) first, then the master
            stop_group(proc)
        self.procs.clear()

    def state(self) -> dict:
        """The master's JSON (workers, applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui}/json/", timeout=5) as reply:
            return json.loads(reply.read())

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        self.procs.append(proc)
        return proc

    def _wait_for_log(self, proc: subprocess.Popen, log: Path, pattern: str) -> re.Match:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise PzqError(f"{log.name}: exited {proc.returncode}: {log.read_text(errors='replace')[-3000:]}")
            match = re.search(pattern, log.read_text(errors="replace"))
            if match:
                return match
            time.sleep(0.1)
        raise PzqError(f"{log.name}: no {pattern!r} within {self.timeout_s} s")
