"""A `pzq serve` subprocess to measure: a fresh temp store, free loopback ports, started and waited for
until its monitor answers, stopped, its files removed. Every benchmark and scripts/torture.py use it.

Gateways not asked for are disabled, so that a measurement never depends on which ports happen to be
free, and two runs side by side never meet.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence

from pzq.clients import native as client
from pzq.errors import ClientError, PzqError

GATEWAYS = ("phpmq", "emqp", "api", "mqks")


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now (held together while asked, so never the same), below
    the kernel's ephemeral range: a port of that range, free when asked, may be taken by any outgoing
    connection before its server binds it (a busy machine's etcd and HTTP clients make many), and a
    client then reconnects for ever to something that never answers (seen: a bench consumer's HELLO
    unanswered for 120 s in a full test run)."""
    low = _ephemeral_low()
    socks: list[socket.socket] = []
    try:
        for port in random.sample(range(10_000, low), min(low - 10_000, 64 * n)):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            if len(socks) == n:
                return [s.getsockname()[1] for s in socks]
        raise PzqError(f"no {n} free loopback ports between 10000 and {low}")
    finally:
        for s in socks:
            s.close()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(10_100, min(int(f.read().split()[0]), 65_535))
    except (OSError, ValueError, IndexError):
        return 32_768


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 once it is gone), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of /proc/PID/status (VmRSS now, VmHWM the peak) in MB; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PzqServer:
    """One `pzq serve` on a temp directory that holds its store, its ipc sockets and its log.

    ``transport`` is that of the native and monitor endpoints (tcp or ipc); ``gateways`` names the
    other protocols to serve on loopback TCP (phpmq, emqp, api, mqks), the API on ipc if
    ``api_transport`` says so; ``args`` go to `pzq serve` last. ``code`` is another pzq source tree to
    run instead of this one (a folder holding its ``pzq`` package, e.g. an older release unpacked by
    ``git archive``: scripts/compare_peers.py --before); its server is not given ``--consume-dsn`` when
    it has no batched consume endpoint (``consume`` False).
    """

    def __init__(
        self,
        *,
        gateways: Iterable[str] = (),
        transport: str = "tcp",
        api_transport: str = "tcp",
        args: Sequence[str] = (),
        prefix: str = "pzq-bench-",
        code: str | None = None,
        consume: bool = True,
    ):
        gateways = set(gateways)
        if gateways - set(GATEWAYS):
            raise ValueError(f"unknown gateways {sorted(gateways - set(GATEWAYS))}")
        self.workdir = tempfile.mkdtemp(prefix=prefix)
        self.database = os.path.join(self.workdir, "db")
        self.log = os.path.join(self.workdir, "server.log")
        ports = iter(free_ports(4 + len(gateways) + 1))  # at most: native and monitor, gateways, emqp's second
        if transport == "ipc":
            names = ("r", "s", "m", "c")
            self.receive, self.send, self.monitor, self.consume = (f"ipc://{self.workdir}/{n}" for n in names)
        else:
            self.receive, self.send, self.monitor, self.consume = (f"tcp://127.0.0.1:{next(ports)}" for _ in range(4))

        def tcp(name: str) -> str:
            return f"tcp://127.0.0.1:{next(ports)}" if name in gateways else ""

        self.phpmq, self.mqks = tcp("phpmq"), tcp("mqks")
        self.api = f"ipc://{self.workdir}/api" if api_transport == "ipc" and "api" in gateways else tcp("api")
        self.emqp_frontend = tcp("emqp")
        self.emqp_backend = f"tcp://127.0.0.1:{next(ports)}" if self.emqp_frontend else ""
        self.argv = [
            *(sys.executable, "-m", "pzq", "serve", "--database", self.database, "--log-level", "warning"),
            *("--receive-dsn", self.receive, "--send-dsn", self.send, "--monitor-dsn", self.monitor),
            *(("--consume-dsn", self.consume) if consume else ()),  # (batched consumers: PZQ-BATCH/1)
            *("--phpmq-dsn", self.phpmq, "--api-dsn", self.api, "--mqks-dsn", self.mqks),
            *("--emqp-frontend-dsn", self.emqp_frontend, "--emqp-backend-dsn", self.emqp_backend),
            *("--emqp-publish-dsn", ""),
            *args,
        ]
        self.code = code
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> float:
        """Start, and return the seconds until MONITOR answered (the store is open, every socket bound)."""
        t0 = time.monotonic()
        env, cwd = None, None
        if self.code:  # (`python -m` puts its working directory first on the path: not this pzq's)
            env, cwd = {**os.environ, "PYTHONPATH": self.code}, self.workdir
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, env=env, cwd=cwd
            )
        while True:
            if self.proc.poll() is not None:
                raise PzqError(f"pzq serve exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                client.monitor_request(self.monitor, timeout_s=0.1)
                return time.monotonic() - t0
            except ClientError:
                if time.monotonic() - t0 > timeout_s:
                    self.stop(kill=True)
                    raise PzqError(
                        f"pzq serve did not answer MONITOR within {timeout_s:g} s: {self._log_tail()}"
                    ) from None

    def stop(self, *, kill: bool = False, timeout_s: float = 30) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); ``kill``: SIGKILL at once."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if not kill:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
                return
            except subprocess.TimeoutExpired:
                pass
        self.proc.kill()
        self.proc.wait()

    def close(self, *, kill: bool = False) -> None:
        """Stop, and remove the store and everything else of this server."""
        self.stop(kill=kill)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PzqServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    def rss_mb(self) -> float:
        return memory_mb(self.proc.pid) if self.proc is not None else 0.0

    def peak_rss_mb(self) -> float:
        return memory_mb(self.proc.pid, "VmHWM") if self.proc is not None else 0.0

    def commits(self) -> int:
        return int(client.stats(self.monitor)["syncs"])

    def meta_syncs(self) -> int:
        """Meta pages synced on their own (0 from a pzq older than one sync a commit)."""
        return int(client.stats(self.monitor).get("meta_syncs_total", 0))

    def depth(self, queue: str) -> int:
        """Messages stored in ``queue`` and not yet acked (0 for a queue not made yet)."""
        return int(client.stats(self.monitor)["queues"].get(queue, {}).get("depth", 0))

    def _log_tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                tail = f.read()[-600:].decode("utf-8", "replace").strip()
        except OSError:
            tail = ""
        return tail or "(nothing in its log)"
