"""Logging set-up (text or JSON lines), and logging of bad input, limited so that a flood of garbage
cannot flood the log."""

from __future__ import annotations

import collections
import datetime
import hashlib
import json
import logging
import os
import sys
import time
import traceback

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


class Throttled:
    """One kind of repeated failure, logged as one line at most every ``every_s`` seconds: the first
    at once, later ones with how many happened since the last line (a full disk fails every turn)."""

    def __init__(self, logger: logging.Logger, every_s: float):
        self.logger = logger
        self.every_s = every_s
        self.total = 0
        self._logged_at: float | None = None
        self._since = 0  # failures not logged since the last line

    def error(self, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at ERROR unless a line was logged less than every_s ago; True if logged.
        The traceback of the exception being handled goes to DEBUG only."""
        self.total += 1
        now = time.monotonic()
        self.logger.debug("the traceback of: " + msg, *args, exc_info=True)
        if self._logged_at is not None and now - self._logged_at < self.every_s:
            self._since += 1
            return False
        more = f" ({self._since} more failed since the last line)" if self._since else ""
        self.logger.error(msg + more, *args)
        self._logged_at, self._since = now, 0
        return True


class EventTally:
    """Per-message events (a message dead-lettered, with its reason) counted per queue and logged as one
    INFO line per queue every ``every_s`` seconds, e.g. ``queue 'q': 3,016 dead-lettered (max-deliveries),
    12 dead-lettered (expired) in the last 10 s``: a flood of poison messages costs a line per queue per
    interval, not one per message (those stay at DEBUG). At most ``queues`` lines an interval; the other
    queues' events are summed in one more line."""

    def __init__(self, logger: logging.Logger, every_s: float, queues: int):
        self.logger = logger
        self.every_s = every_s
        self.queues = queues
        self._counts: dict[str, collections.Counter] = {}
        self._since: float | None = None  # when the first event not yet logged happened

    def add(self, queue: str, what: str, n: int = 1) -> None:
        """Count ``n`` events ``what`` (e.g. 'dead-lettered (expired)') of ``queue``."""
        if self._since is None:
            self._since = time.monotonic()
        counts = self._counts.get(queue)
        if counts is None:
            counts = self._counts[queue] = collections.Counter()
        counts[what] += n

    def tick(self, now: float) -> None:
        """Log what was counted once the interval since the first of it has passed (the server's tick)."""
        if self._since is not None and now - self._since >= self.every_s:
            self.flush(now)

    def flush(self, now: float | None = None) -> int:
        """Log what was counted (one line per queue) and start again; the number of lines logged."""
        if self._since is None:
            return 0
        now = time.monotonic() if now is None else now
        seconds = f"in the last {max(1, round(now - self._since))} s"
        queues = sorted(self._counts.items(), key=lambda item: -sum(item[1].values()))
        for queue, counts in queues[: self.queues]:
            self.logger.info("queue %r: %s %s", queue, _listed(counts), seconds)
        rest: collections.Counter = collections.Counter()
        for _, counts in queues[self.queues :]:
            rest.update(counts)
        if rest:
            self.logger.info("%s more queue(s): %s %s", f"{len(queues) - self.queues:,}", _listed(rest), seconds)
        self._counts.clear()
        self._since = None
        return min(len(queues), self.queues) + bool(rest)


def _listed(counts: collections.Counter) -> str:
    return ", ".join(f"{n:,} {what}" for what, n in counts.most_common())


def escape(text: str) -> str:
    """``text`` with every character that is not printable (newlines, carriage returns, tabs, escape
    sequences, Unicode line separators) written as its Python escape, so that client text in a log
    line can never start a line of its own or drive the terminal that shows it."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# A ROUTER names a peer that gave no routing id of its own b"\x00" + a 4-byte counter, and asserts (the
# whole process aborts) when the next one it makes is held already: a client that learns one such id and
# connects with the next as its own makes the server die at the next peer without one. So pages never show
# them (see ``peer_label``); the digest's key is the process's own.
_LABEL_KEY = os.urandom(16)


def peer_label(identity: bytes) -> str:
    """A ZeroMQ peer's routing id for a page (the monitor's, the console's): as text when it is printable
    (eventmq's are), a keyed digest when libzmq made it (5 bytes, the first 0: showing it would tell a
    client the ROUTER's next one, see above), else hex."""
    if len(identity) == 5 and identity[0] == 0:
        return "peer-" + hashlib.blake2b(identity, digest_size=5, key=_LABEL_KEY).hexdigest()
    text = identity[:64].decode("ascii", "replace")
    return text if text.isprintable() and "\ufffd" not in text else identity[:32].hex()


class TextFormatter(logging.Formatter):
    """Text lines whose message is escaped (see ``escape``): a log line is one line, whatever a client
    sent. Only the traceback of an exception spans lines, and the exception's own text in it is
    escaped too (a StoreError may quote a client's queue name)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return "".join(_escaped_traceback(ei)).rstrip("\n")


def _escaped_traceback(ei) -> list[str]:
    """The traceback of ``ei`` with each exception's text escaped; frames (pzq's own source) as they are."""
    chunks = []
    for chunk in traceback.format_exception(*ei):
        if chunk.startswith(("  ", "Traceback ", "\nDuring handling", "\nThe above exception")):
            chunks.append(chunk)
        else:  # "Type: message" (and notes): text that may quote a client
            chunks.append(escape(chunk.rstrip("\n")) + "\n")
    return chunks


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
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
