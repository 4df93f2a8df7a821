"""The web console's side of the loop: what its pages ask the loop to read, and the changes a logged-in
operator makes (requeue or delete dead letters, purge a queue), carried out in the turn and answered
after its commit, like every write. The console's HTTP threads never touch the store; they hand
requests to this endpoint through the console's bounded queue (pzq/console/state.py).

The loop knows the console only as ``WebConsole``: the CLI builds it (pzq.console.web.Console) and
hands the server a factory, so nothing below the CLI imports pzq.console."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from pzq.broker import Broker
from pzq.config import Config
from pzq.endpoints.base import Endpoint

log = logging.getLogger("pzq.console")

REQUESTS_PER_TURN = 8
READ_BUDGET_S = 0.005  # of a turn spent on the console's reads; the rest wait for the next turn
PURGE_PER_TURN = 5000  # stored messages a purge walks in one turn; a big queue is purged over turns
DEAD_PER_CHANGE = 1000  # dead letters one "requeue all" or "delete all" moves (press again for more)
BODY_BYTES = 1024  # of each body a page is given (it shows 200 characters)
MAX_ROWS = 1000  # messages, dead letters or clients of one list a page may ask for
WRITES = frozenset({"requeue", "delete_dead", "purge"})


class ConsoleRequest(Protocol):
    """A read or a change a page asks of the loop: ``kind`` (``queue``, ``clients`` or one of WRITES)
    and its ``args``; the loop sets ``result``, then ``done``."""

    kind: str
    args: dict
    result: Any
    done: threading.Event

    def claim(self) -> bool:
        """The loop takes the request on: False if its page stopped waiting (then nothing is done)."""
        ...


class WebConsole(Protocol):
    """What the loop needs of the web console (its HTTP side runs in threads of its own)."""

    host: str
    port: int
    wake: Callable[[], None]  # set by the server: interrupts the loop's poll when a request waits

    def take(self, limit: int) -> Iterator[ConsoleRequest]:
        """Up to ``limit`` waiting requests."""
        ...

    def pending(self) -> bool:
        """Whether requests wait for the loop."""
        ...

    def publish(self, at: float, stats: dict, oldest: dict[str, float], per_queue: dict, commit_ms: float) -> None:
        """The loop's figures for the next page views (about once a second)."""
        ...

    def reload_secret(self) -> None:
        """Re-read the login secret (SIGHUP); ConfigError if it cannot be read."""
        ...

    def close(self) -> None:
        """Stop serving."""
        ...


ConsoleFactory = Callable[[Config], WebConsole]  # the web console of a Config's --http-dsn


