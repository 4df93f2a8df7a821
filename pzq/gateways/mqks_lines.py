"""MQKS connections and whose turn it is: each connection's whole lines wait in order, and connections
share the loop's time by start-time fair queueing on what their requests cost.

A connection's tag is the loop time its requests (and the slices of its long ones: a publish written
over turns) have cost so far, never behind the tag of the last one served (an idle connection saves no
credit); the lowest tag plus what its next request is likely to cost goes next (its line's length, or
its last slice's cost: the API endpoint does the same with each command's cost, pzq/endpoints/api.py).
So an honest line waits for at most one request, or one slice, of each other connection, whatever they
pipeline, and a cheap one goes before the costly ones that came with it: 30 connections pipelining 8
consume lines of 10,000 events each had held an honest ping 1,021 ms when each connection was served one
line a round, whatever the line cost; with equal tags alone it waited for the first line of each.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from typing import Any

from pzq.protocols import mqks

LINE_S_PER_BYTE = 40e-9  # what serving a line is likely to cost, per byte (a 256 KiB consume: about 10 ms)


@dataclasses.dataclass(eq=False, slots=True)
class Session:
    """One connection: its unfinished line, its whole lines not served yet, its tag, the request being
    carried out over turns (``job``), and what must wait to be sent behind a notice that could not be
    sent yet (``held``: see mqks_out.py)."""

    buffer: mqks.LineBuffer
    waiting: collections.deque[bytes] = dataclasses.field(default_factory=collections.deque)
    waiting_bytes: int = 0
    tag: float = 0.0
    queued: bool = False  # in the fair queue
    job: Any = None  # a request carried out a slice per turn (mqks_publish.py), its answer after its last
    last_cost: float = 0.0  # seconds its last slice cost (what its next is likely to)
    held: collections.deque = dataclasses.field(default_factory=collections.deque)
    held_size: int = 0  # bytes of the replies in ``held``
    open: bool = True  # False: the connection closed, its job goes on to its end (it sent all of it)

    @property
    def busy(self) -> bool:
        """True while it has something to be served: a line waiting or a job."""
        return self.job is not None or bool(self.waiting)

    @property
    def buffered(self) -> int:
        """What it holds in pzq: its unfinished line, its lines waiting, what its job still holds of its
        line, and its answers held back (its share of unfinished input bounds them all)."""
        job = self.job.held_bytes if self.job is not None else 0
        return self.buffer.buffered + self.waiting_bytes + job + self.held_size


class FairTurns:
    """The connections with something to be served, lowest tag first (see the module's docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, bytes]] = []
        self._order = itertools.count()  # (equal tags: first come, first served)
        self.now_tag = 0.0  # the tag the last one served had

    def __bool__(self) -> bool:
        return bool(self._heap)

    def push(self, conn: bytes, session: Session, likely: float = 0.0) -> None:
        """``conn`` has something to be served (once in the queue at most), likely to cost ``likely``."""
        if not session.queued:
            session.queued = True
            session.tag = max(session.tag, self.now_tag)
            heapq.heappush(self._heap, (session.tag + likely, next(self._order), conn))

    def pop(self) -> bytes | None:
        """The connection whose turn it is (its session's ``queued`` is the caller's to clear: a
        connection gone since it was pushed is still popped once)."""
        if not self._heap:
            return None
        _, _, conn = heapq.heappop(self._heap)
        return conn

    def charge(self, session: Session, cost: float) -> None:
        """``session`` was served for ``cost`` seconds of the loop. Its tag is the fair queue's time now
        (``now_tag``: what a connection that comes back from idle starts at), even if lower than the last:
        a cheap request of a higher tag may go before a costly one's (the likely cost), and the time must
        not jump ahead of those still waiting, or one coming back would wait for all of them."""
        self.now_tag = session.tag
        session.tag += cost
        session.last_cost = cost
