"""Batched native consumers (PZQ-BATCH/1) on the native queue: credit, batched deliveries, batched acks.

Each consumer (its ROUTER routing id) is its own holder in the broker, ``(HOLDER, routing id)``, so
it settles only what was delivered to it; the legacy send socket's consumers share the holder
``native`` and the same queue. A consumer asks for deliveries with CREDIT (additive: each delivery
uses one); what it holds and what it is still granted together stay under
``Limits.consume_max_credit``, and its bodies in flight (or timed out, until it answers or is gone) stay
within its byte share of the broker's account (``Limits.delivery_share``, pzq/broker/accounts.py): credit
in messages and in bytes. Consumers with credit are served round-robin, one batch of at most
``Limits.consume_max_batch`` each in turn, so a big credit does not starve the others; the endpoint
draws every batch on the turn's budget.

Who is known, their slots per CURVE key, their connections and their silence are the table's
(gateways/native_consumers.py); this module serves them: commands in, answers and batches out.

Pure: no sockets, no clock (the turn's ``Now`` is handed in). Every answer is sent after the
turn's commit, so SETTLED means durably settled.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
from collections.abc import Callable, Sequence

from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError
from pzq.gateways.contract import BrokerSurface, Columns, Ref
from pzq.gateways.native import ref_of_key
from pzq.gateways.native_consumers import HOLDER, Consumer, Consumers
from pzq.gateways.native_keys import message_keys, refs_of_keys
from pzq.logs import peer_label, warn_bad
from pzq.protocols import native_consume as wire


@dataclasses.dataclass
class Out:
    """An answer or a batch to send after the commit, routing id first. ``refs``: the deliveries a
    DELIVER carries; ``kind``: the command answered (SETTLED after a rollback becomes an ERR)."""

    frames: list[bytes]
    kind: bytes
    refs: tuple[Ref, ...] = ()


class BatchConsumeGateway:
    """The consumers of the batched endpoint: commands in, answers and batches of deliveries out."""

    def __init__(self, broker: BrokerSurface, *, queue: str, ack_timeout_s: float, limits: Limits = DEFAULT_LIMITS):
        self.broker = broker
        self.queue = queue
        self.ack_timeout_s = ack_timeout_s
        self.ack_timeout_us = round(ack_timeout_s * 1e6)
        self.limits = limits  # consume_* (see pzq/limits.py)
        self.table = Consumers(broker, limits)  # who is known, their slots and connections
        self.consumers = self.table.known  # the least recently heard first
        self._ring: collections.deque[Consumer] = collections.deque()  # consumers with credit, in serving order
        self._stalled_at: int | None = None  # the broker's readiness when a take found nothing
        self.dispatched = 0  # messages handed out by the last dispatch call
        self.dispatched_bytes = 0  # and the bytes of their bodies (they draw on the turn's bytes)
        self.delivered_total = self.batches_total = self.refused_total = 0
        self.errors_total = 0

    # -- commands --------------------------------------------------------------------------------

    def received(self, peer: bytes, frames: list[bytes], *, now: float, user: str | None = None) -> list[Out]:
        """One command from ``peer`` (without its routing frame; ``user``: its CURVE key, if any): what to
        answer after the commit."""
        try:
            command = wire.parse_command(frames, self.limits.consume_max_keys)
        except ProtocolError as exc:
            return [self._error(peer, exc.code, exc.detail)]
        consumer = self.table.heard(peer, now)
        if command.name == wire.HELLO:
            return [self._hello(peer, consumer, now, user)]
        if command.name == wire.CREDIT:
            return self._credit(peer, consumer, command.count)
        if command.name == wire.BYE:
            returned = self.table.gone(peer)
            return [Out([peer, *wire.bye_reply(returned)], wire.BYE)]
        return [self._settle(peer, consumer, command)]

    def _hello(self, peer: bytes, consumer: Consumer | None, now: float, user: str | None) -> Out:
        if consumer is None:
            admitted = self.table.admit(peer, now, user)
            if isinstance(admitted, str):
                return self._error(peer, "too-many-consumers", admitted)
        limits = self.limits
        idle_us = round(limits.consume_idle_s * 1e6)
        reply = wire.hello_reply(
            limits.consume_max_credit, limits.consume_max_batch, limits.consume_max_keys, self.ack_timeout_us, idle_us
        )
        return Out([peer, *reply], wire.HELLO)

    def _credit(self, peer: bytes, consumer: Consumer | None, count: int) -> list[Out]:
        if consumer is None:
            return [self._error(peer, "hello-first", "unknown consumer (never said HELLO, or forgotten): send HELLO")]
        if count == 0:
            return []  # (a consumer saying it is still there)
        held = self.broker.deliveries.count(consumer.holder)
        most = self.limits.consume_max_credit
        if consumer.credit + held + count > most:
            return [
                self._error(
                    peer,
                    "too-much-credit",
                    f"it holds {held} and has {consumer.credit} credit; {count} more would pass {most}",
                )
            ]
        consumer.credit += count
        self._enring(consumer)
        return []

    def _settle(self, peer: bytes, consumer: Consumer | None, command: wire.Command) -> Out:
        """ACK or NACK: every key in order, in this turn; the keys refused are answered back."""
        holder = (HOLDER, peer)
        refused: list[bytes] = []
        settled: list[Ref] = []
        if command.name == wire.ACK:
            keyed = refs_of_keys(command.keys)
            refs: list[Ref] = keyed if None not in keyed else [ref for ref in keyed if ref is not None]  # type: ignore[assignment]
            not_acked = self.broker.ack_many(refs, by=holder)
            if not not_acked and len(refs) == len(keyed):
                settled = refs  # (the usual case: every key named once, each held by this consumer)
            else:
                # The broker acks a key's first mention and refuses its repeats: a ref was acked when it
                # was named more often than refused (a set of the refused would report an acked key refused)
                named_count = collections.Counter(refs)
                named_count.subtract(not_acked)
                acked = {ref for ref, left in named_count.items() if left > 0}
                for key, ref in zip(command.keys, keyed, strict=True):  # (refused in the ACK's order)
                    if ref is not None and ref in acked:
                        acked.discard(ref)
                        settled.append(ref)
                    else:
                        refused.append(key)
        else:
            for key in command.keys:
                ref = ref_of_key(key)
                if ref is not None and self.broker.requeue(ref, by=holder):
                    settled.append(ref)
                else:
                    refused.append(key)
        if consumer is not None and settled:
            consumer.reader = True
        if refused:
            self.refused_total += len(refused)
            warn_bad(
                "batch consumer",
                "not-held",
                f"{len(refused)} of {len(command.keys)} key(s) of a {command.name.decode()} not held by it "
                f"(unknown, settled or another's), e.g. {refused[0][:60]!r}: refused",
            )
        return Out([peer, *wire.settled(len(settled), refused)], command.name)

    def _error(self, peer: bytes, code: str, detail: str) -> Out:
        self.errors_total += 1
        warn_bad("batch consumer", code, detail)
        return Out([peer, *wire.error(code, detail)], wire.ERR)

    # -- deliveries ------------------------------------------------------------------------------

    def dispatch(
        self,
        *,
        now: Now,
        most: int,
        blocked: Callable[[bytes], bool],
        most_bytes: int = 1 << 62,
    ) -> list[Out]:
        """Hand out up to ``most`` messages and about ``most_bytes`` of bodies (a batch may pass it by one
        message), a batch per consumer with credit in turn (round-robin); ``blocked(peer)``: its answers
        cannot leave now, skip it. ``dispatched`` and ``dispatched_bytes`` say how many."""
        self.dispatched = self.dispatched_bytes = 0
        out: list[Out] = []
        if self._stalled_at == self.broker.readiness:
            return out
        skipped = 0
        while (
            self.dispatched < most and self.dispatched_bytes < most_bytes and self._ring and skipped < len(self._ring)
        ):
            consumer = self._ring.popleft()
            peer = consumer.peer
            if consumer.credit <= 0 or self.consumers.get(peer) is not consumer:
                consumer.ringed = False  # (its credit used up, or forgotten: off the ring)
                continue
            if blocked(peer):
                self._ring.append(consumer)
                skipped += 1
                continue
            n = min(consumer.credit, self.limits.consume_max_batch, most - self.dispatched)
            readiness = self.broker.readiness  # (as the take began: a take cut short raises it)
            # (one DELIVER's bytes a turn of the ring; the take stops at the consumer's byte share)
            taken = self.broker.take_columns(
                self.queue, n, consumer.holder, now=now, max_bytes=self.limits.consume_batch_bytes
            )
            if not taken.refs and self.broker.ready_count(self.queue) > 0:  # (no room in its share: the others' turn)
                self._ring.append(consumer)
                skipped += 1
                continue
            if not taken.refs:
                self._ring.appendleft(consumer)
                self._stalled_at = readiness
                break
            skipped = 0
            got = len(taken.refs)
            consumer.credit -= got
            if consumer.credit > 0:
                self._ring.append(consumer)
            else:
                consumer.ringed = False
            self.dispatched += got
            self.delivered_total += got
            out += self._batches(peer, taken, now.wall_us)
        return out

    def _batches(self, peer: bytes, taken: Columns, now_us: int) -> list[Out]:
        """DELIVER frames for ``taken``, each at most consume_batch_bytes of bodies (or one message): one
        encoding of each DELIVER's keys and bodies, as they came from the store."""
        refs, enqueued, frames, sizes, ids = taken.refs, taken.enqueued, taken.frames, taken.sizes, taken.ids
        total = sum(sizes)
        self.dispatched_bytes += total
        cap = self.limits.consume_batch_bytes
        if total <= cap:  # (the usual batch: one DELIVER)
            return [self._deliver(peer, refs, ids, enqueued, frames, now_us)]
        out: list[Out] = []
        ends = list(itertools.accumulate(sizes))
        start = 0
        while start < len(refs):  # (each DELIVER up to the cap, at least one message)
            base = ends[start - 1] if start else 0
            end = max(start + 1, bisect.bisect_right(ends, base + cap))
            part = slice(start, end)
            out.append(self._deliver(peer, refs[part], ids[part], enqueued[part], frames[part], now_us))
            start = end
        return out

    def _deliver(self, peer: bytes, refs: list, ids: list, enqueued: list, bodies: list, now_us: int) -> Out:
        """One DELIVER, its keys and bodies each encoded once."""
        self.batches_total += 1
        keys = message_keys(ids, enqueued)
        frames = wire.deliver_packed(self.ack_timeout_us, now_us, keys, bodies)
        return Out([peer, *frames], wire.DELIVER, tuple(refs))

    def unsent(self, out: Out) -> None:
        """A DELIVER that could not leave (its consumer is gone): its messages go back to the queue, and
        the consumer is forgotten (with what else it held: nobody is there to ack it)."""
        self.broker.take_back_many(out.refs)
        self.table.gone(out.frames[0], counted=True)

    def rolled_back(self, outs: list[Out]) -> list[Out]:
        """The turn's commit failed: its deliveries are dropped (their credit given back), and a
        SETTLED becomes an ERR: nothing of it was kept, and the broker forgot what this endpoint's
        consumers held (it is ready again: at-least-once), so their later acks of it are refused."""
        kept = []
        for out in outs:
            peer = out.frames[0]
            if out.kind == wire.DELIVER:
                consumer = self.consumers.get(peer)
                if consumer is not None:
                    consumer.credit += len(out.refs)
                    self._enring(consumer)
                continue
            if out.kind in (wire.ACK, wire.NACK):
                detail = "the store failed and the turn was rolled back: nothing settled, what was held is queued again"
                kept.append(Out([peer, *wire.error("store-failure", detail)], wire.ERR))
                continue
            kept.append(out)
        return kept

    def _enring(self, consumer: Consumer) -> None:
        if not consumer.ringed and consumer.credit > 0:
            consumer.ringed = True
            self._ring.append(consumer)

    def would_send(self) -> bool:
        """True if a dispatch may hand something out."""
        return bool(self._ring) and self._stalled_at != self.broker.readiness

    # -- consumers that went silent or whose connection closed (the table's: native_consumers.py) ---------

    def sweep(self, now: float) -> None:
        """Consumers silent for consume_idle_s lose their credit; those that hold nothing are forgotten."""
        self.table.sweep(now)

    def next_sweep(self) -> float | None:
        """When the least recently heard consumer becomes idle."""
        return self.table.next_sweep()

    def known_connections(self, came: Sequence[tuple[bytes, int, str | None]]) -> bool:
        """True if ``connection`` would change nothing for any of these (consumer, descriptor, CURVE key)."""
        return self.table.known_connections(came)

    def connection(self, peer: bytes, fd: int, user: str | None = None) -> None:
        """Commands of ``peer`` came over the open connection of descriptor ``fd``."""
        self.table.connection(peer, fd, user)

    def disconnected(self, fd: int) -> None:
        """The connection of descriptor ``fd`` closed: what its consumer held goes back at once."""
        self.table.disconnected(fd)

    def revoke(self, users: set[str]) -> int:
        """These CURVE keys were revoked: their consumers are forgotten; returns how many."""
        return self.table.revoke(users)

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """Its consumers (all of one queue) and what each holds, each with the descriptor of its connection
        (``fd``, -1 if not known: the endpoint, which knows the connections, names their peers)."""
        if queue != self.queue:
            return [], 0
        held = self.broker.deliveries.count
        rows = [
            {"protocol": "native batch", "client": peer_label(c.peer), "held": held(c.holder), "fd": c.fd}
            for c in itertools.islice(self.consumers.values(), limit)
        ]
        return rows, len(self.consumers)

    def stats(self) -> dict:
        """The monitor's figures of the batched consumers."""
        return {
            "consumers": len(self.consumers),
            "credit": sum(c.credit for c in self.consumers.values()),
            "delivered_total": self.delivered_total,
            "frames_total": self.batches_total,
            "refused_keys_total": self.refused_total,
            "errors_total": self.errors_total,
            "evicted_total": self.table.evicted_total,
            "forgotten_total": self.table.forgotten_total,
            "slot_holders": len(self.table.slots.held),
            "refused_slots_total": self.table.slots.refused_total,
        }
