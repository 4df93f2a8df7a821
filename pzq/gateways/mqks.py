"""MQKS connections on the shared store: events, bindings, consumers and acks (shared/specs/mqks.md).

The endpoint hands every connection's bytes to ``keep``, has them served one line of each connection in
turn (``serve``) and sends the answers and what ``dispatch`` returns after the turn's commit, so a
``--confirm`` answer always follows the durable commit of what it confirms.

Mapping to the store: an MQKS queue is a named store queue; its bindings and its
``--delete-queue-when-unused`` setting are a side record (table ``mqks``). A publish stores one message
per bound queue: the data as a one-frame body, and the publisher's msg_id and the event in the message's
meta. A message from another protocol reaches MQKS consumers with its 32-hex id as msg_id, its queue's
name as event, and its frames joined as data (line breaks escaped as \\n and \\r).

Consumers belong to their connection (ids are looked up per connection) and are not restored after a
restart: clients consume again on reconnect, as the reference client does. Auto-ack consumers get each
message at most once: it is deleted (durably) before its line is sent. Manual-ack consumers get it at
least once: unacknowledged after ``--ack-timeout``, or when the consumer or its connection goes, it is
delivered again with ``retry`` raised; a reject puts it at the end of its queue, retry raised.
Bindings: gateways/mqks_bindings.py; consumers and deliveries: gateways/mqks_consumers.py.
"""

from __future__ import annotations

import collections
import itertools
import logging
import secrets
from collections.abc import Callable
from typing import Any

from pzq.broker import Broker
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreError, StoreFull
from pzq.gateways import mqks_rights
from pzq.gateways.contract import ONLY, UNBOUNDED, Budget, Send
from pzq.gateways.mqks_bindings import BindingIndex, check_bind_line, with_added
from pzq.gateways.mqks_consumers import Consumer, Consumers
from pzq.gateways.peer_rights import PeerRights
from pzq.logs import warn_bad
from pzq.permissions import Permissions
from pzq.protocols import mqks
from pzq.store.bindings import Binding, Bindings

log = logging.getLogger("pzq.mqks")

RESTART_GRACE_S = 30.0  # after a restart, a --delete-queue-when-unused queue waits this long for consumers
CONFIRM, UPDATE = "confirm", "update"  # tokens of replies that a rolled-back turn must not send as they are


