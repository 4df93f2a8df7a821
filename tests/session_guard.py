"""The test session always ends, whatever a failed test left behind (issue 25, item 6).

A test that times out or fails midway can leave open what its fixtures never got to close: a ZeroMQ
socket with unsent messages and linger -1 (collecting its context then blocks in ``zmq_ctx_term()``
for ever), a local Spark session with its JVM and py4j threads, a subprocess server, a non-daemon
thread. Any one of them turned a failed run of ``scripts/test`` into a job that ran to its CI limit.
tests/conftest.py wires these guards into pytest's hooks:

- ``never_block_on_collection()``: a context collected with sockets still open closes them with
  linger 0 (pyzmq keeps their linger, so a pending send blocks the garbage collector);
- ``clean_up()`` at session finish: stops Spark and its JVM, kills the children still alive (each
  subprocess server leads its own process group: the group goes), then closes every socket of every
  context with linger 0 and destroys the contexts;
- ``Watchdog``: a daemon thread that ends the process with pytest's exit status if the interpreter
  has not exited in time after the summary (a non-daemon thread, an atexit handler that hangs).
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import time

import zmq
from zmq.sugar import context as zmq_context

EXIT_GRACE_S = 20.0  # from the summary to the end of the process: more means something hangs
CLEANUP_S = 60.0  # teardown left by an interrupted run, the clean-up, the summary (Spark stops in seconds)


def never_block_on_collection() -> None:
    """Collecting an unclosed socket or context closes with linger 0, never with the socket's own:
    pyzmq keeps it, and a socket with linger -1 and a pending send blocks its context's term for
    ever (when both are garbage, the socket is often finalized first: closing the context's sockets
    afterwards is too late)."""

    def socket_del(self: zmq.Socket) -> None:
        if not getattr(self, "_shadow", True) and not self.closed:
            self.close(linger=0)

    def context_del(self: zmq.Context) -> None:
        # (pyzmq's own checks; at interpreter exit pyzmq leaves contexts alone, and so do we)
        if not getattr(self, "_shadow", True) and not self.closed and not zmq_context._exiting:
            terminate(self)

    zmq.Socket.__del__ = socket_del  # type: ignore[method-assign]
    zmq.Context.__del__ = context_del  # type: ignore[method-assign]


def terminate(ctx: zmq.Context, wait_s: float = 2.0) -> bool:
    """Close ``ctx``'s open sockets with linger 0 and terminate it, waiting at most ``wait_s``: a
    socket a test closed itself with linger -1 and unsent messages would block the term for ever, so
    it runs in a daemon thread that the process may leave behind. False if it did not finish."""
    for sock in list(ctx._sockets):
        if not sock.closed:
            sock.close(linger=0)
    term = threading.Thread(target=ctx.term, name="pzq-tests-zmq-term", daemon=True)
    term.start()
    term.join(wait_s)
    return not term.is_alive()


def clean_up() -> list[str]:
    """Release everything a test may have left; returns what was found, for the report."""
    found: list[str] = []
    for step in (_stop_spark, _reap_children, _close_zmq):
        try:
            found += step()
        except Exception as exc:  # noqa: BLE001 - one failing step must not keep the others from running
            found.append(f"{step.__name__} failed: {exc!r}")
    return found


def _stop_spark() -> list[str]:
    if "pyspark" not in sys.modules:
        return []
    from pyspark import SparkContext

    found = []
    context = SparkContext._active_spark_context
    gateway = SparkContext._gateway
    try:
        if context is not None:  # (its session goes with it; asking the JVM for the session may fail)
            found.append("a Spark session was still running")
            context.stop()
    finally:
        if gateway is not None:  # pyspark keeps its JVM for the next session until the process exits
            proc = getattr(gateway, "proc", None)
            SparkContext._gateway = SparkContext._jvm = None
            try:
                gateway.shutdown()
            finally:
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
    return found


def _children() -> list[int]:
    """The pids of this process's live children (from /proc: no dependency for it)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry))
    return found


def _reap_children() -> list[str]:
    found = []
    for pid in _children():
        found.append(f"child process {pid} was still running")
        try:
            if os.getpgid(pid) == pid:  # a subprocess server (start_new_session): its whole group goes
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        try:
            os.waitpid(pid, 0)  # (SIGKILL: at once; the watchdog bounds even this)
        except ChildProcessError:  # reaped by its Popen meanwhile
            pass
    return found


def _close_zmq() -> list[str]:
    found = []
    # pyzmq's thread that lets go of buffers sent without a copy has its own context: stopped its own
    # way first, or it dies of ContextTerminated below
    from zmq.utils.garbage import gc as zero_copy

    zero_copy.stop()
    contexts = [o for o in gc.get_objects() if isinstance(o, zmq.Context)]
    if zmq.Context._instance is not None:
        contexts.append(zmq.Context._instance)
    for ctx in {id(c): c for c in contexts}.values():
        if ctx.closed or ctx._shadow or ctx is _zero_copy_context():
            continue
        left = [s for s in list(ctx._sockets) if not s.closed]
        if left:
            found.append(f"{len(left)} ZeroMQ socket(s) were still open")
        if not terminate(ctx):
            found.append("a ZeroMQ context could not be terminated (a socket closed with linger -1 holds messages)")
    return found


def _zero_copy_context() -> zmq.Context | None:
    """The context of pyzmq's own thread that lets go of buffers sent without a copy (the monitor's
    STATS): its two sockets are pyzmq's, open while the process lives, and stopped by pyzmq at exit."""
    from zmq.utils import garbage

    return garbage.gc._context


class Watchdog:
    """Ends the process with ``status`` once ``deadline_s`` has passed, unless it ended by itself."""

    def __init__(self) -> None:
        self.status = 0
        self.deadline = float("inf")
        self._moved = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pzq-tests-watchdog", daemon=True)

    def disarm(self) -> None:
        """No countdown (until the next ``arm``)."""
        self.deadline = float("inf")
        self._moved.set()

    def arm(self, status: int, after_s: float) -> None:
        """(Re)start the countdown: ``after_s`` from now, then exit with ``status``."""
        self.status, self.deadline = int(status), time.monotonic() + after_s
        self._moved.set()
        if not self._thread.is_alive():
            self._thread.start()

    def _run(self) -> None:
        while (left := self.deadline - time.monotonic()) > 0:
            self._moved.wait(None if left == float("inf") else left)  # (disarmed: wait for the next arm)
            self._moved.clear()
        alive = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        sys.stderr.write(
            f"\ntests: the process did not exit in time after the session (threads alive: {alive}); "
            f"ending it with pytest's status {self.status}\n"
        )
        faulthandler.dump_traceback(all_threads=True)  # where it hangs, for whoever reads the log
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001,S110 - a closed stream: nothing more to say
                pass
        os._exit(self.status)
