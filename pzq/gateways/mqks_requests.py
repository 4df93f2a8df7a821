"""What each MQKS request does (shared/specs/mqks.md), for the gateway (gateways/mqks.py), which owns the
connections, whose turn it is and what is sent: a line read into its request (or its error answer),
publish, consume, rebind, ack and reject, delete_consumer and delete_queue, and which queues are in use.
A request that cannot be done in one slice of a turn becomes its connection's ``job`` (a publish's
copies: mqks_publish.py; a change of thousands of events, indexed a slice at a time, and the notices of
a queue with thousands of consumers: ``Rebound``), answered after its last slice."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pzq.config import Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways import mqks_rights
from pzq.gateways.contract import ONLY, BrokerSurface, Budget, Send
from pzq.gateways.mqks_bindings import BindingIndex, check_bind_line, with_added
from pzq.gateways.mqks_consumers import Consumer, Consumers
from pzq.gateways.mqks_lines import Session
from pzq.gateways.mqks_out import UPDATE, Outbox
from pzq.gateways.mqks_publish import Publish
from pzq.gateways.peer_rights import PeerRights
from pzq.logs import warn_bad
from pzq.protocols import mqks
from pzq.store.bindings import Binding

log = logging.getLogger("pzq.mqks")

RESTART_GRACE_S = 30.0  # after a restart, a --delete-queue-when-unused queue waits this long for consumers
CONFIRM = "confirm"  # the token of a confirmation (a rolled-back turn answers an error instead)
NOTIFY_STEP = 2_000  # consumers marked due a notice in one slice (a queue may have 100,000)


class Rebound:
    """A change of a queue's events carried out in slices: indexed ``INDEX_STEP`` events at a time
    (mqks_bindings.py), then its consumers marked due a notice ``NOTIFY_STEP`` at a time; the request that
    changed it is answered after the last (so that its own connection's notices come first)."""

    held_bytes = 0
    wrote = False

    def __init__(
        self, bindings: BindingIndex, outbox: Outbox, queue: str, consumers: list[Consumer], req: mqks.Request
    ):
        self.bindings, self.outbox, self.queue, self.consumers = bindings, outbox, queue, consumers
        self.request_id, self.confirm = req.request_id, req.confirm
        self.stamp = outbox.stamp  # (the turn that stored the change: once committed, a rollback keeps it)
        self._at = 0

    def stored(self) -> bool:
        """True once the turn that stored the change went (its slices only index it in memory, and a
        rolled-back turn reads every binding again: what is left of it is then done)."""
        return self.stamp != self.outbox.stamp

    def finish(self) -> None:
        for consumer in self.consumers[self._at :]:
            self.outbox.due(consumer)

    def step(self, budget: Budget, now_us: int) -> bool:
        if self.bindings.indexing(self.queue):
            self.bindings.index(self.queue)
        else:
            end = min(len(self.consumers), self._at + NOTIFY_STEP)
            for consumer in self.consumers[self._at : end]:
                self.outbox.due(consumer)
            self._at = end
        budget.take(0, records=1)
        return not self.bindings.indexing(self.queue) and self._at >= len(self.consumers)


class Requests:
    """The requests (a part the gateway holds): ``request`` does one line's and answers it through the
    outbox, ``error`` and ``reply`` answer for the gateway, ``job_rolled_back`` ends a request under way,
    ``remove_consumer`` lets a consumer go; and the queues MQKS made that are unused for their
    ``--delete-queue-when-unused`` seconds go (``start_unused_clocks``, ``expire_unused``, ``next_delete``;
    ``uses_queue`` and ``queue_expired`` for the broker's implicit queues). It is handed the gateway's
    parts it works on (its rights, bindings, consumers and outbox), and keeps nothing of the gateway's."""

    def __init__(
        self,
        broker: BrokerSurface,
        limits: Limits,
        rights: PeerRights,
        bindings: BindingIndex,
        consumers: Consumers,
        outbox: Outbox,
        drop_queue: Callable[[str], int],
        max_line: int,
        error_id: Callable[[], str],
    ):
        self.broker, self.limits, self.rights, self.bindings = broker, limits, rights, bindings
        self.consumers, self.outbox, self._drop_queue = consumers, outbox, drop_queue
        self.max_line = max_line
        self.error_id = error_id  # a fresh id per error reply: the client gets it, the log the details
        self.delete_at: dict[str, float] = {}
        self._orphans: set[str] = set()
        self._orphan_grace = 0.0
        self.published_total = self.unrouted_total = self.errors_total = 0

    def reply(self, conn: bytes, line: bytes, token: object = None) -> None:
        self.outbox.send(Send(ONLY, [conn, line], token))

    def error_line(self, request_id: str, code: str, detail: str) -> bytes:
        eid = self.error_id()
        self.errors_total += 1
        # Rate-limited like all bad input: a flood of wrong requests must not flood the log. The first
        # ten of each kind, then every 1000th, carry their error id.
        warn_bad("mqks", code, f"error {eid} for request {request_id[:80]!r}: {detail}")
        return mqks.error(request_id, eid)

    def error(self, conn: bytes, request_id: str, code: str, detail: str) -> None:
        self.reply(conn, self.error_line(request_id, code, detail))

    def request(self, conn: bytes, session: Session, line: bytes, now_us: int, budget: Budget) -> None:
        """One line's request, done and answered; an error answers what it asks wrongly or past the
        store's room (a StoreError goes up: the turn is rolled back)."""
        request_id = mqks.request_id_of(line)
        try:
            if len(line) > self.max_line:
                raise ProtocolError("line-too-long", f"a line of {len(line)} bytes is over {self.max_line}")
            action = mqks.action_of(line) if len(line) > mqks.BIG_LINE else b""
            if action == b"publish":  # (its data never decoded whole: mqks_publish.py)
                req, data = mqks.parse_publish(line)
                mqks_rights.check(self.rights, self.consumers, self.bindings, conn, req)
                self._publish(conn, session, req, data, line.isascii(), now_us, budget)
            elif action and action not in (b"consume", b"rebind"):  # (refused before it is parsed)
                raise ProtocolError(
                    "line-too-long",
                    f"a line of {len(line)} bytes: only publish, consume and rebind may pass {mqks.BIG_LINE}",
                )
            else:
                check_bind_line(line, self.limits)
                self._handle(conn, session, mqks.parse_line(line), now_us, budget)
        except ProtocolError as exc:
            self.error(conn, request_id, exc.code, exc.detail)
        except StoreFull as exc:
            self.error(conn, request_id, "queue-full", str(exc))

    def _handle(self, conn: bytes, session: Session, req: mqks.Request, now_us: int, budget: Budget) -> None:
        a = req.args
        if req.action == "ping":
            self.reply(conn, mqks.ok(req.request_id, a["data"]))
            return
        if req.action == "_eval":
            raise ProtocolError("refused", "_eval never evaluates client code; read figures from the monitor")
        mqks_rights.check(self.rights, self.consumers, self.bindings, conn, req)  # (before anything changes)
        if req.action == "publish":
            self._publish(conn, session, req, a["data"].encode(), True, now_us, budget)
            return
        if req.action == "consume":
            self._consume(conn, session, req)
        elif req.action == "rebind":
            self._rebind(conn, session, req)
        elif req.action in ("ack", "reject"):
            self.consumers.settle(self._consumer(conn, a["consumer"]), req.action, a["msg_id"])
        elif req.action == "delete_consumer":
            self.remove_consumer(self._consumer(conn, a["consumer"]))
        elif req.action == "delete_queue":
            self._delete_queue(a["queue"])
        if req.confirm and session.job is None:  # (else its job answers it once done)
            self.reply(conn, mqks.ok(req.request_id), (CONFIRM, req.request_id))

    def job_rolled_back(self, conn: bytes, job: Any) -> None:
        """A turn was rolled back while ``job`` was under way: it ends with an error (what earlier turns
        stored of a publish stays), but a change of events stored in an earlier turn, which only its
        indexing was left of, is done (the bindings are read again) and confirmed."""
        if isinstance(job, Publish):
            job.lost()
        if isinstance(job, Rebound) and job.stored():
            job.finish()
            if job.confirm:
                self.reply(conn, mqks.ok(job.request_id))
            return
        self.error(conn, job.request_id, "store-failed", "store failure: the request was rolled back")

    def _consumer(self, conn: bytes, consumer_id: str) -> Consumer:
        consumer = self.consumers.get(conn, consumer_id)
        if consumer is None:
            raise ProtocolError("unknown-consumer", f"no consumer {consumer_id!r} on this connection")
        return consumer

    def _publish(
        self,
        conn: bytes,
        session: Session,
        req: mqks.Request,
        data: bytes | memoryview,
        text_checked: bool,
        now_us: int,
        budget: Budget,
    ) -> None:
        """Copy ``data`` to every queue bound to the event: at once when the copies fit what the turn has
        left, else as the connection's job, in slices (refused first when the store has no room for all)."""
        queues = sorted(self.bindings.queues_for(req.args["event"]))
        size = len(data)
        if not queues:
            self.unrouted_total += 1  # as the reference: no queue is bound to the event
        elif text_checked and size <= self.limits.body_chunk_bytes and size * len(queues) <= budget.bytes_left:
            body = [bytes(data)]
            meta = {"mqks": [req.request_id, req.args["event"]]}
            self.broker.produce_all([(queue, body) for queue in queues], now_us=now_us, meta=meta)
            budget.take(len(data) * len(queues), records=len(queues))
            self.published_total += 1
        else:
            self.broker.check_room(len(data) * len(queues), producing=True)
            session.job = Publish(
                self.broker,
                self.limits,
                request_id=req.request_id,
                event=req.args["event"],
                data=data,
                queues=queues,
                confirm=req.confirm,
                text_checked=text_checked,
            )
            return
        if req.confirm:
            self.reply(conn, mqks.ok(req.request_id), (CONFIRM, req.request_id))

    def _binding_of(self, queue: str) -> Binding:
        """The queue's binding; a fresh one (owned if MQKS makes the queue) when it has none."""
        return self.bindings.get(queue) or Binding([], owned=self.broker.queues.info(queue) is None)

    def _consume(self, conn: bytes, session: Session, req: mqks.Request) -> None:
        a = req.args
        queue = a["queue"]
        self.bindings.check_sizes(a)
        self._room_for(queue)
        self.consumers.room_for(conn, req.request_id)
        old = self.consumers.get(conn, req.request_id)
        binding = self._binding_of(queue)
        events = list(a["events"]) if a["events"] is not None else list(binding.events)
        events = with_added(events, a["add"])
        most = self.limits.mqks_max_events
        if len(set(events)) > most:  # checked before anything changes (the old consumer included)
            raise ProtocolError("too-many-events", f"queue {queue!r} would have more than {most} events")
        growth = self.bindings.room_for_events(queue, events, conn)
        # The queue exists from now on, bound or not: made implicit, on this connection's share (StoreFull)
        self.broker.queues.create(queue, owner=("mqks", conn))
        if old is not None:  # the same id again on this connection: it starts over
            self.remove_consumer(old)
        unused = a["unused"] if a["unused"] is not None else binding.unused
        consumer = Consumer(conn, req.request_id, queue, a["manual_ack"], a["prefetch"])
        changed = self.bindings.set(queue, Binding(events, unused, binding.owned), save=True)
        self.bindings.took(conn, growth)
        self.consumers.add(consumer)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)
        if changed:
            self._notify(session, queue, None if a["add"] else consumer, req)

    def _rebind(self, conn: bytes, session: Session, req: mqks.Request) -> None:
        a = req.args
        queue = a["queue"]
        self.bindings.check_sizes(a)
        self._room_for(queue)
        binding = self._binding_of(queue)
        events = list(a["events"]) if a["events"] is not None else list(binding.events)
        removed = set(a["remove"])  # sets, not lists: linear in the request, whatever its size
        if removed:
            events = [e for e in events if e not in removed]
        events = mqks.remove_masked(events, a["remove_mask"], self.limits.mqks_mask_work)
        events = with_added(events, a["add"])
        growth = self.bindings.room_for_events(queue, events, conn)
        self.broker.queues.create(queue, owner=("mqks", conn))
        changed = self.bindings.set(queue, Binding(events, binding.unused, binding.owned), save=True)
        self.bindings.took(conn, growth)
        if changed:
            self._notify(session, queue, None, req)

    def _notify(self, session: Session, queue: str, skip: Consumer | None, req: mqks.Request) -> None:
        """Every consumer of ``queue`` but ``skip`` is due a notice of its events (mqks_out.py); a change
        still being indexed, or many consumers to mark, go on as the connection's job, over slices."""
        consumers = [c for c in self.consumers.by_queue.get(queue, []) if c is not skip]
        if len(consumers) <= NOTIFY_STEP:
            for consumer in consumers:
                self.outbox.due(consumer)
            consumers = []
        if consumers or self.bindings.indexing(queue):
            session.job = Rebound(self.bindings, self.outbox, queue, consumers, req)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Unregister; what it held goes back to the end of its queue, retry raised (as a reject)."""
        if self.consumers.remove(consumer):
            binding = self.bindings.get(consumer.queue)
            if binding is not None and binding.unused is not None:
                self._orphans.add(consumer.queue)

    def _room_for(self, queue: str) -> None:
        """A new binding record past the store limit or while the disk is short is refused before
        anything changes (a binding that grows is written: mqks_max_bindings bounds those)."""
        if queue not in self.bindings:
            self.broker.check_room(len(queue.encode()) + 64)

    def _delete_queue(self, queue: str) -> None:
        # Only an MQKS queue, and not from under another protocol's clients: deleting it would settle
        # every message they hold or lease, which no client may do to another's.
        binding = self.bindings.get(queue)
        if binding is None or not binding.owned:
            raise ProtocolError(
                "unknown-queue",
                f"no MQKS queue {queue!r} (only queues MQKS made can be deleted "
                "through it; one that existed before MQKS bound it belongs to others too)",
            )
        info = self.broker.queues.info(queue)
        if info is not None and self.broker.queues.held_by_others(info.qid, lambda holder: holder[:1] == ("mqks",)):
            raise ProtocolError(
                "queue-in-use",
                f"queue {queue!r} has messages held by clients of another protocol or leased by an API group",
            )
        for consumer in self.consumers.drop_queue(queue):  # (a rolled-back turn does not send these)
            self.reply(consumer.conn, mqks.update(consumer.id, queue, [], None, False), (UPDATE,))
        self.bindings.remove(queue)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)
        dropped = self._drop_queue(queue)  # (at once for clients; its records go over the next turns)
        log.info("MQKS queue %r deleted with %d message(s)", queue, dropped)

    # -- queues unused for their --delete-queue-when-unused seconds ------------------------------------

    def uses_queue(self, queue: str) -> bool:
        """A queue with a consumer, or bound to an event, is in use (a publish may fill it)."""
        binding = self.bindings.get(queue)
        return self.consumers.used(queue) or (binding is not None and bool(binding.events))

    def queue_expired(self, queue: str) -> None:
        """An unused queue expired: its binding record (no events) goes with it."""
        if queue in self.bindings:
            self.bindings.remove(queue)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)

    def next_delete(self) -> float | None:
        """When the next unused queue is due to go (None: none is)."""
        return min(self.delete_at.values()) if self.delete_at else None

    def start_unused_clocks(self) -> None:
        self._orphans = {q for q in self.bindings.unused() if not self.consumers.used(q)}
        self._orphan_grace = RESTART_GRACE_S

    def expire_unused(self, now: float) -> None:
        for queue in self._orphans:
            binding = self.bindings.get(queue)
            if binding is not None and binding.unused is not None:
                self.delete_at[queue] = now + max(binding.unused, self._orphan_grace)
        self._orphans.clear()
        self._orphan_grace = 0.0
        for queue in [q for q, t in self.delete_at.items() if t <= now]:
            del self.delete_at[queue]
            if not self.consumers.used(queue) and queue in self.bindings:
                try:
                    self._delete_queue(queue)
                except ProtocolError as exc:
                    log.info("MQKS queue %r not deleted when unused: %s", queue, exc.detail)
                    binding = self.bindings.get(queue)
                    if binding is not None and binding.owned:  # in use by another protocol: try again later
                        self.delete_at[queue] = now + max(binding.unused or 0, 1.0)