class MqksGateway:
    """Every MQKS connection and what it asks: the commands, on the bindings and consumers below."""

    def __init__(
        self,
        broker: Broker,
        bindings: Bindings,
        *,
        max_line: int,
        window: int,
        drop_queue: Callable[[str], int],
        error_id: Callable[[], str] = lambda: secrets.token_hex(12),
        limits: Limits = DEFAULT_LIMITS,
        permissions: Permissions | None = None,
    ):
        """``bindings`` is the store's table of MQKS bindings; ``window`` the unacked deliveries per
        manual-ack consumer; ``drop_queue`` deletes a queue and what it holds (the server's, which
        also forgets its figures); ``permissions`` who may do what, per source network (mqks_rights.py)."""
        self.broker = broker
        self.rights = PeerRights(permissions, "mqks")
        self.error_id = error_id  # a fresh id per error reply: the client gets it, the log the details
        self.limits = limits
        self.max_line = max_line
        self._drop_queue = drop_queue
        self.sessions: dict[bytes, mqks.LineBuffer] = {}
        # Whole lines not served yet, per connection, and ``serve``'s round; they count in ``buffered``.
        self._waiting: dict[bytes, collections.deque[bytes]] = {}
        self._waiting_of: dict[bytes, int] = {}
        self._ring: collections.deque[bytes] = collections.deque()
        self._served: set[bytes] = set()
        self.waiting_bytes = 0
        self.consumers = Consumers(broker, limits, window)
        self._out: list[Send] = []
        self.delete_at: dict[str, float] = {}
        self.published_total = self.unrouted_total = 0
        self.errors_total = 0
        self.bindings = BindingIndex(bindings, limits)
        self._start_unused_clocks()
        broker.add_queue_user(self)

    def _start_unused_clocks(self) -> None:
        self._orphans = {q for q in self.bindings.unused() if not self.consumers.used(q)}
        self._orphan_grace = RESTART_GRACE_S

    def load(self) -> None:
        """Read the bindings: at start-up and after a rolled-back turn."""
        self.bindings.load()
        self._start_unused_clocks()

    def recover(self) -> None:
        """The turn was rolled back (the broker restarted from the disk): deliveries are forgotten,
        bindings re-read, and what was about to be confirmed is answered with an error instead."""
        self.consumers.forget_deliveries()
        pending, self._out = self._out, []
        self._out = self._salvage(pending)
        self.load()

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        return self._salvage(sends)

    def _salvage(self, sends: list[Send]) -> list[Send]:
        """Lines of a rolled-back turn: errors and pings still go out, confirms become errors, and
        deliveries and --update notices (of a state that is gone) are dropped."""
        kept = []
        for send in sends:
            token: Any = send.token
            if token is None:
                kept.append(send)
            elif token[0] == CONFIRM:
                self._error(send.peer, token[1], "store-failed", "store failure: the request was rolled back")
        return kept + self._take_out()

    def _take_out(self) -> list[Send]:
        out, self._out = self._out, []
        return out

    # -- connections ---------------------------------------------------------------------------------

    def connected(self, conn: bytes, address: str = "") -> None:
        self.sessions[conn] = mqks.LineBuffer(self.max_line)
        self.rights.connected(conn, address)

    def buffered(self, conn: bytes) -> int:
        """Bytes of input this connection holds: an unfinished line, and whole lines not served yet."""
        lines = self.sessions.get(conn)
        return 0 if lines is None else lines.buffered + self._waiting_of.get(conn, 0)

    def disconnected(self, conn: bytes) -> None:
        """The connection is gone: its consumers go, and what they held returns with retry raised."""
        self.sessions.pop(conn, None)
        self.rights.gone(conn)
        self._drop_waiting(conn)
        self.bindings.shares.forget(conn)  # (its bindings stay: the pool's limit still counts them)
        for consumer in self.consumers.of(conn):
            self._remove_consumer(consumer)
        self.broker.owner_gone(("mqks", conn))
        self.broker.payer_gone(("mqks", conn))  # (what its pipe held went with it)

    def narrowed(self) -> list[bytes]:
        """Connections consuming a queue their network may no longer consume (SIGHUP): to be closed."""
        return mqks_rights.narrowed(self.rights, self.consumers, self.bindings)

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

    def received(self, conn: bytes, data: bytes, *, now: float, now_us: int) -> list[Send]:
        """Bytes, and the answers to every waiting line (tests; the endpoint calls ``keep``, ``serve``)."""
        sends = self.keep(conn, data)
        return sends if sends and sends[-1].close else sends + self.serve(now=now, now_us=now_us, budget=UNBOUNDED)

    def keep(self, conn: bytes, data: bytes) -> list[Send]:
        """Bytes from a connection: its whole lines wait for ``serve``; an endless line closes it."""
        buffer = self.sessions.get(conn)
        if buffer is None:  # a connection already closed (STREAM announces every new one first)
            return []
        try:
            lines = buffer.feed(data)
        except ProtocolError as exc:
            warn_bad("mqks", exc.code, f"{exc.detail}; closing the connection")
            self._drop_waiting(conn)
            return [*self._take_out(), Send(ONLY, [conn], close=True)]
        if lines:
            if conn not in self._waiting:
                self._waiting[conn] = collections.deque()
                self._ring.append(conn)  # (joins the round at its end)
            self._waiting[conn].extend(lines)
            size = sum(map(len, lines))
            self._waiting_of[conn] = self._waiting_of.get(conn, 0) + size
            self.waiting_bytes += size
        return self._take_out()

    def waiting(self) -> bool:
        return bool(self._waiting)  # (whole lines wait to be served)

    def _drop_waiting(self, conn: bytes) -> None:
        if conn in self._ring:  # (not while ``serve`` holds it)
            self._ring.remove(conn)
        if self._waiting.pop(conn, None) is not None:
            self.waiting_bytes -= self._waiting_of.pop(conn, 0)
            self._served.add(conn)

    def served(self) -> set[bytes]:
        """The connections whose waiting lines went down since the last call (``buffered`` changed)."""
        served, self._served = self._served, set()
        return served

    def serve(self, *, now: float, now_us: int, budget: Budget) -> list[Send]:
        """Serve waiting lines while ``budget`` lasts, one of each connection in turn (a line waits for at
        most one of each other connection's); asked between lines, so each request stays atomic. The
        connection whose turn it was when the budget ran out goes first next turn."""
        ring = self._ring
        while ring and not budget.spent():
            conn = ring.popleft()
            self._serve_line(conn, now_us)  # (a store failure drops the connection's lines and raises)
            if self._waiting[conn]:
                ring.append(conn)  # (to the end of the round)
            else:
                del self._waiting[conn]
                self._waiting_of.pop(conn, None)
            budget.take()
        return self._take_out()

    def _serve_line(self, conn: bytes, now_us: int) -> None:
        """The next waiting line of ``conn``: its answer goes out after the answers to its earlier lines."""
        lines = self._waiting[conn]
        line = lines.popleft()
        self.waiting_bytes -= len(line)
        self._waiting_of[conn] -= len(line)
        self._served.add(conn)
        request_id = mqks.request_id_of(line)
        try:
            if len(line) > self.max_line:
                raise ProtocolError("line-too-long", f"a line of {len(line)} bytes is over {self.max_line}")
            check_bind_line(line, self.limits)
            self._handle(conn, mqks.parse_line(line), now_us)
        except ProtocolError as exc:
            self._error(conn, request_id, exc.code, exc.detail)
        except StoreFull as exc:
            self._error(conn, request_id, "queue-full", str(exc))
        except StoreError:
            # The whole turn is rolled back by the server: this line and the rest get an error.
            for rest in [line, *lines]:
                self._error(conn, mqks.request_id_of(rest), "store-failed", "store failure; try again")
            self._drop_waiting(conn)
            raise

    def _error(self, conn: bytes, request_id: str, code: str, detail: str) -> None:
        eid = self.error_id()
        self.errors_total += 1
        # Rate-limited like all bad input: a flood of wrong requests must not flood the log. The first
        # ten of each kind, then every 1000th, carry their error id.
        warn_bad("mqks", code, f"error {eid} for request {request_id[:80]!r}: {detail}")
        self._out.append(Send(ONLY, [conn, mqks.error(request_id, eid)]))

    def _reply(self, conn: bytes, line: bytes) -> None:
        self._out.append(Send(ONLY, [conn, line]))

    # -- requests --------------------------------------------------------------------------------------

    def _handle(self, conn: bytes, req: mqks.Request, now_us: int) -> None:
        a = req.args
        if req.action == "ping":
            self._reply(conn, mqks.ok(req.request_id, a["data"]))
            return
        if req.action == "_eval":
            raise ProtocolError("refused", "_eval never evaluates client code; read figures from the monitor")
        mqks_rights.check(self.rights, self.consumers, self.bindings, conn, req)  # (before anything changes)
        if req.action == "publish":
            self._publish(req.request_id, a["event"], a["data"], now_us)
        elif req.action == "consume":
            self._consume(conn, req.request_id, a)
        elif req.action == "rebind":
            self._rebind(conn, a)
        elif req.action in ("ack", "reject"):
            self.consumers.settle(self._consumer(conn, a["consumer"]), req.action, a["msg_id"])
        elif req.action == "delete_consumer":
            self._remove_consumer(self._consumer(conn, a["consumer"]))
        elif req.action == "delete_queue":
            self._delete_queue(a["queue"])
        if req.confirm:
            self._out.append(Send(ONLY, [conn, mqks.ok(req.request_id)], (CONFIRM, req.request_id)))

    def _consumer(self, conn: bytes, consumer_id: str) -> Consumer:
        consumer = self.consumers.get(conn, consumer_id)
        if consumer is None:
            raise ProtocolError("unknown-consumer", f"no consumer {consumer_id!r} on this connection")
        return consumer

    def _publish(self, msg_id: str, event: str, data: str, now_us: int) -> None:
        queues = self.bindings.queues_for(event)
        if not queues:
            self.unrouted_total += 1  # as the reference: no queue is bound to the event
            return
        body = [data.encode()]
        self.broker.produce_all(
            [(queue, body) for queue in sorted(queues)], now_us=now_us, meta={"mqks": [msg_id, event]}
        )
        self.published_total += 1

    def _binding_of(self, queue: str) -> Binding:
        """The queue's binding; a fresh one (owned if MQKS makes the queue) when it has none."""
        return self.bindings.get(queue) or Binding([], owned=self.broker.queue_info(queue) is None)

    def _consume(self, conn: bytes, consumer_id: str, a: dict) -> None:
        queue = a["queue"]
        self.bindings.check_sizes(a)
        self._room_for(queue)
        self.consumers.room_for(conn, consumer_id)
        old = self.consumers.get(conn, consumer_id)
        binding = self._binding_of(queue)
        events = list(a["events"]) if a["events"] is not None else list(binding.events)
        events = with_added(events, a["add"])
        most = self.limits.mqks_max_events
        if len(set(events)) > most:  # checked before anything changes (the old consumer included)
            raise ProtocolError("too-many-events", f"queue {queue!r} would have more than {most} events")
        growth = self.bindings.room_for_events(queue, events, conn)
        # The queue exists from now on, bound or not: made implicit, on this connection's share (StoreFull)
        self.broker.create_queue(queue, owner=("mqks", conn))
        if old is not None:  # the same id again on this connection: it starts over
            self._remove_consumer(old)
        unused = a["unused"] if a["unused"] is not None else binding.unused
        consumer = Consumer(conn, consumer_id, queue, a["manual_ack"], a["prefetch"])
        changed = self.bindings.set(queue, Binding(events, unused, binding.owned), save=True)
        self.bindings.took(conn, growth)
        self.consumers.add(consumer)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)
        if changed:
            self._notify(queue, skip=None if a["add"] else consumer)

    def _rebind(self, conn: bytes, a: dict) -> None:
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
        self.broker.create_queue(queue, owner=("mqks", conn))
        changed = self.bindings.set(queue, Binding(events, binding.unused, binding.owned), save=True)
        self.bindings.took(conn, growth)
        if changed:
            self._notify(queue, skip=None)

    def _notify(self, queue: str, skip: Consumer | None) -> None:
        binding = self.bindings.get(queue)
        events, unused = (binding.events, binding.unused) if binding else ([], None)
        for consumer in self.consumers.by_queue.get(queue, []):
            if consumer is not skip:
                line = mqks.update(consumer.id, queue, events, unused, consumer.manual_ack)
                self._out.append(Send(ONLY, [consumer.conn, line], (UPDATE,)))

    def _remove_consumer(self, consumer: Consumer) -> None:
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
        info = self.broker.queue_info(queue)
        if info is not None and self.broker.held_by_others(info.qid, lambda holder: holder[:1] == ("mqks",)):
            raise ProtocolError(
                "queue-in-use",
                f"queue {queue!r} has messages held by clients of another protocol or leased by an API group",
            )
        for consumer in self.consumers.drop_queue(queue):
            self._out.append(Send(ONLY, [consumer.conn, mqks.update(consumer.id, queue, [], None, False)], (UPDATE,)))
        self.bindings.remove(queue)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)
        dropped = self._drop_queue(queue)
        log.info("MQKS queue %r deleted with %d message(s)", queue, dropped)

    # -- each turn -------------------------------------------------------------------------------------

    def dispatch(self, *, now: float, now_us: int, blocked: frozenset = frozenset()) -> list[Send]:
        """Everything to send this turn: replies, then deliveries; and queues unused for long enough go.
        ``blocked`` connections read too slowly: no more deliveries for them now."""
        self._expire_unused(now)
        self.consumers.put_back()
        deliveries = self.consumers.deliver(now=now, now_us=now_us, blocked=blocked)
        return self._take_out() + deliveries

    def unsent(self, send: Send) -> bool:
        """A line the client's connection would not take now: see Consumers.unsent."""
        return self.consumers.unsent(send)

    def _expire_unused(self, now: float) -> None:
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

    def next_wake(self, now: float) -> float | None:
        return min(self.delete_at.values()) if self.delete_at else None

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return self.consumers.of_queue(queue, limit)

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        rows = []
        for conn in itertools.islice(self.sessions, offset, offset + limit):
            mine = self.consumers.of(conn)
            queues = ", ".join(sorted({c.queue for c in mine}))
            rows.append([conn.hex(), len(mine), queues[:200] or "-", sum(len(c.unacked) for c in mine)])
        columns = ["connection", "consumers", "queues", "unacked"]
        return [{"kind": "mqks", "title": "Connections", "columns": columns, "rows": rows, "total": len(self.sessions)}]

    def stats(self) -> dict:
        return {
            "connections": len(self.sessions),
            "consumers": len(self.consumers),
            "bound_queues": len(self.bindings),
            "bindings": self.bindings.bound_total,
            "bindings_refused_total": self.bindings.shares.refused_total,  # (past a connection's share)
            "published_total": self.published_total,
            "unrouted_total": self.unrouted_total,
            "delivered_total": self.consumers.delivered_total,
            "errors_total": self.errors_total,
            # (queues deleted whose records go over the next turns, and the messages they still hold)
            **dict(zip(("deleting_queues", "deleting_messages"), self.broker.dropping_left(), strict=True)),
            # (whole lines read but not served yet: the turn's budget ran out before them)
            "lines_waiting": sum(map(len, self._waiting.values())),
        }
