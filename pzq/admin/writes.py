"""The monitor's writes: REQUEUE and DELETEDEAD of dead letters, PURGE of a queue's ready messages (a
big queue over turns), PUBLISH of one message, CREATE and DELETE of a queue (and ROUTES, the MQKS
bindings of an event: a read, here beside DELETE, which asks the same index). Each write is carried
out inside the loop's turn, within its budget, and answered after the turn's commit
(pzq/endpoints/monitor.py); each change is logged at info with who asked (the requester's CURVE key
name, or "anonymous")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from pzq.broker import Broker
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreError, StoreFull
from pzq.protocols import monitor as monitor_proto
from pzq.shards import MAX_PARTITIONS, partition_name
from pzq.store import Store

log = logging.getLogger("pzq.admin")

WRITES = frozenset({"REQUEUE", "DELETEDEAD", "PURGE", "PUBLISH", "CREATE", "DELETE"})


class Routing(Protocol):
    """The MQKS gateway's bindings, as far as the monitor asks them (pzq/gateways/mqks_bindings.py)."""

    def queues_for(self, event: str) -> tuple[str, ...]: ...

    def __contains__(self, queue: str) -> bool: ...


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


def _count(word: str) -> int:
    """CREATE's count of partitions: a whole number of 1 to MAX_PARTITIONS (ASCII digits only)."""
    if not (word.isascii() and word.isdigit()) or len(word) > 5 or not 1 <= int(word) <= MAX_PARTITIONS:
        raise _Refused(f"partitions must be a whole number of 1 to {MAX_PARTITIONS}, got {word[:40]!r}")
    return int(word)


class Writes:
    """The monitor's writes (a part of ``Admin``, which sets what is declared here)."""

    broker: Broker
    store: Store
    limits: Limits = DEFAULT_LIMITS
    max_body: int = 1 << 20
    # deletes a queue for good, its leases too (the server's, MQKS delete_queue's; None: the broker's)
    drop_queue: Callable[[str], int] | None = None
    endpoints: Callable[[], Sequence[object]]
    routing: Routing | None = None  # the MQKS gateway's bindings (the server's; None: no MQKS gateway)
    where: Callable[[str], dict]  # WHERE's answer (the server's: this server's shard and its list)
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
            "CREATE": self._create,
            "DELETE": self._delete,
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
        return {"requeued": len(moved), "ids": [m.id for m in moved], "left": self._dead_left(queue)}, done

    def _delete_dead(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        info = self._queue_named(request, 2, "DELETEDEAD <queue> <id>|all")
        seq = self._dead_seq(info.name, request.args[1])
        gone = self.store.dead_letters.delete(info.name, seq, limit=self.limits.admin_rows)
        budget.take(records=gone)
        done = f"deleted {gone} dead letter(s) of queue {info.name!r}" if gone else ""
        return {"deleted": gone, "left": self._dead_left(info.name)}, done

    def _dead_left(self, queue: str) -> int:
        """The dead letters ``queue`` still has (past the 1,000 a request moves: the CLI says how many)."""
        info = self.store.queue(queue, create=False)
        return info.dead_count if info is not None else 0

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

    def _create(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        """An explicit queue, as ``--queue`` makes one: it never expires. One that exists is no error
        (``rabbitmqctl``'s declare is idempotent too): it is answered ``created: false``, and made
        explicit if a client's request had made it. With a count of partitions past 1, see _partitioned."""
        if not 1 <= len(request.args) <= 2:
            raise _Refused(f"usage: CREATE <queue> [partitions: 1 to {MAX_PARTITIONS}]")
        name = request.args[0]
        count = _count(request.args[1]) if len(request.args) == 2 else 1
        if count > 1:
            return self._partitioned(name, count, budget)
        existed = self.store.queue(name, create=False)
        was_implicit = existed is not None and existed.implicit
        try:
            info = self.store.catalog.name_queue(name)  # (the store's rules: 1 to 255 bytes, --max-queues)
        except StoreError as exc:  # (a name the store refuses, or past --max-queues: StoreFull)
            raise _Refused(str(exc)) from None
        budget.take(len(name))
        created = existed is None
        answer = {"created": created, "queue": info.name, "was_implicit": was_implicit}
        if was_implicit:
            return answer, f"made queue {info.name!r} explicit (it no longer expires)"
        return answer, f"created queue {info.name!r}" if created else ""

    def _partitioned(self, queue: str, count: int, budget: Budget) -> tuple[dict, str]:
        """Queue ``queue`` of ``count`` partitions: the count kept in the store (the same count again is no
        error; another is refused: partitions never change), and the partitions the shard list places on
        this server made explicit (``queue#i``; every one on a server without a list). The CLI sends it
        to every shard of the list, each making its own."""
        last = partition_name(queue, count - 1)
        if len(last.encode()) > 255:
            raise _Refused(f"{queue[:60]!r}: too long for {count} partitions ({last[-20:]!r}: past 255 bytes)")
        catalog, here_of = self.store.catalog, getattr(self.where, "here", None)
        try:  # (the partitions the list or etcd places on this shard; every one on a server alone)
            here = here_of(queue, count) if here_of is not None else [partition_name(queue, i) for i in range(count)]
        except ProtocolError as exc:  # (etcd: being placed, ask again; or unreachable; or another count)
            raise _Refused(exc.detail) from None
        new = [name for name in here if name not in catalog.by_name]
        if len(catalog.by_name) + len(new) > catalog.max_queues:
            raise _Refused(f"queue full: {len(new)} partitions more would pass --max-queues {catalog.max_queues}")
        try:
            kept_now = catalog.keep_partitions(queue, count)
            for name in here:
                catalog.name_queue(name)
        except StoreError as exc:
            raise _Refused(str(exc)) from None
        budget.take(len(queue), records=len(here) + 1)
        answer = {"created": bool(new) or kept_now, "queue": queue, "partitions": count, "here": here, "made": new}
        made = ", ".join(new) or "none"
        done = f"queue {queue!r} of {count} partitions kept; made here: {made}" if new or kept_now else ""
        return answer, done

    def _delete(self, request: monitor_proto.Request, budget: Budget) -> tuple[dict, str]:
        """Delete a queue with its messages (in flight and held included) and dead letters: at once for
        every client, its records over the next turns (store/drops.py, as MQKS delete_queue does). An
        MQKS queue is refused: its bindings and consumers are MQKS's (delete it with delete_queue)."""
        info = self._queue_named(request, 1, "DELETE <queue>")
        if info.name in (self.routing or ()):
            raise _Refused(
                f"queue {info.name!r} is bound to MQKS events: delete it through MQKS (delete_queue), "
                "which unbinds it and tells its consumers"
            )
        dead = info.dead_count
        messages = (self.drop_queue or self.broker.drop_queue)(info.name)
        budget.take(len(info.name))
        done = f"deleted queue {info.name!r} with {messages} message(s) and {dead} dead letter(s)"
        return {"deleted": info.name, "messages": messages, "dead_letters": dead}, done

    def routes(self, args: list[str]) -> str:
        """ROUTES <event>: the MQKS queues a publish of ``event`` is copied to (none: MQKS drops it), or an
        ``error:`` line when no MQKS gateway runs."""
        if len(args) != 1:
            return monitor_proto.error_text("usage: ROUTES <event>")
        routing = self.routing
        if routing is None:
            return monitor_proto.error_text("no MQKS gateway runs on this server (--mqks-dsn)")
        queues = routing.queues_for(args[0])
        shown = list(queues[: self.limits.admin_rows])
        return monitor_proto.render_json({"event": args[0], "queues": shown, "total": len(queues)})
