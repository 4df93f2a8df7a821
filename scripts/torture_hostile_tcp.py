"""The torture benchmark's cases of holes found by playing the hostile client on the raw-TCP doors
(scripts/torture.py; issue 39, r10-hostile-tcp). They speak the wire themselves (nothing of pzq is
imported), so an older tree on PYTHONPATH is measured the same way."""

from __future__ import annotations

import socket
import threading
import time

from torture_wire import Server, monitor

MIB = 1 << 20


def _memory(srv: Server) -> dict:
    figures = monitor(srv.monitor, timeout_ms=10_000) or {}
    return figures.get("memory", {}) if isinstance(figures.get("memory"), dict) else {}


def mqks_deaf_pings(srv: Server, size: int, short: bool) -> str:
    """``size`` MQKS connections each pipeline `ping` lines of 60 KB (an answer as long as its line) and
    read nothing, for 8 s (1 s when short): what they are answered must stay within their shares and
    the memory bound's low-water mark, the alarm (which refuses every producer) never raised."""
    line = b" ping " + b"x" * 60_000 + b"\n"
    stop = time.monotonic() + (1.0 if short else 8.0)
    closed = [0]

    def flood() -> None:
        sock = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (a reader that never reads)
        n = 0
        try:
            while time.monotonic() < stop:
                sock.sendall(b"p%d" % n + line)
                n += 1
        except OSError:  # (closed by the server, or its writes blocked past the timeout: not read further)
            closed[0] += 1
        finally:
            sock.close()

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(size)]
    for thread in threads:
        thread.start()
    peak = 0
    while time.monotonic() < stop:
        peak = max(peak, int(_memory(srv).get("counted_bytes", 0)))
        time.sleep(0.1)
    for thread in threads:
        thread.join(10)
    memory = _memory(srv)
    peak = max(peak, int(memory.get("counted_peak_bytes", 0)))
    alarms = int(memory.get("alarms_total", 0) or 0)
    low = int(memory.get("low_water_bytes", 192 * MIB) or 192 * MIB)
    harm = " (NOT bounded: the alarm refused every producer)" if alarms else ""
    harm += " (NOT within the low-water mark)" if peak > low + size * MIB else ""
    return (
        f"{size} connections pipelining pings, reading none: memory bound peak {peak / MIB:.0f} MiB, "
        f"alarms {alarms}{harm}; {closed[0]} closed or no longer read"
    )


def _none(short: bool) -> tuple[str, ...]:
    return ()


# name: (function, full size, short size, extra `pzq serve` arguments, honest clients left out)
CASES = {
    "mqks-deaf-pings": (mqks_deaf_pings, 16, 2, _none, frozenset()),
}
