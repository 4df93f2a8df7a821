"""What the console knows of pzq, and how it asks: a poller that sends ``STATS`` every poll interval
(whatever the number of browsers) and keeps the snapshot and its history, and on-demand reads
(``QUEUE``, ``PEEK``, ``DEAD``, ``CLIENTS``) cached for a second per request text, with browsers asking
the same text at once sharing one request. At most ``in_flight`` reads wait on pzq; one more finds
the console ``Busy`` (the page says so, with 503) rather than queueing behind them."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from typing import Any

from pzq.clients.monitor_link import MonitorLink, MonitorRefused, MonitorSilent
from pzq.console.history import History
from pzq.errors import ClientError

log = logging.getLogger("pzq.console")

CACHE_S = 1.0  # an on-demand read is asked of pzq at most this often per request text
CACHED = 256  # request texts remembered
READS_IN_FLIGHT = 3  # on-demand reads waiting on pzq at once (the poller has a socket of its own)


class Busy(Exception):
    """Too many reads wait on pzq already: try again in a moment."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One STATS answer and when it came (epoch seconds); ``error`` when the last poll failed."""

    stats: dict
    at: float
    polls: int
    error: str = ""


EMPTY = Snapshot({}, 0.0, 0, "no answer from pzq yet")


class Reader:
    """The poller, the snapshot, the history and the cached reads of one console."""

    def __init__(self, link: MonitorLink, poll_s: float = 1.0, *, in_flight: int = READS_IN_FLIGHT):
        self.link = link
        self.poll_s = poll_s
        self.history = History()
        self.snapshot = EMPTY
        self.polls = 0  # STATS requests sent (a flood of browsers must not raise it)
        self.busy_total = 0  # reads refused as Busy
        self._in_flight = in_flight
        self._reading = 0
        self._cache: collections.OrderedDict[str, tuple[float, Any]] = collections.OrderedDict()
        self._pending: dict[str, asyncio.Future] = {}
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._first = asyncio.Event()

    def start(self) -> None:
        """Begin polling (in the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def stop(self) -> None:
        """End the poller. Its cancel is sent again until it ends: Python 3.11's ``asyncio.wait_for``
        swallows a cancel that comes as what it waits for completes (the link's ``acquire`` does, at
        once), and the poller went on polling: the console hung at SIGTERM, "Waiting for application
        shutdown", until it was killed (seen once in a full test run)."""
        self._stopping = True
        task = self._task
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)

    async def first(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the first poll's answer, so the first page is not empty."""
        try:
            await asyncio.wait_for(self._first.wait(), timeout_s)
        except TimeoutError:
            pass

    async def _poll_forever(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while not self._stopping:
            await self.poll()
            due = max(due + self.poll_s, loop.time())  # (a slow answer skips beats rather than bunching them)
            await asyncio.sleep(due - loop.time())

    async def poll(self) -> None:
        """Ask STATS once; keep the answer (or, on failure, the last one with the failure's text)."""
        self.polls += 1
        try:
            stats = await self.link.request("STATS")
            if not isinstance(stats, dict) or not isinstance(stats.get("queues"), dict):
                raise ClientError("the STATS answer is not pzq's figures")
        except ClientError as exc:
            if not self.snapshot.error:
                log.warning("console: %s", exc)
            self.snapshot = dataclasses.replace(self.snapshot, error=str(exc))
            self._first.set()
            return
        at = stats.get("server_time_us", 0) / 1e6 or time.time()
        if self.snapshot.error and self.snapshot is not EMPTY:
            log.info("console: pzq answers again")
        self.history.add(at, stats)
        self.snapshot = Snapshot(stats, at, self.polls)
        self._first.set()

    async def read(self, text: str) -> Any:
        """pzq's answer to ``text`` (a read: QUEUE, PEEK, DEAD, CLIENTS), at most CACHE_S old. Busy if
        READS_IN_FLIGHT reads wait on pzq already; MonitorRefused / ClientError as the link raises."""
        now = time.monotonic()
        cached = self._cache.get(text)
        if cached is not None and now - cached[0] < CACHE_S:
            if isinstance(cached[1], MonitorRefused):  # (a refusal is remembered as long: asked once a second)
                raise cached[1]
            return cached[1]
        pending = self._pending.get(text)
        if pending is not None:  # (another browser asked the same: share its answer)
            return await asyncio.shield(pending)
        if self._reading >= self._in_flight:
            self.busy_total += 1
            raise Busy()
        self._reading += 1
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[text] = future
        try:
            answer = await self.link.request(text)
        except BaseException as exc:
            if isinstance(exc, MonitorRefused):
                self._remember(text, exc)
            # (the browsers sharing this read get its error; if the one that asked was cancelled, they
            # get a MonitorSilent rather than a cancellation of their own)
            future.set_exception(exc if isinstance(exc, Exception) else MonitorSilent("the read was given up"))
            future.exception()  # (marks it retrieved: nobody else may be waiting)
            raise
        else:
            future.set_result(answer)
            self._remember(text, answer)
            return answer
        finally:
            self._reading -= 1
            del self._pending[text]

    def _remember(self, text: str, answer: Any) -> None:
        self._cache[text] = (time.monotonic(), answer)
        self._cache.move_to_end(text)
        while len(self._cache) > CACHED:
            self._cache.popitem(last=False)

    def figures(self) -> dict:
        """The console's own figures: what it asked of pzq, and what it refused as busy."""
        return {
            "polls": self.polls,
            "poll_interval_s": self.poll_s,
            "requests_sent": dict(self.link.sent_by_command),
            "busy_total": self.busy_total,
            "cached": len(self._cache),
        }

    async def write(self, text: str, body: bytes | None = None) -> Any:
        """A change (PURGE, DELETEDEAD, REQUEUE, PUBLISH), answered by pzq after its commit; every
        cached read is forgotten and STATS asked again at once, so the page the operator is sent back
        to shows the queue as the change left it (figures, charts and lists alike)."""
        answer = await self.link.request(text, body)
        self._cache.clear()
        await self.poll()
        return answer