class ConsoleEndpoint(Endpoint):
    """Serves the console's requests: reads at once, writes after the turn's commit."""

    name = "console"

    def __init__(
        self,
        console: WebConsole,
        broker: Broker,
        *,
        clients: Callable[[float, int], dict],
    ):
        self.console = console
        self.broker = broker
        self.store = broker.store
        self.sockets = []
        self._clients = clients  # (now, rows) -> the clients page's figures and tables
        self._answered: list[ConsoleRequest] = []  # writes carried out this turn, answered after the commit
        # Reads wait for the turn's commit too: a page shows what is committed (it reads a snapshot of
        # the store), so what the figures say happened is on the page as well.
        self._reads: list[ConsoleRequest] = []
        # queue -> (its qid, next seq, end seq): purges under way (the qid: a queue deleted and made
        # again under the same name mid-purge is another queue, whose messages the purge must not touch)
        self._purges: dict[str, tuple[int, int, int]] = {}

    def work(self, now: float, now_us: int) -> None:
        for name, (qid, lo, hi) in list(self._purges.items()):
            self._purge_share(name, qid, lo, hi)
        for _ in range(REQUESTS_PER_TURN - len(self._reads)):
            if self.budget.spent():  # (the rest wait in the console's queue: next turn)
                break
            request = next(iter(self.console.take(1)), None)
            if request is None:
                break
            self.budget.take()
            if not request.claim():
                continue  # (its page stopped waiting: nothing is done)
            if request.kind not in WRITES:
                self._reads.append(request)
                continue
            # Answered after the commit, or after the rollback should the change fail the turn.
            self._answered.append(request)
            request.result = {"ok": False, "text": "the change failed: nothing was changed"}
            request.result = self._write(request.kind, request.args)

    def waiting(self) -> bool:
        return bool(self._answered or self._reads or self._purges)

    def rolled_back(self) -> None:
        for request in self._answered:
            request.result = {"ok": False, "text": "store failure: nothing was changed; try again"}
        for name in self._purges:
            log.error("console: the purge of queue %r stopped on a store failure; purge it again", name)
        self._purges.clear()

    def recover(self) -> None:
        self._purges.clear()

    def flush(self, now: float, now_us: int) -> None:
        answered, self._answered = self._answered, []
        for request in answered:
            result = request.result or {}
            if result.get("ok"):
                log.info("console: %s (by %s)", result.get("text"), request.args.get("who", "?"))
            request.done.set()
        deadline = time.perf_counter() + READ_BUDGET_S
        while self._reads and time.perf_counter() < deadline:  # (the rest: next turn)
            request = self._reads.pop(0)
            try:
                request.result = self._read(request.kind, request.args, now)
            except Exception:  # a page's read must never fail the loop's turn: the page says "busy"
                log.exception("the console's %s request failed", request.kind)
            request.done.set()

    def wake_at(self, now: float) -> float | None:
        return now if self._purges or self._reads or self.console.pending() else None

    # -- reads ----------------------------------------------------------------------------------------

    def _read(self, kind: str, args: dict, now: float) -> dict:
        rows = max(0, min(int(args.get("rows", 0)), MAX_ROWS))
        if kind == "clients":
            return self._clients(now, rows)
        name = args["name"]
        info = self.store.queue(name, create=False)
        if info is None:
            return {"gone": True}

        def listed(dead: bool) -> list[dict]:
            return [
                {
                    "id": p.id,
                    "enqueued_us": p.enqueued_us,
                    "deliveries": p.deliveries,
                    "body": p.body_head,
                    "size": p.body_size,
                    "size_exact": p.size_exact,
                    "reason": p.reason,
                }
                for p in self.store.preview(name, rows, BODY_BYTES, dead=dead)
            ]

        return {
            "messages": listed(dead=False),
            "dead": listed(dead=True),
            "purging": name in self._purges,
            "figures": self.broker.queue_figures(info),  # (as of now: the snapshot may be a second old)
        }

    # -- writes ---------------------------------------------------------------------------------------

    def _write(self, kind: str, args: dict) -> dict:
        name, which = args["name"], args.get("which", "all")
        info = self.store.queue(name, create=False)
        if info is None:
            return {"ok": False, "text": f"there is no queue {name!r}"}
        seq = None
        if kind != "purge" and which != "all":
            parsed = self.store.ref_in(name, which)
            if parsed is None:
                return {"ok": False, "text": f"{which!r} is not a dead letter of queue {name!r}"}
            seq = parsed[1]
        if kind == "requeue":
            moved = self.broker.requeue_dead(name, seq, limit=DEAD_PER_CHANGE)  # (ready for every consumer)
            return {"ok": bool(moved), "text": f"requeued {len(moved)} dead letter(s) of queue {name!r}"}
        if kind == "delete_dead":
            gone = self.store.delete_dead(name, seq, limit=DEAD_PER_CHANGE)
            return {"ok": bool(gone), "text": f"deleted {gone} dead letter(s) of queue {name!r}"}
        if name in self._purges:
            return {"ok": False, "text": f"queue {name!r} is being purged already"}
        deleted, more = self._purge_share(name, info.qid, 0, info.next_seq)
        text = f"purged {deleted} ready message(s) of queue {name!r}"
        if more:
            text += "; the rest follows over the next turns"
        return {"ok": True, "text": text + " (messages in flight stay with their consumers)"}

    def _purge_share(self, name: str, qid: int, lo: int, hi: int) -> tuple[int, bool]:
        """Purge the next share of queue ``name`` (while it is queue ``qid``) up to ``hi`` (its end when
        the purge began: what comes later is kept); whether more is left."""
        started = time.perf_counter()
        info = self.store.queue(name, create=False)
        if info is None or info.qid != qid:
            log.warning("console: the purge of queue %r stopped: the queue was deleted", name)
            self._purges.pop(name, None)
            return 0, False
        deleted, at = self.broker.purge(name, lo, hi, PURGE_PER_TURN)
        if at < hi:
            self._purges[name] = (qid, at, hi)
        elif self._purges.pop(name, None) is not None:
            log.info("console: the purge of queue %r is done", name)
        log.debug("console: purge of %r: %d deleted in %.1f ms", name, deleted, (time.perf_counter() - started) * 1e3)
        return deleted, at < hi
