"""The web console (--http-dsn) as a child process of `pzq serve`: started, watched, restarted and stopped.

The child is `python -m pzq console`, started once the server's sockets are bound, started again when it
dies (after a wait that doubles from ``console_restart_first_s`` to ``console_restart_most_s``, back to
the first once a child has lived ``console_restart_reset_s``), stopped with the server. The broker
process serves no HTTP: the console is a monitor client like any other, and with CURVE one with a key
pair of its own, made afresh at each start, allowed in memory under the name ``console`` and handed
over on the child's stdin (never in its argv or environment, which /proc shows).

How the child goes with the server:

- a stop (SIGTERM/SIGINT, or an error path: ``Server.close``) sends it SIGTERM, then SIGKILL after
  ``console_stop_s``;
- if the server is killed outright (SIGKILL, the OOM killer), the kernel closes the server's end of the
  child's stdin pipe and the console exits at EOF (the supervisor never closes it before a stop);
  ``PR_SET_PDEATHSIG`` is a second guard (it fires when the thread that started the child ends: the
  loop's thread, which is the one that stops it anyway).

The supervisor takes no turn of the loop: the loop's once-a-second tick calls ``check(now)``, which
polls the child (one ``waitpid(WNOHANG)``) and starts it when its wait is over. A thread that waits on
the child was the other choice; it would need a lock against the stop, would start children from a
thread other than the loop's (PR_SET_PDEATHSIG follows the starting thread), and restarts measured in
seconds lose nothing to a one-second tick.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import zmq

from pzq.config import DEFAULT_LIMITS, Config, Limits

if TYPE_CHECKING:
    from pzq.curve import CurveServer

log = logging.getLogger("pzq.server")

KEY_NAME = "console"  # the name of the child's key in the server's CURVE allow-list
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Looked up here, in the parent: the forked child (preexec_fn) must not load a library or resolve a
# symbol, which may take a lock another thread of the server held at the fork.
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
if _PRCTL is not None:
    _PRCTL.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _PRCTL.restype = ctypes.c_int


def console_command() -> list[str]:
    """The program the supervisor runs: this interpreter's `python -m pzq console`."""
    return [sys.executable, "-m", "pzq", "console"]


def reachable(endpoint: str) -> str:
    """The monitor endpoint as a client on this host connects to it: a wildcard bind address (``*``,
    ``0.0.0.0``, ``::``) becomes the loopback."""
    return re.sub(r"^tcp://(\*|0\.0\.0\.0|\[::\]|::)(?=:\d+$)", "tcp://127.0.0.1", endpoint)


