"""MQKS consumers and their deliveries: who consumes which queue, what each holds, handing out.

Consumers belong to their connection (ids are looked up per connection). Auto-ack consumers get each
message at most once: it is deleted (durably, with the turn) before its line is sent. Manual-ack
consumers get it at least once, within a window per consumer and ``Limits.mqks_max_unacked_per_conn``
per connection; what a departed consumer held goes back to the end of its queue, retry raised, a
share per turn (``Limits.mqks_put_back_per_turn``), so that a big departure never stalls the loop.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

from pzq.clock import Now
from pzq.config import Limits
from pzq.errors import ProtocolError
from pzq.gateways.contract import ONLY, BrokerSurface, Ref, Send
from pzq.protocols import mqks

_serials = itertools.count(1)


@dataclasses.dataclass
class Consumer:
    """One consumer of one connection."""

    conn: bytes
    id: str
    queue: str
    manual_ack: bool
    prefetch: int | None = None  # unacked at most (pzq's --prefetch=N), else the server's window
    unacked: dict[str, list[Ref]] = dataclasses.field(default_factory=dict)  # msg_id -> refs, oldest first
    # One per consumer ever made: a consumer replacing another of the same id on the same connection
    # is another holder (what the old one held may still be on its way back: see put_back).
    serial: int = dataclasses.field(default_factory=lambda: next(_serials))
    notice_due: bool = False  # to be told its queue's events (mqks_out.py: once, however many changes)

    @property
    def key(self) -> tuple:
        """The broker's holder for what this consumer holds."""
        return ("mqks", self.conn, self.id, self.serial)


