"""STATS and MONITOR built a slice at a time: their per-queue part is rendered over turns, and every
request waiting for it is answered from one buffer.

With 9,000 queues of 255-byte names STATS is 2.98 MB (MONITOR 12 MB: a name on each of five lines a
queue), and building it took a turn 29 ms (MONITOR 47): the console's poll, once a second, held every
client that long (honest p99 7.7 -> 34.6 ms). Now each format has a ``Pass``: a request takes a ticket
(``ticket``), the pass begun after it; ``work`` renders the queues of that pass a slice (``CHUNK``
queues) at a time until the turn's share of time is spent (``Limits.admin_figures_s``), the rest in the
next turns, each slice written to the answer's buffer as it is rendered. The six totals before the
queues are read when a pass begins, the figures after them (counters, gateways: small) when it ends,
and the answer (``ready``) is one buffer for every request whose ticket it is. So no request sees a
figure read before it asked, however many ask, and a pass costs its turns a slice each. A few hundred
queues are a pass of one turn: answered in the turn it was asked, as before.

Pure: the monitor endpoint (pzq/endpoints/monitor.py) asks, sends and charges the answers."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from pzq.protocols import monitor as monitor_proto
from pzq.store import QueueInfo, Store

KINDS = ("STATS", "MONITOR")  # the requests answered from a pass, each with its own format
CHUNK = 64  # queues rendered between two looks at the clock (~0.2 ms of 255-byte names)
GUESS_PER_QUEUE = 128  # bytes a queue adds to an answer before a pass has measured it (an estimate only)


class Source(Protocol):
    """What a pass reads (``Admin``): the store's queues, their rows, and the figures around them."""

    store: Store

    def totals(self) -> dict: ...

    def queue_rows(self, infos: Sequence[QueueInfo], now_us: int) -> dict[str, dict]: ...

    def around(self) -> dict: ...


class Pass:
    """One format's passes over the queues: the one under way (``infos`` from ``at`` on left, written so
    far into ``buffer``), and the answer of the last one done (kept while a request waits for it)."""

    __slots__ = (
        *("kind", "opening", "queues", "closing", "begun", "done", "wanted", "infos", "at", "buffer"),
        *("written", "answer", "size", "waiting"),
    )

    def __init__(self, kind: str):
        self.kind = kind
        json = kind == "STATS"
        self.opening: Callable[[dict], str] = monitor_proto.stats_opening if json else monitor_proto.monitor_opening
        self.queues: Callable[[dict, bool], str] = monitor_proto.stats_queues if json else monitor_proto.monitor_queues
        self.closing: Callable[[dict], str] = monitor_proto.stats_closing if json else monitor_proto.monitor_closing
        self.begun = 0  # passes begun
        self.done = 0  # passes ended; ``answer`` is the last one's
        self.wanted = 0  # the pass the latest ticket waits for
        self.infos: list[QueueInfo] | None = None  # the queues of the pass under way (None: none is)
        self.at = 0  # the next of them to render
        self.written = False  # a queue of the pass under way is in the buffer (the next follows a comma)
        # (the answer is written as it is rendered, a slice at a time: joining and encoding 12 MB at the
        # end took its turn 25 ms; the totals before the queues are read when the pass begins)
        self.buffer = bytearray()
        self.answer: bytes | bytearray = b""
        self.size = 0  # bytes of the last answer: what the next one is taken to weigh
        self.waiting = 0  # tickets not yet answered


class Figures:
    """The passes of STATS and MONITOR over one ``Source``."""

    def __init__(self, source: Source, chunk: int = CHUNK):
        self.source = source
        self.chunk = max(1, chunk)  # queues rendered between two looks at the clock
        self.passes = {kind: Pass(kind) for kind in KINDS}
        self.passes_total = 0  # passes ended (figures)
        self.slices_total = 0  # slices rendered

    def ticket(self, kind: str) -> int:
        """A request for ``kind`` came: the pass that will answer it (the next to begin)."""
        one = self.passes[kind]
        one.wanted = one.begun + 1
        one.waiting += 1
        return one.wanted

    def ready(self, kind: str, ticket: int) -> bytes | bytearray | None:
        """The answer for ``ticket`` once its pass has ended (None before). Each ticket is answered once:
        the answer is let go once no ticket waits for it. (Not to be changed: it is sent without a copy.)"""
        one = self.passes[kind]
        if one.done < ticket:
            return None
        answer = one.answer
        one.waiting -= 1
        if not one.waiting:
            one.answer = b""
        return answer

    def estimate(self, kind: str) -> int:
        """Bytes the next answer of ``kind`` is taken to weigh: the last one's, or a guess from the number
        of queues before there was one."""
        one = self.passes[kind]
        return one.size or len(self.source.store.queues()) * GUESS_PER_QUEUE

    def pending(self) -> bool:
        """True while a request waits for a pass (the loop's next turn should come at once)."""
        return any(one.wanted > one.done for one in self.passes.values())

    def held_bytes(self) -> int:
        """What the passes hold: the one under way and the last answers kept."""
        return sum(len(one.buffer) + len(one.answer) for one in self.passes.values())

    def work(self, deadline: float, *, least: bool = True) -> None:
        """Render what waiting requests need until ``deadline`` (time.perf_counter()); ``least``: one slice
        whatever the clock says (a pass always moves on, a slice a turn)."""
        for one in self.passes.values():
            while one.wanted > one.done:
                if not least and time.perf_counter() >= deadline:
                    return
                self._slice(one)
                least = False

    def build(self, kind: str) -> bytes:
        """A whole answer at once, outside the turns (``Admin.answer``: tests, tools)."""
        one = Pass(kind)
        one.wanted = 1
        while one.done < 1:
            self._slice(one)
        return bytes(one.answer)

    def _slice(self, one: Pass) -> None:
        """Render the next ``chunk`` queues of ``one``'s pass (beginning it if none is under way); the last
        slice ends it."""
        store = self.source.store
        if one.infos is None:
            one.begun += 1
            one.infos, one.at, one.written = store.queues(), 0, False
            one.buffer = bytearray(one.opening(self.source.totals()).encode())
        end = min(len(one.infos), one.at + self.chunk)
        # (a queue deleted since the pass began is left out: the store's name now means another queue or none)
        infos = [info for info in one.infos[one.at : end] if store.queue(info.name, create=False) is info]
        if infos:
            rows = self.source.queue_rows(infos, time.time_ns() // 1000)
            one.buffer += one.queues(rows, not one.written).encode()
            one.written = True
        one.at = end
        self.slices_total += 1
        if end < len(one.infos):
            return
        one.buffer += one.closing(self.source.around()).encode()
        one.answer, one.buffer, one.size = one.buffer, bytearray(), len(one.buffer)
        one.infos = None
        one.done = one.begun
        self.passes_total += 1