def _in_child(parent: int, nice: int, idle: bool) -> None:
    """Run in the forked child before exec: die with the thread that started it, at a lower priority."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the server died between the fork and the prctl: nobody would signal
            os._exit(1)
    # The broker's turns come first when the two want the same core. SCHED_IDLE, not only a nice value:
    # the console then runs only on CPU time nothing else wants. Measured (torture console-flood, 2 cores):
    # at nice +5 or +19 a flood of browsers still took the core an fsync'd producer's ack woke up on (ack
    # p99 7.5 -> 26.9 ms); under SCHED_IDLE the wake-up preempts it at once.
    if idle:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except (AttributeError, OSError):  # (not Linux, or refused: the nice value below, then)
            pass
    os.nice(nice)


def _status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class ConsoleChild:
    """Supervises the web console's process for a Config with ``http_dsn``: ``start()`` once the server's
    sockets are bound, ``check(now)`` from the loop's tick, ``stop()`` when the server stops. ``command``
    replaces `python -m pzq console` (the options are appended to it); ``curve`` is the server's CURVE,
    when the monitor socket requires a key."""

    def __init__(
        self,
        config: Config,
        *,
        curve: CurveServer | None = None,
        command: Sequence[str] | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.config = config
        self.curve = curve
        self.command = list(command) if command is not None else console_command()
        self.limits = limits
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # (monotonic) when the child now running was started
        self.starts = 0  # children started so far (the first and every restart)
        self._wait = limits.console_restart_first_s  # before the next restart
        self._start_at: float | None = None  # when the next child is due, while none runs
        self._stopped = False

    def argv(self) -> list[str]:
        """The child's command line: the interface of `pzq console` (no key material: that goes on stdin)."""
        cfg = self.config
        argv = [*self.command, "--http-dsn", cfg.http_dsn, "--monitor-dsn", reachable(cfg.monitor_dsn)]
        if cfg.http_auth_file:
            argv += ["--http-auth-file", os.path.abspath(cfg.http_auth_file)]
        if cfg.http_host_names:
            argv += ["--http-host-names", cfg.http_host_names]
        argv += ["--poll-interval", f"{self.limits.console_poll_s:g}"]
        if self.curve is not None:
            argv += ["--curve-server-key", self.curve.public.decode("ascii"), "--curve-key-stdin"]
        return argv

    def environment(self) -> dict[str, str]:
        """The server's environment, and its log settings (the console logs as the server does, to the same
        standard error, whether they came from a flag, the file or the environment). Nothing secret."""
        return {**os.environ, "PZQ_LOG_LEVEL": self.config.log_level, "PZQ_LOG_FORMAT": self.config.log_format}

    def start(self, now: float | None = None) -> None:
        """Start the child now (once the server's sockets are bound)."""
        self._spawn(time.monotonic() if now is None else now)

    def check(self, now: float) -> None:
        """From the loop's tick: notice a child that ended (logged with its status) and start the next
        one when its wait is over. Never blocks."""
        if self._stopped:
            return
        proc = self.proc
        if proc is not None:
            code = proc.poll()
            if code is None:
                return
            self.proc = None
            self._ended(proc, code, now)
        if self._start_at is not None and now >= self._start_at:
            self._spawn(now)

    def _ended(self, proc: subprocess.Popen, code: int, now: float) -> None:
        lived = now - self.started_at
        if lived >= self.limits.console_restart_reset_s:
            self._wait = self.limits.console_restart_first_s
        self._close_stdin(proc)
        self._forget_key()
        log.error(
            "web console: child pid %d %s after %.1f s%s; started again in %g s",
            proc.pid,
            _status(code),
            lived,
            " (its own lines above say why)" if code > 0 else "",
            self._wait,
        )
        self._later(now)

    def _later(self, now: float) -> None:
        self._start_at = now + self._wait
        self._wait = min(self._wait * 2, self.limits.console_restart_most_s)

    def _spawn(self, now: float) -> None:
        self._start_at = None
        key_line = b""
        if self.curve is not None:
            public, secret = zmq.curve_keypair()  # a fresh pair for each child: a dead child's key dies with it
            self.curve.allow(KEY_NAME, public)  # (before the child can connect with it)
            key_line = public + b" " + secret + b"\n"
        try:
            proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.PIPE,
                close_fds=True,
                env=self.environment(),
                # (async-signal-safe enough: see _PRCTL)
                preexec_fn=functools.partial(  # noqa: PLW1509
                    _in_child, os.getpid(), self.limits.console_nice, self.limits.console_sched_idle
                ),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self._forget_key()
            log.error("web console: cannot start %s: %s; trying again in %g s", self.command[0], exc, self._wait)
            self._later(now)
            return
        self.proc, self.started_at, self.starts = proc, now, self.starts + 1
        log.info("web console at %s: child pid %d", self.config.http_dsn.rstrip("/") + "/", proc.pid)
        if key_line and proc.stdin is not None:
            try:  # (82 bytes into an empty pipe: never blocks)
                proc.stdin.write(key_line)
                proc.stdin.flush()
            except OSError:  # the child is gone already: check() sees it
                pass
        # The write end stays open, unwritten, until stop(): its closing (ours, or the kernel's when the
        # server dies) is the child's signal to exit.

    def hangup(self) -> int | None:
        """Pass SIGHUP on to the child (it re-reads its secret); its pid, or None if none runs."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None
        proc.send_signal(signal.SIGHUP)
        return proc.pid

    def stop(self) -> None:
        """Stop the child: SIGTERM, then SIGKILL after ``console_stop_s``; no restart after this."""
        self._stopped = True
        self._start_at = None
        proc, self.proc = self.proc, None
        self._forget_key()
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.limits.console_stop_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "web console: child pid %d still running %g s after SIGTERM: killed",
                    proc.pid,
                    self.limits.console_stop_s,
                )
                proc.kill()
                proc.wait()
        self._close_stdin(proc)
        log.info("web console: child pid %d stopped (%s)", proc.pid, _status(proc.returncode))

    def _forget_key(self) -> None:
        if self.curve is not None:
            self.curve.allow(KEY_NAME, None)

    @staticmethod
    def _close_stdin(proc: subprocess.Popen) -> None:
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:  # (a broken pipe on the flush of nothing: the child is gone)
                pass