class Consumers:
    """Every MQKS consumer of the server, by connection and by queue, and their deliveries."""

    def __init__(self, broker: BrokerSurface, limits: Limits, window: int):
        self.broker = broker
        self.limits = limits
        self.window = window  # unacked deliveries per manual-ack consumer
        self.all: dict[tuple[bytes, str], Consumer] = {}
        self._by_conn: dict[bytes, dict[str, Consumer]] = {}  # the same consumers, per connection
        self.by_queue: dict[str, list[Consumer]] = {}
        self.delivered_total = 0
        # Consumers gone with deliveries not yet put back: a few thousand are put back per turn, so
        # that a connection leaving with mqks_max_unacked_per_conn of them does not stall the loop.
        self._leaving: collections.deque[tuple[Consumer, list[Ref]]] = collections.deque()
        self._next_queue = 0  # where the next ``deliver`` begins among the queues (a turn's share: most)

    def __len__(self) -> int:
        return len(self.all)

    def get(self, conn: bytes, consumer_id: str) -> Consumer | None:
        return self.all.get((conn, consumer_id))

    def of(self, conn: bytes) -> list[Consumer]:
        """The consumers of one connection."""
        return list(self._by_conn.get(conn, {}).values())

    def holding(self, conn: bytes) -> bool:
        """True while a consumer of the connection holds unacked deliveries (not timed out yet)."""
        return any(self.broker.deliveries.count(consumer.key) for consumer in self._by_conn.get(conn, {}).values())

    def of_queue(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """The consumers of ``queue`` as the monitor's QUEUE lists them (at most ``limit``), and how many."""
        mine = self.by_queue.get(queue, [])
        held = self.broker.deliveries.count
        return [
            {"protocol": "mqks", "client": f"{c.conn.hex()}/{c.id[:40]}", "held": held(c.key), "conn": c.conn}
            for c in mine[:limit]
        ], len(mine)

    def used(self, queue: str) -> bool:
        """True if a consumer consumes ``queue``."""
        return bool(self.by_queue.get(queue))

    def room_for(self, conn: bytes, consumer_id: str) -> None:
        """Refuse a new consumer past the limits per connection and in all (the same id again on
        the same connection replaces itself: always allowed)."""
        if (conn, consumer_id) in self.all:
            return
        per_conn, in_all = self.limits.mqks_max_consumers, self.limits.mqks_max_all_consumers
        if len(self._by_conn.get(conn, ())) >= per_conn:
            raise ProtocolError("too-many-consumers", f"at most {per_conn} consumers per connection")
        if len(self.all) >= in_all:
            raise ProtocolError("too-many-consumers", f"at most {in_all} consumers in all")

    def add(self, consumer: Consumer) -> None:
        self.all[(consumer.conn, consumer.id)] = consumer
        self._by_conn.setdefault(consumer.conn, {})[consumer.id] = consumer
        self.by_queue.setdefault(consumer.queue, []).append(consumer)

    def remove(self, consumer: Consumer) -> bool:
        """Unregister; what it held goes back to the end of its queue, retry raised (as a reject), over
        the next turns. True if its queue has no consumer left."""
        self._forget(consumer)
        peers = self.by_queue.get(consumer.queue, [])
        if consumer in peers:
            peers.remove(consumer)
        refs = [ref for held in consumer.unacked.values() for ref in held]
        refs.reverse()  # (put_back pops from the end: the oldest go back first, as before)
        consumer.unacked = {}
        self._leaving.append((consumer, refs))
        if not peers:
            self.by_queue.pop(consumer.queue, None)
            return True
        return False

    def drop_queue(self, queue: str) -> list[Consumer]:
        """Unregister every consumer of a queue that is being deleted (what they hold goes with it)."""
        consumers = self.by_queue.pop(queue, [])
        for consumer in consumers:
            self._forget(consumer)
        return consumers

    def _forget(self, consumer: Consumer) -> None:
        self.all.pop((consumer.conn, consumer.id), None)
        mine = self._by_conn.get(consumer.conn)
        if mine is not None and mine.get(consumer.id) is consumer:
            del mine[consumer.id]
            if not mine:
                del self._by_conn[consumer.conn]

    def forget_deliveries(self) -> None:
        """The broker let go of every delivery (a rolled-back turn): nobody holds anything."""
        for consumer in self.all.values():
            consumer.unacked.clear()
        self._leaving.clear()

    def __iter__(self) -> Iterator[Consumer]:
        return iter(self.all.values())

    # -- settling ----------------------------------------------------------------------------------

    def settle(self, consumer: Consumer, action: str, msg_id: str | None) -> None:
        """Ack or reject one message the consumer holds by its msg_id, or all it holds (None)."""
        if msg_id is None:
            refs = [ref for refs in consumer.unacked.values() for ref in refs]
            consumer.unacked.clear()
        else:  # ids may repeat (publishers number their requests): one message, the oldest held
            held = consumer.unacked.get(msg_id)
            if not held:
                raise ProtocolError("unknown-message", f"consumer {consumer.id!r} holds no message {msg_id!r}")
            refs = [held.pop(0)]
            if not held:
                del consumer.unacked[msg_id]
        for ref in refs:
            if action == "ack":
                self.broker.ack(ref, by=consumer.key)  # even late: the work is done (as a native late ack)
            elif self._held_by(ref, consumer):  # else its ack timeout gave it to another consumer already
                self.broker.requeue(ref, by=consumer.key, at_end=True)

    def _held_by(self, ref: Ref, consumer: Consumer) -> bool:
        return self.broker.deliveries.holder(ref) == consumer.key

    def put_back(self, most: int | None = None) -> None:
        """What consumers that left held goes back to the end of its queue, retry raised (as a reject),
        at most a share of it per turn (and ``most`` in one call)."""
        budget = min(self.limits.mqks_put_back_per_turn, most or self.limits.mqks_put_back_per_turn)
        while self._leaving and budget > 0:
            consumer, refs = self._leaving[0]
            while refs and budget > 0:
                ref = refs.pop()
                budget -= 1
                if self._held_by(ref, consumer):
                    self.broker.requeue(ref, by=consumer.key, at_end=True)
            if not refs:
                self._leaving.popleft()
                self.broker.gone(consumer.key)  # whatever is left (requeued ones are no-ops)

    # -- handing out -------------------------------------------------------------------------------

    def deliver(
        self, *, now: Now, blocked: frozenset, most: int | None = None, most_bytes: int | None = None
    ) -> list[Send]:
        """This turn's deliveries: competing consumers of a queue split what is ready and take turns
        at its head; ``blocked`` connections read too slowly and get nothing now. At most ``most`` of
        them and about ``most_bytes`` of bodies (the turn's share); a call that stops there leaves the
        next call to begin where it stopped."""
        out: list[Send] = []
        conn_held: dict[bytes, int] = {}  # unacked deliveries per connection, counted once per turn
        left = [most if most is not None else 1 << 62, most_bytes if most_bytes is not None else 1 << 62]
        queues = list(self.by_queue.items())
        start = self._next_queue % len(queues) if queues else 0
        for at in range(len(queues)):
            queue, consumers = queues[(start + at) % len(queues)]
            if left[0] <= 0 or left[1] <= 0:
                self._next_queue = start + at  # (the next call begins with this queue)
                break
            ready = self.broker.ready_count(queue)
            if ready <= 0 or queue not in self.by_queue:
                continue
            share = -(-ready // len(consumers))
            for consumer in list(consumers):
                if consumer.conn not in blocked and left[0] > 0 and left[1] > 0:
                    budget = min(share, self.limits.mqks_turn_budget, left[0])
                    self._deliver(consumer, budget, now, conn_held, out, left)
            if len(consumers) > 1:
                consumers.append(consumers.pop(0))
        else:
            self._next_queue = start + 1  # (the next turn begins one queue further: none comes first always)
        return out

    def _credit(self, consumer: Consumer, budget: int, conn_held: dict[bytes, int]) -> int:
        """How many a manual-ack consumer may be handed now: its window, and its connection's share."""
        window = consumer.prefetch or self.window
        if consumer.conn not in conn_held:
            conn_held[consumer.conn] = sum(
                self.broker.deliveries.count(c.key)
                for c in self._by_conn.get(consumer.conn, {}).values()
                if c.manual_ack
            )
        credit = min(
            budget,
            window - self.broker.deliveries.count(consumer.key),
            self.limits.mqks_max_unacked_per_conn - conn_held[consumer.conn],
        )
        if sum(map(len, consumer.unacked.values())) > 2 * window:  # forget what went elsewhere
            consumer.unacked = {
                m: [r for r in refs if self._held_by(r, consumer)] for m, refs in consumer.unacked.items()
            }
            consumer.unacked = {m: refs for m, refs in consumer.unacked.items() if refs}
        return credit

    def _deliver(
        self,
        consumer: Consumer,
        budget: int,
        now: Now,
        conn_held: dict[bytes, int],
        out: list[Send],
        left: list[int],
    ) -> None:
        credit = self._credit(consumer, budget, conn_held) if consumer.manual_ack else budget
        if credit <= 0:
            return
        # (their bytes are charged to the connection: its consumers together hold one share)
        taken = self.broker.take(
            consumer.queue,
            credit,
            consumer.key,
            now=now,
            payer=("mqks", consumer.conn),
            max_bytes=max(left[1], 1),
        )
        left[0] -= len(taken)
        left[1] -= sum(sum(map(len, message.frames)) for message in taken)
        for message in taken:
            msg_id, event = (message.meta or {}).get("mqks") or (message.id, message.queue)
            ref = (message.qid, message.seq)
            line = mqks.delivery(consumer.id, msg_id, event, message.deliveries - 1, mqks.body_text(message.frames))
            if consumer.manual_ack:
                held = consumer.unacked.setdefault(msg_id, [])
                if ref not in held:  # back again after its ack timeout: still one message
                    held.append(ref)
                undo: tuple = ("manual", consumer, msg_id, ref)
                conn_held[consumer.conn] += 1
            else:
                # at most once: gone (durably, with this turn) before the line leaves
                self.broker.ack(ref, by=consumer.key)
                undo = ("auto",)
            self.delivered_total += 1
            out.append(Send(ONLY, [consumer.conn, line], undo))

    def unsent(self, send: Send) -> bool:
        """A line the client's connection would not take now (see MqksGateway.unsent)."""
        token: Any = send.token
        if token is None or token[0] != "manual":
            return True
        _, consumer, msg_id, ref = token
        refs = consumer.unacked.get(msg_id, [])
        if ref in refs:
            refs.remove(ref)
        self.broker.take_back_many((ref,))
        return False
