"""MQKS connections on the shared store: events, bindings, consumers and acks (shared/specs/mqks.md).

The server hands every connection's bytes to ``received`` and sends what ``dispatch`` returns after the
turn's commit, so a ``--confirm`` answer always follows the durable commit of what it confirms.

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
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import secrets
from collections.abc import Callable
from typing import Any

from pzq.broker import Broker, Ref
from pzq.errors import ProtocolError, StoreError, StoreFull
from pzq.gateways.contract import ONLY, Send
from pzq.logs import warn_bad
from pzq.protocols import mqks
from pzq.store.bindings import Binding, Bindings

log = logging.getLogger("pzq.mqks")

RESTART_GRACE_S = 30.0  # after a restart, a --delete-queue-when-unused queue waits this long for consumers
TURN_BUDGET = 100  # deliveries per consumer per turn, so that competing consumers share
MAX_EVENTS = 10_000  # events bound to one queue
CONFIRM, UPDATE = "confirm", "update"  # tokens of replies that a rolled-back turn must not send as they are


_serials = itertools.count(1)


@dataclasses.dataclass
class Consumer:
    conn: bytes
    id: str
    queue: str
    manual_ack: bool
    prefetch: int | None = None  # unacked at most (pzq's --prefetch=N), else the server's window
    unacked: dict[str, list[Ref]] = dataclasses.field(default_factory=dict)  # msg_id -> refs, oldest first
    # One per consumer ever made: a consumer replacing another of the same id on the same connection
    # is another holder (what the old one held may still be on its way back: see _put_back).
    serial: int = dataclasses.field(default_factory=lambda: next(_serials))

    @property
    def key(self) -> tuple:
        return ("mqks", self.conn, self.id, self.serial)


class MqksGateway:
    """Every MQKS connection, consumer and binding of the server."""

    def __init__(
        self,
        broker: Broker,
        *,
        max_line: int,
        window: int,
        drop_queue: Callable[[str], int],
        error_id: Callable[[], str] = lambda: secrets.token_hex(12),
    ):
        self.broker = broker
        self.error_id = error_id  # a fresh id per error reply: the client gets it, the log the details
        self.store = broker.store
        self.table = Bindings(broker.store)
        self.max_line = max_line
        self.window = window  # unacked deliveries per manual-ack consumer
        self._drop_queue = drop_queue
        self.sessions: dict[bytes, mqks.LineBuffer] = {}
        self.consumers: dict[tuple[bytes, str], Consumer] = {}
        self._by_conn: dict[bytes, dict[str, Consumer]] = {}  # the same consumers, per connection
        self.by_queue: dict[str, list[Consumer]] = {}
        self._out: list[Send] = []
        self.delete_at: dict[str, float] = {}
        self.blocked: frozenset = frozenset()  # connections that read too slowly: no more deliveries now
        self.published_total = self.unrouted_total = self.delivered_total = 0
        self.errors_total = 0
        # Consumers gone with deliveries not yet put back: a few thousand are put back per turn, so
        # that a connection leaving with MAX_UNACKED_PER_CONN of them does not stall the loop.
        self._leaving: collections.deque[tuple[Consumer, list[Ref]]] = collections.deque()
        self.load()

    def load(self) -> None:
        """Read the bindings: at start-up and after a rolled-back turn."""
        self.bindings: dict[str, Binding] = {}
        self.by_event: dict[str, set[str]] = {}
        self.bound_total = 0  # events of every binding together
        for queue, binding in self.table.items():
            self._set_binding(queue, binding, save=False)
        self._orphans = {q for q, b in self.bindings.items() if b.unused is not None and not self.by_queue.get(q)}
        self._orphan_grace = RESTART_GRACE_S

    def recover(self) -> None:
        """The turn was rolled back (the broker restarted from the disk): deliveries are forgotten,
        bindings re-read, and what was about to be confirmed is answered with an error instead."""
        for consumer in self.consumers.values():
            consumer.unacked.clear()
        self._leaving.clear()  # (the broker let go of every delivery)
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

    def connected(self, conn: bytes) -> None:
        self.sessions[conn] = mqks.LineBuffer(self.max_line)

    def buffered(self, conn: bytes) -> int:
        """Bytes of an unfinished line this connection holds."""
        lines = self.sessions.get(conn)
        return 0 if lines is None else lines.buffered

    def disconnected(self, conn: bytes) -> None:
        """The connection is gone: its consumers go, and what they held returns with retry raised."""
        self.sessions.pop(conn, None)
        for consumer in list(self._by_conn.get(conn, {}).values()):
            self._remove_consumer(consumer)

    def received(self, conn: bytes, data: bytes, *, now: float, now_us: int) -> list[Send]:
        """Bytes from a connection: the answers to its whole lines. A stream that cannot be framed any
        more (an endless line) is closed."""
        buffer = self.sessions.get(conn)
        if buffer is None:  # a connection already closed (STREAM announces every new one first)
            return []
        try:
            lines = buffer.feed(data)
        except ProtocolError as exc:
            warn_bad("mqks", exc.code, f"{exc.detail}; closing the connection")
            return [*self._take_out(), Send(ONLY, [conn], close=True)]
        for i, line in enumerate(lines):
            request_id = mqks.request_id_of(line)
            try:
                if len(line) > self.max_line:
                    raise ProtocolError("line-too-long", f"a line of {len(line)} bytes is over {self.max_line}")
                self._handle(conn, mqks.parse_line(line), now_us)
            except ProtocolError as exc:
                self._error(conn, request_id, exc.code, exc.detail)
            except StoreFull as exc:
                self._error(conn, request_id, "queue-full", str(exc))
            except StoreError:
                # The whole turn is rolled back by the server: this line and the rest get an error.
                for rest in lines[i:]:
                    self._error(conn, mqks.request_id_of(rest), "store-failed", "store failure; try again")
                raise
        return self._take_out()

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
        if req.action == "publish":
            self._publish(req.request_id, a["event"], a["data"], now_us)
        elif req.action == "consume":
            self._consume(conn, req.request_id, a)
        elif req.action == "rebind":
            self._rebind(req.request_id, a)
        elif req.action in ("ack", "reject"):
            self._settle(conn, req.action, a["consumer"], a["msg_id"])
        elif req.action == "delete_consumer":
            consumer = self.consumers.get((conn, a["consumer"]))
            if consumer is None:
                raise ProtocolError("unknown-consumer", f"no consumer {a['consumer']!r} on this connection")
            self._remove_consumer(consumer)
        elif req.action == "delete_queue":
            self._delete_queue(a["queue"])
        if req.confirm:
            self._out.append(Send(ONLY, [conn, mqks.ok(req.request_id)], (CONFIRM, req.request_id)))

    def _publish(self, msg_id: str, event: str, data: str, now_us: int) -> None:
        queues = self.by_event.get(event)
        if not queues:
            self.unrouted_total += 1  # as the reference: no queue is bound to the event
            return
        body = [data.encode()]
        self.broker.produce_all(
            [(queue, body) for queue in sorted(queues)], now_us=now_us, meta={"mqks": [msg_id, event]}
        )
        self.published_total += 1

    def _consume(self, conn: bytes, consumer_id: str, a: dict) -> None:
        queue = a["queue"]
        _check_sizes(a)
        self._room_for(queue)
        old = self.consumers.get((conn, consumer_id))
        if old is None and len(self._by_conn.get(conn, ())) >= MAX_CONSUMERS:
            raise ProtocolError("too-many-consumers", f"at most {MAX_CONSUMERS} consumers per connection")
        if old is None and len(self.consumers) >= MAX_ALL_CONSUMERS:
            raise ProtocolError("too-many-consumers", f"at most {MAX_ALL_CONSUMERS} consumers in all")
        binding = self.bindings.get(queue) or Binding([], owned=self.store.queue(queue, create=False) is None)
        events = list(a["events"]) if a["events"] is not None else list(binding.events)
        events = _with_added(events, a["add"])
        if len(set(events)) > MAX_EVENTS:  # checked before anything changes (the old consumer included)
            raise ProtocolError("too-many-events", f"queue {queue!r} would have more than {MAX_EVENTS} events")
        self._room_for_events(queue, events)
        self.store.queue(queue)  # the queue exists from now on, bound or not (may raise StoreFull)
        if old is not None:  # the same id again on this connection: it starts over
            self._remove_consumer(old)
        unused = a["unused"] if a["unused"] is not None else binding.unused
        consumer = Consumer(conn, consumer_id, queue, a["manual_ack"], a["prefetch"])
        changed = self._set_binding(queue, Binding(events, unused, binding.owned), save=True)
        self.consumers[(conn, consumer_id)] = consumer
        self._by_conn.setdefault(conn, {})[consumer_id] = consumer
        self.by_queue.setdefault(queue, []).append(consumer)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)
        if changed:
            self._notify(queue, skip=None if a["add"] else consumer)

    def _rebind(self, request_id: str, a: dict) -> None:
        queue = a["queue"]
        _check_sizes(a)
        self._room_for(queue)
        binding = self.bindings.get(queue) or Binding([], owned=self.store.queue(queue, create=False) is None)
        events = list(a["events"]) if a["events"] is not None else list(binding.events)
        removed = set(a["remove"])  # sets, not lists: linear in the request, whatever its size
        events = mqks.remove_masked([e for e in events if e not in removed], a["remove_mask"])
        events = _with_added(events, a["add"])
        self._room_for_events(queue, events)
        self.store.queue(queue)
        if self._set_binding(queue, Binding(events, binding.unused, binding.owned), save=True):
            self._notify(queue, skip=None)

    def _set_binding(self, queue: str, binding: Binding, *, save: bool) -> bool:
        """Make ``binding`` the queue's; True if its set of events changed."""
        binding.events = sorted(set(binding.events))
        if save and len(binding.events) > MAX_EVENTS:
            raise ProtocolError(
                "too-many-events", f"queue {queue!r} would have {len(binding.events)} events; at most {MAX_EVENTS}"
            )
        old = self.bindings.get(queue)
        changed = (old.events if old else []) != binding.events
        if old is not None:
            self._unbind(queue, old.events)
            self.bound_total -= len(old.events)
        self.bindings[queue] = binding
        self.bound_total += len(binding.events)
        for event in binding.events:
            self.by_event.setdefault(event, set()).add(queue)
        if save and (old is None or changed or old.unused != binding.unused):
            self.table.put(queue, binding)
        return changed

    def _unbind(self, queue: str, events: list[str]) -> None:
        for event in events:
            queues = self.by_event.get(event)
            if queues is not None:
                queues.discard(queue)
                if not queues:
                    del self.by_event[event]

    def _notify(self, queue: str, skip: Consumer | None) -> None:
        binding = self.bindings.get(queue)
        events, unused = (binding.events, binding.unused) if binding else ([], None)
        for consumer in self.by_queue.get(queue, []):
            if consumer is not skip:
                line = mqks.update(consumer.id, queue, events, unused, consumer.manual_ack)
                self._out.append(Send(ONLY, [consumer.conn, line], (UPDATE,)))

    def _settle(self, conn: bytes, action: str, consumer_id: str, msg_id: str | None) -> None:
        consumer = self.consumers.get((conn, consumer_id))
        if consumer is None:
            raise ProtocolError("unknown-consumer", f"no consumer {consumer_id!r} on this connection")
        if msg_id is None:
            refs = [ref for refs in consumer.unacked.values() for ref in refs]
            consumer.unacked.clear()
        else:  # ids may repeat (publishers number their requests): one message, the oldest held
            held = consumer.unacked.get(msg_id)
            if not held:
                raise ProtocolError("unknown-message", f"consumer {consumer_id!r} holds no message {msg_id!r}")
            refs = [held.pop(0)]
            if not held:
                del consumer.unacked[msg_id]
        for ref in refs:
            if action == "ack":
                self.broker.ack(ref, by=consumer.key)  # even late: the work is done (as a native late ack)
            elif self._held_by(ref, consumer):  # else its ack timeout gave it to another consumer already
                self.broker.requeue_at_end(ref, by=consumer.key)

    def _remove_consumer(self, consumer: Consumer) -> None:
        """Unregister; what it held goes back to the end of its queue, retry raised (as a reject)."""
        self._forget(consumer)
        peers = self.by_queue.get(consumer.queue, [])
        if consumer in peers:
            peers.remove(consumer)
        refs = [ref for held in consumer.unacked.values() for ref in held]
        refs.reverse()  # (_put_back pops from the end: the oldest go back first, as before)
        consumer.unacked = {}
        self._leaving.append((consumer, refs))  # put back by _put_back, in order, over the next turns
        if not peers:
            self.by_queue.pop(consumer.queue, None)
            binding = self.bindings.get(consumer.queue)
            if binding is not None and binding.unused is not None:
                self._orphans.add(consumer.queue)

    def _room_for_events(self, queue: str, events: list[str]) -> None:
        """Bindings of every queue together stay under MAX_BINDINGS (each is matched on every publish)."""
        old = self.bindings.get(queue)
        total = self.bound_total - (len(old.events) if old else 0) + len(set(events))
        if total > MAX_BINDINGS:
            raise ProtocolError("too-many-bindings", f"{total} bindings of all queues together; at most {MAX_BINDINGS}")

    def _room_for(self, queue: str) -> None:
        """A new binding record past the store limit or while the disk is short is refused before
        anything changes (a binding that grows is written: MAX_BINDINGS bounds those)."""
        if queue not in self.bindings:
            self.store.check_room(len(queue.encode()) + 64)

    def _forget(self, consumer: Consumer) -> None:
        self.consumers.pop((consumer.conn, consumer.id), None)
        mine = self._by_conn.get(consumer.conn)
        if mine is not None and mine.get(consumer.id) is consumer:
            del mine[consumer.id]
            if not mine:
                del self._by_conn[consumer.conn]

    def _delete_queue(self, queue: str) -> None:
        # Only an MQKS queue, and not from under another protocol's clients: deleting it would settle
        # every message they hold or lease, which no client may do to another's.
        if queue not in self.bindings or not self.bindings[queue].owned:
            raise ProtocolError(
                "unknown-queue",
                f"no MQKS queue {queue!r} (only queues MQKS made can be deleted "
                "through it; one that existed before MQKS bound it belongs to others too)",
            )
        info = self.store.queue(queue, create=False)
        if info is not None and self.broker.held_by_others(info.qid, lambda holder: holder[:1] == ("mqks",)):
            raise ProtocolError(
                "queue-in-use",
                f"queue {queue!r} has messages held by clients of another protocol or leased by an API group",
            )
        consumers = self.by_queue.pop(queue, [])
        for consumer in consumers:
            self._forget(consumer)
            self._out.append(Send(ONLY, [consumer.conn, mqks.update(consumer.id, queue, [], None, False)], (UPDATE,)))
        binding = self.bindings.pop(queue, None)
        if binding is not None:
            self._unbind(queue, binding.events)
            self.bound_total -= len(binding.events)
        self.table.delete(queue)
        self.delete_at.pop(queue, None)
        self._orphans.discard(queue)
        dropped = self._drop_queue(queue)
        log.info("MQKS queue %r deleted with %d message(s)", queue, dropped)

    # -- handing out -----------------------------------------------------------------------------------

    def _put_back(self, budget: int) -> None:
        """What consumers that left held goes back to the end of its queue, retry raised (as a reject)."""
        while self._leaving and budget > 0:
            consumer, refs = self._leaving[0]
            while refs and budget > 0:
                ref = refs.pop()
                budget -= 1
                if self._held_by(ref, consumer):
                    self.broker.requeue_at_end(ref, by=consumer.key)
            if not refs:
                self._leaving.popleft()
                self.broker.consumer_gone(consumer.key)  # whatever is left (requeued ones are no-ops)

    def dispatch(self, *, now: float, now_us: int, blocked: frozenset = frozenset()) -> list[Send]:
        """Everything to send this turn: replies, then deliveries; and queues unused for long enough go.
        ``blocked`` connections read too slowly: no more deliveries for them now."""
        self.blocked = blocked
        self._expire_unused(now)
        self._put_back(PUT_BACK_PER_TURN)
        conn_held: dict[bytes, int] = {}  # unacked deliveries per connection, counted once per turn
        for queue, consumers in list(self.by_queue.items()):
            ready = self.broker.ready_count(queue)
            if ready <= 0:
                continue
            share = -(-ready // len(consumers))  # competing consumers split what is ready
            for consumer in list(consumers):
                self._deliver(consumer, min(share, TURN_BUDGET), now, now_us, conn_held)
            if len(consumers) > 1:  # and take turns at the head of the queue
                consumers.append(consumers.pop(0))
        return self._take_out()

    def _deliver(self, consumer: Consumer, budget: int, now: float, now_us: int, conn_held: dict[bytes, int]) -> None:
        if consumer.conn in self.blocked:
            return
        if consumer.manual_ack:
            window = consumer.prefetch or self.window
            if consumer.conn not in conn_held:
                conn_held[consumer.conn] = sum(
                    self.broker.inflight.count(c.key)
                    for c in self._by_conn.get(consumer.conn, {}).values()
                    if c.manual_ack
                )
            credit = min(
                budget,
                window - self.broker.inflight.count(consumer.key),
                MAX_UNACKED_PER_CONN - conn_held[consumer.conn],
            )
            if sum(map(len, consumer.unacked.values())) > 2 * window:  # forget what went elsewhere
                consumer.unacked = {
                    m: [r for r in refs if self._held_by(r, consumer)] for m, refs in consumer.unacked.items()
                }
                consumer.unacked = {m: refs for m, refs in consumer.unacked.items() if refs}
        else:
            credit = budget
        if credit <= 0:
            return
        for message in self.broker.take(consumer.queue, credit, consumer.key, now=now, now_us=now_us):
            msg_id, event = (message.meta or {}).get("mqks") or (message.id, message.queue)
            ref = (message.qid, message.seq)
            line = mqks.delivery(consumer.id, msg_id, event, message.deliveries - 1, mqks.body_text(message.frames))
            if consumer.manual_ack:
                held = consumer.unacked.setdefault(msg_id, [])
                if ref not in held:  # back again after its ack timeout: still one message
                    held.append(ref)
                undo: tuple = ("manual", consumer, msg_id, ref)
            else:
                # at most once: gone (durably, with this turn) before the line leaves
                self.broker.ack(ref, by=consumer.key)
                undo = ("auto",)
            self.delivered_total += 1
            if consumer.manual_ack:
                conn_held[consumer.conn] += 1
            self._out.append(Send(ONLY, [consumer.conn, line], undo))

    def _held_by(self, ref: Ref, consumer: Consumer) -> bool:
        delivery = self.broker.inflight.get(ref)
        return delivery is not None and delivery.consumer == consumer.key

    def unsent(self, send: Send) -> bool:
        """A line the client's connection would not take now. A manual-ack delivery is taken back (it
        stays stored); anything else, an auto-ack delivery included (its message is already deleted),
        is kept by the endpoint and sent once the client reads again: True."""
        token: Any = send.token
        if token is None or token[0] != "manual":
            return True
        _, consumer, msg_id, ref = token
        refs = consumer.unacked.get(msg_id, [])
        if ref in refs:
            refs.remove(ref)
        self.broker.undeliver(ref)
        return False

    def _expire_unused(self, now: float) -> None:
        for queue in self._orphans:
            binding = self.bindings.get(queue)
            if binding is not None and binding.unused is not None:
                self.delete_at[queue] = now + max(binding.unused, self._orphan_grace)
        self._orphans.clear()
        self._orphan_grace = 0.0
        for queue in [q for q, t in self.delete_at.items() if t <= now]:
            del self.delete_at[queue]
            if not self.by_queue.get(queue) and queue in self.bindings:
                try:
                    self._delete_queue(queue)
                except ProtocolError as exc:
                    log.info("MQKS queue %r not deleted when unused: %s", queue, exc.detail)
                    if self.bindings[queue].owned:  # in use by another protocol: try again after the wait
                        self.delete_at[queue] = now + max(self.bindings[queue].unused or 0, 1.0)

    def next_wake(self, now: float) -> float | None:
        return min(self.delete_at.values()) if self.delete_at else None

    def clients(self, now: float, limit: int) -> list[dict]:
        rows = []
        for conn in itertools.islice(self.sessions, limit):
            mine = list(self._by_conn.get(conn, {}).values())
            queues = ", ".join(sorted({c.queue for c in mine}))
            rows.append([conn.hex(), len(mine), queues[:200] or "-", sum(len(c.unacked) for c in mine)])
        columns = ["connection", "consumers", "queues", "unacked"]
        return [{"kind": "mqks", "title": "Connections", "columns": columns, "rows": rows, "total": len(self.sessions)}]

    def stats(self) -> dict:
        return {
            "connections": len(self.sessions),
            "consumers": len(self.consumers),
            "bound_queues": len(self.bindings),
            "bindings": self.bound_total,
            "published_total": self.published_total,
            "unrouted_total": self.unrouted_total,
            "delivered_total": self.delivered_total,
            "errors_total": self.errors_total,
        }


MAX_MASKS = 100  # --remove-mask masks in one request
MAX_CONSUMERS = 1000  # consumers on one connection (each is looked at every turn)
MAX_ALL_CONSUMERS = 100_000  # consumers of every connection together
MAX_BINDINGS = 1_000_000  # (queue, event) bindings of every queue together
MAX_UNACKED_PER_CONN = 10_000  # manual-ack deliveries one connection's consumers hold together
PUT_BACK_PER_TURN = 2_000  # deliveries of departed consumers put back per turn (~20 ms)


def _check_sizes(a: dict) -> None:
    """Refuse an oversized consume or rebind before any work is done for it."""
    for name in ("events", "remove", "add"):
        if len(a.get(name) or ()) > MAX_EVENTS:
            raise ProtocolError("too-many-events", f"{len(a[name])} events in one request; at most {MAX_EVENTS}")
    if len(a.get("remove_mask") or ()) > MAX_MASKS:
        raise ProtocolError("too-many-masks", f"{len(a['remove_mask'])} masks in one request; at most {MAX_MASKS}")


def _with_added(events: list[str], added: list[str]) -> list[str]:
    present = set(events)
    out = list(events)
    for event in added:
        if event not in present:
            present.add(event)
            out.append(event)
    return out
