"""Logging set-up (text or JSON lines), and logging of bad input, limited so that a flood of garbage
cannot flood the log."""

from __future__ import annotations

import collections
import datetime
import json
import logging
import sys
import time

log = logging.getLogger("pzq.input")
_counts: collections.Counter = collections.Counter()
WINDOW_S = 10.0  # each kind of bad input is logged at most PER_WINDOW times per window
PER_WINDOW = 100
_windows: dict[tuple[str, str], list] = {}  # (peer, code) -> [window start, logged, not logged]


def warn_bad(peer: str, code: str, detail: str) -> None:
    """Log bad input from ``peer``, with a running count: at most PER_WINDOW of each kind every
    WINDOW_S seconds, then one line saying how many more there were. A flood costs a few lines, and
    an honest client's occasional error is always in the log."""
    key = (peer, code)
    _counts[key] += 1
    now = time.monotonic()
    window = _windows.get(key)
    if window is None or now - window[0] >= WINDOW_S:
        if window is not None and window[2]:
            log.warning("bad %s input (%s): %d more not logged in %.0f s", peer, code, window[2], now - window[0])
        window = _windows[key] = [now, 0, 0]
    if window[1] < PER_WINDOW:
        window[1] += 1
        log.warning("bad %s input (%s, #%d): %s", peer, code, _counts[key], detail)
    else:
        window[2] += 1


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for journald and log shippers: time, level, logger, message (and the
    traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: str = "text") -> None:
    """Log to standard error (journald under systemd) at ``level``, as text lines or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
