"""The monitor's writes: REQUEUE and DELETEDEAD of dead letters, PURGE of a queue's ready messages (a
big queue over turns), and PUBLISH of one message. Each is carried out inside the loop's turn, within
its budget, and answered after the turn's commit (pzq/endpoints/monitor.py); each change is logged at
info with who asked (the requester's CURVE key name, or "anonymous")."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from pzq.broker import Broker
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import StoreFull
from pzq.protocols import monitor as monitor_proto
from pzq.store import Store

log = logging.getLogger("pzq.admin")

WRITES = frozenset({"REQUEUE", "DELETEDEAD", "PURGE", "PUBLISH"})


class Budget(Protocol):
    """The loop's turn budget, as far as the writes draw on it (pzq/endpoints/base.py TurnBudget)."""

    def records_for(self, chunk: int) -> int: ...

    def take(self, size: int = 0, records: int = 1) -> None: ...


class Unbounded:
    """A budget without bounds (a write carried out outside a turn: tests, tools)."""

    def records_for(self, chunk: int) -> int:
        return chunk

    def take(self, size: int = 0, records: int = 1) -> None:
        pass


UNBOUNDED = Unbounded()


class _Refused(Exception):
    pass


class Writes:
    """The monitor's writes (a part of ``Admin``, which sets what is declared here)."""

    broker: Broker
    store: Store
    limits: Limits = DEFAULT_LIMITS
    max_body: int = 1 << 20
    # queue -> (its qid, next seq, end seq): purges under way (the qid: a queue deleted and made again
    # under the same name mid-purge is another queue, whose messages the purge must not touch)
    _purges: dict[str, tuple[int, int, int]]

    @staticmethod
    def writes(request: monitor_proto.Request) -> bool:
        """True for a request that changes the store: it is carried out inside the turn and answered
        after the turn's commit, like every write. (A REQUEUE without its two words is answered as an
        unknown request, as before.)"""
        return request.command in WRITES and (request.command != "REQUEUE" or len(request.args) == 2)

    def write(
        self, request: monitor_proto.Request, budget: Budget = UNBOUNDED, who: str = "anonymous"
    ) -> tuple[str, bool]:
        """Carry out a request that ``writes``; the reply text, and whether anything changed."""
        handler = {
            "REQUEUE": self._requeue,
            "DELETEDEAD": self._delete_dead,
            "PURGE": self._purge,
            "PUBLISH": self._publish,
        }[request.command]
        try:
            answer, done = handler(request, budget)
        except _Refused as exc:
            return monitor_proto.error_text(str(exc)), False
        if done:
            log.info("monitor: %s (by %s)", done, who)
        return monitor_proto.render_json(answer), bool(done)

    def purging(self, queue: str | None = None) -> bool:
        """Whether purges are under way (the loop gives them a share each turn), or that of ``queue``."""
        return bool(self._purges) if queue is None else queue in self._purges

    def stop_purge(self, queue: str, why: str) -> None:
        """Stop the purge of ``queue`` under way (what it purged so far stays purged)."""
        if self._purges.pop(queue, None) is not None:
            log.warning("monitor: the purge of queue %r stopped: %s", queue, why)

    def work(self, budget: Budget) -> None:
        """The next share of each purge under way."""
        for name, (qid, lo, hi) in list(self._purges.items()):
            self._purge_share(name, qid, lo, hi, budget)

    def writes_rolled_back(self) -> None:
        """The turn's writes are gone: purges under way stop (their operator purges again)."""
        for name in self._purges:
            log.error("monitor: the purge of queue %r stopped on a store failure; purge it again", name)
        self._purges.clear()

    # -- each request ---------------------------------------------------------------------------------

    def _queue_named(self, request: monitor_proto.Request, words: int, usage: str):
        if len(request.args) != words:
            raise _Refused(f"usage: {usage}")
        info = self.store.queue(request.args[0], create=False)
        if info is None:
            raise _Refused(f"there is no queue {request.args[0]!r}")
        return info

    def _dead_seq(self, queue: str, which: str) -> int | None:
        if which == "all":
            return None
        ref = self.store.catalog.ref_in(queue, which)
        if ref is None:
            raise _Refused(f"{which[:80]!r} is not a dead letter id of queue {queue!r}")
        return ref[1]

    def _requeue(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        queue, which = request.args  # (as before: an unknown queue's "all" moves none, and is no error)
        seq = self._dead_seq(queue, which)
        moved = self.broker.requeue_dead(queue, seq, limit=self.limits.admin_rows)
        budget.take(records=2 * len(moved))
        done = f"requeued {len(moved)} dead letter(s) of queue {queue!r}" if moved else ""
        return {"requeued": len(moved), "ids": [m.id for m in moved]}, done

    def _delete_dead(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        info = self._queue_named(request, 2, "DELETEDEAD <queue> <id>|all")
        seq = self._dead_seq(info.name, request.args[1])
        gone = self.store.dead_letters.delete(info.name, seq, limit=self.limits.admin_rows)
        budget.take(records=gone)
        return {"deleted": gone}, f"deleted {gone} dead letter(s) of queue {info.name!r}" if gone else ""

    def _purge(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        info = self._queue_named(request, 1, "PURGE <queue>")
        if info.name in self._purges:  # (under way: this one adds nothing)
            return {"purged": 0, "more": True}, ""
        deleted, more = self._purge_share(info.name, info.qid, 0, info.next_seq, budget)
        done = f"purged {deleted} ready message(s) of queue {info.name!r}" + (
            "; the rest over the next turns" if more else ""
        )
        return {"purged": deleted, "more": more}, done

    def _purge_share(self, name: str, qid: int, lo: int, hi: int, budget: Budget) -> tuple[int, bool]:
        """Purge the next share of queue ``name`` (while it is queue ``qid``) up to ``hi`` (its end when
        the purge began: what comes later is kept); what is in flight or leased stays with its holder.
        Returns how many went and whether more is left."""
        info = self.store.queue(name, create=False)
        if info is None or info.qid != qid:
            log.warning("monitor: the purge of queue %r stopped: the queue was deleted", name)
            self._purges.pop(name, None)
            return 0, False
        most = budget.records_for(self.limits.admin_purge_share)
        deleted, at = self.broker.purge(name, lo, hi, most) if most > 0 else (0, lo)
        budget.take(records=max(most, 1))
        if at < hi:
            self._purges[name] = (qid, at, hi)
        elif self._purges.pop(name, None) is not None:
            log.info("monitor: the purge of queue %r is done", name)
        return deleted, at < hi

    def _publish(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        info = self._queue_named(request, 1, "PUBLISH <queue> (its body a second frame)")
        body = request.body or b""
        if len(body) > self.max_body:
            raise _Refused(f"the body is {len(body)} bytes, more than --max-message-size {self.max_body}")
        try:
            message = self.broker.produce(info.name, [body], now_us=time.time_ns() // 1000)
        except StoreFull as exc:  # (the store's limit, the disk or the memory alarm: as a producer is refused)
            raise _Refused(f"the message was refused: {exc}") from None
        budget.take(len(body))
        return {
            "id": message.id,
            "queue": info.name,
        }, f"published {message.id} ({len(body)} bytes) to queue {info.name!r}"
