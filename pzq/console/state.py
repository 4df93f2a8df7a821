"""What the loop and the console's HTTP threads share: the snapshot the loop publishes once a second
(and the pages rendered from it), a queue's content read by the loop at most once a second, and the
bounded queue of ``LoopRequest``s the pages hand the loop (pzq/endpoints/console.py answers them).
A page view reads only this, never the store, the sockets or the loop's state."""

from __future__ import annotations

import collections
import dataclasses
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pzq.console.auth import Logins
from pzq.console.history import History
from pzq.console.pages import SHOWN

MAX_WAITING = 32  # page views waiting for the loop to read messages for them; more get 503
ANSWER_S = 2.0  # how long a page view waits for the loop
RENDERED_KEPT = 256  # pages kept for the current snapshot
PAGE_CACHE_S = 1.0  # a queue's content is read by the loop at most this often
PAGES_CACHED = 64
BEGUN = object()  # ask(): the loop took a change on but did not answer in time


@dataclasses.dataclass
class LoopRequest:
    """A read or a change the console asks of the loop (the loop owns the store): a read is answered
    within a turn, a change after the commit of the turn that made it."""

    kind: str
    args: dict
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Any = None
    _state: str = "waiting"  # -> "begun" (the loop took it on) or "dropped" (the page stopped waiting)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """The loop takes the request on: False if its page stopped waiting (then nothing is done)."""
        with self._lock:
            if self._state == "dropped":
                return False
            self._state = "begun"
            return True

    def drop(self) -> bool:
        """The page stops waiting: True if the loop had not begun it (and now never will)."""
        with self._lock:
            if self._state == "begun":
                return False
            self._state = "dropped"
            return True


class ConsoleState:
    """The snapshot, the history, the logins, the caches and the requests waiting for the loop."""

    def __init__(self, data_dir: str, logins: Logins, hosts: frozenset[str]):
        self.data_dir = data_dir
        self.history = History()
        self.logins = logins
        self.hosts = hosts  # the names a browser may call this console by (see pzq/console/handler.py)
        self._snapshot: dict[str, Any] = {
            "stats": {},
            "oldest": {},
            "per_queue": {},
            "series": {},
            "rates": {},
            "disk_free": None,
        }
        self._lock = threading.Lock()
        self._pages: collections.OrderedDict[str, tuple[float, Any]] = collections.OrderedDict()  # (see look)
        self._rendered: dict[tuple, Any] = {}  # (see rendered)
        self.requests: queue.Queue[LoopRequest] = queue.Queue(maxsize=MAX_WAITING)
        self.wake: Callable[[], None] = lambda: None  # the server's: interrupts the loop's poll

    def publish(self, at: float, stats: dict, oldest: dict[str, float], per_queue: dict, commit_ms: float) -> None:
        """The loop's figures for the next page views (called from the loop, about once a second)."""
        self.history.add(at, stats, commit_ms, per_queue)
        try:
            disk_free: int | None = shutil.disk_usage(self.data_dir).free
        except OSError:
            disk_free = None
        snapshot = {
            "stats": stats,
            "oldest": oldest,
            "per_queue": per_queue,
            "series": self.history.series(),
            "rates": self.history.queue_rates(),
            "disk_free": disk_free,
        }
        with self._lock:
            self._snapshot = snapshot
            self._rendered = {}

    def ask(self, kind: str, wait_s: float = ANSWER_S, **args) -> Any:
        """Have the loop read or change something and wait for its answer: None if the loop is too
        busy (nothing was done), ``BEGUN`` if it took a change on but did not answer in time."""
        request = LoopRequest(kind, args)
        try:
            self.requests.put_nowait(request)
        except queue.Full:
            return None
        self.wake()
        if request.done.wait(wait_s):
            return request.result
        if request.drop():
            return None  # (the loop never began it, and now never will)
        return request.result if request.done.wait(wait_s) else BEGUN

    def rendered(self, key: tuple, build: Callable[[dict[str, Any]], Any]) -> Any:
        """``build(snapshot)``, made once per snapshot for every viewer: a page of every queue costs
        its rendering (and the interpreter's lock the loop needs) once a second, however often it is
        asked for. ``key`` names the page and its arguments (a bounded set: sorts and page numbers)."""
        with self._lock:
            snapshot, made = self._snapshot, self._rendered
            if key in made:
                return made[key]
        value = build(snapshot)
        with self._lock:
            if self._rendered is made and len(made) < RENDERED_KEPT:
                made[key] = value
        return value

    def look(self, name: str) -> Any:
        """A queue's first messages and dead letters, read by the loop at most once a second per queue
        (a flood of views of one queue costs the loop one read a second); None if the loop is busy."""
        with self._lock:
            cached = self._pages.get(name)
        if cached is not None and time.monotonic() - cached[0] < PAGE_CACHE_S:
            return cached[1]
        content = self.ask("queue", name=name, rows=SHOWN)
        if content is not None:
            with self._lock:
                self._pages[name] = (time.monotonic(), content)
                self._pages.move_to_end(name)
                while len(self._pages) > PAGES_CACHED:
                    self._pages.popitem(last=False)
        return content

    def changed(self, name: str) -> None:
        """A change was made to queue ``name``: its next page view reads it afresh."""
        with self._lock:
            self._pages.pop(name, None)

    def take(self, limit: int) -> Iterator[LoopRequest]:
        """Up to ``limit`` waiting requests, one at a time (the rest wait for the next turn)."""
        for _ in range(limit):
            try:
                yield self.requests.get_nowait()
            except queue.Empty:
                return

    def pending(self) -> bool:
        """Whether requests wait for the loop (it then polls without sleeping)."""
        return not self.requests.empty()

    def snapshot(self) -> dict[str, Any]:
        """The figures the loop published last."""
        with self._lock:
            return self._snapshot
