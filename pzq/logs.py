"""Logging set-up (text or JSON lines), and logging of bad input, limited so that a flood of garbage
cannot flood the log."""
from __future__ import annotations

import collections
import datetime
import json
import logging
import sys

log = logging.getLogger("pzq.input")
_counts: collections.Counter = collections.Counter()


def warn_bad(peer: str, code: str, detail: str) -> None:
    """Log bad input from ``peer``: the first 10 of each kind, then every 1000th, with a running count."""
    _counts[peer, code] += 1
    n = _counts[peer, code]
    if n <= 10 or n % 1000 == 0:
        log.warning("bad %s input (%s, #%d): %s", peer, code, n, detail)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for journald and log shippers: time, level, logger, message (and the
    traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds"),
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
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
