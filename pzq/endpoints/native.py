"""The native PZQ endpoints: producers on the receive ROUTER, consumers on the send DEALER."""

from __future__ import annotations

import logging
import struct
import time

import zmq

from pzq.broker import Broker, Ref
from pzq.config import Config
from pzq.credit import NativeCredit
from pzq.endpoints.base import TURN_BYTES, Endpoint, Sockets, receive
from pzq.endpoints.replies import Replies
from pzq.errors import StoreError
from pzq.logs import warn_bad
from pzq.protocols import pzq as native
from pzq.store import Message, parse_message_id
from pzq.zmqio import NOBLOCK, POLLIN, POLLOUT, Again, events, recv_frames, send_frames

log = logging.getLogger("pzq.server")

READ_BATCH = 4096  # messages read from one socket per turn
_REF = struct.Struct(">QQ")  # a message id's 32 hex digits as bytes: (qid, seq)
ACKS_UNREAD = 10_000  # acks a producer may leave unread in its pipe before they wait in our backlog
CONSUMER = "native"  # the send socket's DEALER hides which consumer got what: one credit pool


class NativeEndpoints(Endpoint):
    """Stores what producers send and acks it after the commit; hands the configured queue to
    consumers, at most ``--max-inflight`` unacknowledged at once."""

    name = "native"

    def __init__(self, config: Config, broker: Broker, binder: Sockets):
        self.config = config
        self.broker = broker
        # Bigger messages are refused by libzmq before they are buffered (the peer is disconnected).
        self.receive = binder.bind(
            zmq.ROUTER,
            config.receive_dsn,
            "--receive-dsn",
            MAXMSGSIZE=config.max_message_size + 4096,
            SNDHWM=ACKS_UNREAD,  # a pipelining producer's acks fit in its pipe
            LINGER=2000,
        )  # let the last acks out on shutdown
        self.acks = Replies(self.receive, "producer")
        # LINGER 0: unsent deliveries are still stored, nothing to flush.
        self.send = binder.bind(zmq.DEALER, config.send_dsn, "--send-dsn", SNDHWM=max(config.max_inflight, 1000))
        self.sockets = [self.receive, self.send]
        self.binder = binder
        self._receive_gate, self._send_gate = binder.gate(self.receive), binder.gate(self.send)
        self.stalled = False  # nothing ready last time we looked: skip until something changes
        self._acks: list[tuple[bytes, bytes, str | None]] = []
        self._deliveries: list[Message] = []
        self.credit = NativeCredit(config.max_inflight, config.ack_timeout)
        self.taken_back_total = 0

    def unstall(self) -> None:
        """Messages may be ready again (requeued, expired, returned by a lease): look next turn."""
        self.stalled = False

    def _credit(self, now: float) -> int:
        return self.credit.available(now, self.broker.inflight.count(CONSUMER))

    def before_poll(self, poller: zmq.Poller) -> None:
        want_out = not self.stalled and self._credit(time.monotonic()) > 0 and self.broker.has_ready(self.config.queue)
        poller.modify(self.send, POLLIN | (POLLOUT if want_out else 0))

    def read(self, ready: dict, now: float, now_us: int) -> None:
        if self.receive in ready:
            self._read_producers(now_us)
            self.stalled = False
        if ready.get(self.send, 0) & POLLIN:
            self._read_consumer_answers(now)
            self.stalled = False

    def _read_producers(self, now_us: int) -> None:
        queue, limit, gate, acks = self.config.queue, self.config.max_message_size, self._receive_gate, self._acks
        budget = TURN_BYTES
        batch: list[tuple[bytes, bytes]] = []  # (routing, message id) of what is stored in one go
        bodies: list[list[bytes]] = []
        try:
            for _ in range(READ_BATCH):
                if budget <= 0:
                    return
                try:
                    frames = recv_frames(self.receive, NOBLOCK) if gate is None else self._receive_gated()
                except Again:
                    return
                if frames is None:
                    continue
                budget -= sum(map(len, frames))
                event = native.parse_produce(frames, limit)
                if event is None:
                    continue
                # Its acks cannot leave: store nothing more for it. Unacknowledged, it is the producer's to resend.
                if self.acks.refuses(event.routing, "its messages are discarded unstored"):
                    continue
                if isinstance(event, native.Rejected):
                    self._store(queue, batch, bodies, now_us)  # (acks keep the order of the messages)
                    warn_bad("producer", event.error.code, event.error.detail)
                    acks.append((event.routing, event.message_id, event.error.detail))
                    continue
                batch.append((event.routing, event.message_id))
                bodies.append(event.body)
        finally:
            self._store(queue, batch, bodies, now_us)

    def _receive_gated(self) -> list[bytes] | None:
        return receive(self.receive, self._receive_gate, "producer", NOBLOCK)

    def _store(self, queue: str, batch: list[tuple[bytes, bytes]], bodies: list[list[bytes]], now_us: int) -> None:
        """Store the messages read so far in one call and queue their acks; those past the store limit
        are answered "queue full"."""
        if not batch:
            return
        acks = self._acks
        try:
            stored = self.broker.produce_many(queue, bodies, now_us=now_us)
        except StoreError:  # the turn is rolled back: every one of them hears so
            acks.extend((routing, message_id, native.STORE_FAILED) for routing, message_id in batch)
            batch.clear()
            raise
        for i, (routing, message_id) in enumerate(batch):
            acks.append((routing, message_id, None if i < stored else native.QUEUE_FULL))
        batch.clear()
        bodies.clear()

    def _read_consumer_answers(self, now: float) -> None:
        ack_timeout_s = self.config.ack_timeout
        for _ in range(READ_BATCH):
            try:
                frames = receive(self.send, self._send_gate, "consumer", NOBLOCK)
            except Again:
                return
            if frames is None:
                continue
            answer = native.parse_consumer_ack(frames)
            if answer is None:
                warn_bad("consumer", "short", f"{len(frames)} frame(s), expected [key, ack]")
                continue
            ref = _ref_of_key(answer.key)
            if ref is None:
                warn_bad("consumer", "bad-key", f"unknown message key {answer.key[:80]!r}")
                continue
            delivery = self.broker.inflight.get(ref)
            self.credit.answered(
                ref,
                delivery.deadline - ack_timeout_s if delivery is not None and delivery.consumer == CONSUMER else None,
                now,
            )
            if answer.ok:
                if not self.broker.ack(ref, by=CONSUMER):
                    warn_bad(
                        "consumer",
                        "not-held",
                        f"ack for {answer.key[:80]!r}, which no delivery through "
                        "the send socket holds (unknown, settled or another's): ignored",
                    )
            elif not self.broker.nack(ref, by=CONSUMER):
                warn_bad(
                    "consumer",
                    "not-held",
                    f"nack for {answer.key[:80]!r}, not in flight through the send socket: ignored",
                )

    def work(self, now: float, now_us: int) -> None:
        held = self.broker.inflight.count(CONSUMER)
        overdue = self.credit.overdue(held, self._in_flight_here)
        if overdue:
            for ref in overdue:
                self.broker.take_back(ref, by=CONSUMER)
            self.taken_back_total += len(overdue)
            self.stalled = False
            log.warning(
                "native consumers hold %d unacknowledged deliveries together (the most is %d): the %d "
                "oldest went back to the queue early",
                held,
                self.credit.cap,
                len(overdue),
            )
        credit = self._credit(now)
        if credit <= 0 or not events(self.send) & POLLOUT:
            return
        taken = self.broker.take(self.config.queue, credit, CONSUMER, now=now, now_us=now_us)
        if not taken:
            self.stalled = True
        for message in taken:
            self.credit.sent((message.qid, message.seq), now)
        self._deliveries = taken

    def waiting(self) -> bool:
        return bool(self._acks)

    def wake_at(self, now: float) -> float | None:
        wakes = [t for t in (self.acks.wake_at(now), self.credit.wake_at()) if t is not None]
        return min(wakes) if wakes else None

    def revoked(self, users: set[str]) -> None:
        # The DEALER hands deliveries to every connected consumer in turn and cannot skip one: re-bind
        # it, so that every consumer connects again and a revoked key fails its handshake. What was in
        # flight stays in flight (the consumers that hold it may still ack it) until its ack timeout.
        if self._send_gate is not None:
            self.send = self.binder.rebind(self.send)
            self.sockets = [self.receive, self.send]
            log.warning("send socket re-bound: consumers reconnect, those of revoked CURVE keys cannot")

    def _in_flight_here(self, ref: Ref) -> bool:
        delivery = self.broker.inflight.get(ref)
        return delivery is not None and delivery.consumer == CONSUMER

    def recover(self) -> None:
        self.credit.reset()  # the broker forgot every delivery

    def stats(self) -> dict:
        return {
            "consumer_window_ms": round(self.credit.window_s * 1000, 1),
            "young_deliveries": self.credit.young,
            "taken_back_total": self.taken_back_total,
        }

    def rolled_back(self) -> None:
        self._acks = [(r, m, err or native.STORE_FAILED) for r, m, err in self._acks]
        self._deliveries = []

    def flush(self, now: float, now_us: int) -> None:
        self.acks.flush()
        acks, self._acks = self._acks, []
        for routing, message_id, error in acks:
            self.acks.send(native.produce_ack(routing, message_id, error))
        deliveries, self._deliveries = self._deliveries, []
        timeout_us = round(self.config.ack_timeout * 1e6)  # the wire counts µs (pzq-wire.md)
        for i, message in enumerate(deliveries):
            frames = native.delivery(
                native.message_key(message.enqueued_us, message.id), now_us, timeout_us, message.frames
            )
            try:
                send_frames(self.send, frames, NOBLOCK)
            except Again:
                # The last consumer left between the writability check and now: keep the rest stored.
                for rest in deliveries[i:]:
                    self.broker.undeliver((rest.qid, rest.seq))
                    self.credit.forget((rest.qid, rest.seq))
                return


def _ref_of_key(key: bytes) -> Ref | None:
    # The keys pzq made ("<16 digits>|<32 hex>") are read without a regex: every ack comes here.
    if len(key) == 49 and key[16] == 0x7C and key[17:].isalnum() and key[17:] == key[17:].lower():
        try:
            raw = bytes.fromhex(key[17:].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raw = b""
        if len(raw) == 16:
            return _REF.unpack(raw)
    mid = native.key_message_id(key)
    return None if mid is None else parse_message_id(mid)
