"""PHPMQ connections on the shared store: sessions, credit windows, dialects, and the broker calls.

The server hands every connection's bytes to ``received`` and sends what ``dispatch`` returns (after
the turn's commit). A ProtocolError from ``received`` means the stream is garbage: the server closes
that connection (the protocol has no error message) and calls ``disconnected``.

Body mapping: a PHPMQ content blob is stored as a one-frame body; a multi-frame body from another
protocol reaches PHPMQ consumers as its frames concatenated in order.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable

from pzq.broker import Broker
from pzq.errors import ProtocolError, StoreFull
from pzq.logs import warn_bad
from pzq.protocols import phpmq
from pzq.store import parse_message_id

log = logging.getLogger("pzq.phpmq")


@dataclasses.dataclass
class Session:
    """One PHPMQ connection."""

    conn: Hashable
    decoder: phpmq.Decoder
    dialect: phpmq.Dialect
    queue: str | None = None  # what its consume request asked for
    count: int = 0

    @property
    def consumer(self) -> tuple:
        return ("phpmq", self.conn)


class PhpmqGateway:
    """Every PHPMQ session of the server, and what they ask of the broker."""

    def __init__(self, broker: Broker, *, max_content: int, dialect: str = "auto", max_credit: int = 1000):
        self.broker = broker
        self.max_content = max_content
        self.max_credit = max_credit  # a client's count is capped: it must not size the server's memory
        self.forced = None if dialect == "auto" else phpmq.Dialect(dialect)
        self.sessions: dict[Hashable, Session] = {}
        self.received_total = 0
        self.dispatched_total = 0
        self.closed_total = 0

    def connected(self, conn: Hashable) -> None:
        self.sessions[conn] = Session(conn, phpmq.Decoder(self.max_content), self.forced or phpmq.Dialect.LEGACY)

    def disconnected(self, conn: Hashable) -> int:
        """Forget the connection; everything it held goes back to its queue at once. Returns how many."""
        session = self.sessions.pop(conn, None)
        return 0 if session is None else self.broker.consumer_gone(session.consumer)

    def buffered(self, conn: Hashable) -> int:
        """Bytes of an unfinished message this connection holds."""
        session = self.sessions.get(conn)
        return 0 if session is None else session.decoder.buffered

    def unsent(self, conn: Hashable, ref) -> bool:
        """A dispatch the client's connection would not take: it stays stored for later."""
        self.broker.undeliver(ref)
        return False

    def received(self, conn: Hashable, data: bytes, *, now: float = 0.0, now_us: int) -> None:
        """Apply every whole message in ``data``; raises ProtocolError (close the connection) on garbage."""
        session = self.sessions.get(conn)
        if session is None:  # bytes still queued from a connection closed for garbage: drop them
            return
        for message in session.decoder.feed(data):
            self.received_total += 1
            if self.forced is None and phpmq.speaks_current(message):
                session.dialect = phpmq.Dialect.CURRENT
            self._apply(session, message, now_us)

    def _apply(self, session: Session, message: phpmq.Message, now_us: int) -> None:
        try:
            queue = message.packets[phpmq.QUEUE].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("bad-queue", "queue names must be UTF-8") from None
        if len(message.packets[phpmq.QUEUE]) > 255:
            raise ProtocolError("bad-queue", "queue names are at most 255 bytes")
        if message.type == phpmq.SEND:
            ttl = _ttl(message)
            try:
                self.broker.produce(
                    queue,
                    [message.packets[phpmq.CONTENT]],
                    now_us=now_us,
                    expires_us=now_us + ttl * 1_000_000 if ttl else 0,
                )
            except StoreFull:
                # PHPMQ has no reply to a send: closing is the only way to tell the client.
                raise ProtocolError("queue-full", f"queue full, message for {queue!r} refused") from None
        elif message.type == phpmq.CONSUME:
            session.queue, session.count = queue, min(message.number(phpmq.COUNT), self.max_credit)
        else:
            ref = self._ref(queue, message)
            if ref is None:
                done = False
            elif message.type == phpmq.ACK:
                done = self.broker.ack(ref, by=session.consumer)
            elif message.type == phpmq.REQUEUE:
                ttl = _ttl(message)
                done = self.broker.requeue_at_end(
                    ref, by=session.consumer, expires_us=now_us + ttl * 1_000_000 if ttl else 0
                )
            else:
                done = self.broker.dead_letter(
                    ref, "dead-lettered by a PHPMQ client", by=session.consumer, now_us=now_us
                )
            if not done:  # PHPMQ has no error reply: ignored, and logged
                warn_bad(
                    "phpmq",
                    "not-held",
                    f"{_NAMES[message.type]} of message "
                    f"{message.packets[phpmq.MESSAGE_ID][:40]!r} in queue {queue!r}, which this connection "
                    "does not hold (never dispatched to it, settled, or another's): ignored",
                )

    def _ref(self, queue: str, message: phpmq.Message):
        ref = parse_message_id(message.packets[phpmq.MESSAGE_ID])
        info = self.broker.store.queue(queue, create=False)
        if ref is None or info is None or ref[0] != info.qid:
            return None
        return ref

    def dispatch(self, *, now: float, now_us: int) -> list[tuple[Hashable, bytes, tuple]]:
        """Fill every consumer's credit window from its queue; returns (connection, bytes, message ref)
        to send (the ref lets the sender take a delivery back if the connection cannot take it)."""
        out = []
        for session in self.sessions.values():
            if session.queue is None:
                continue
            credit = session.count - self.broker.inflight.count(session.consumer)
            if credit <= 0 or not self.broker.has_ready(session.queue):
                continue
            for message in self.broker.take(session.queue, credit, session.consumer, now=now, now_us=now_us):
                # Whole seconds left, rounded up and at least 1: "0" would tell the client "never".
                ttl_left = max(1, -(-(message.expires_us - now_us) // 1_000_000)) if message.expires_us else 0
                out.append(
                    (
                        session.conn,
                        phpmq.encode_dispatch(
                            message.queue, b"".join(message.frames), message.id, ttl_left, session.dialect
                        ),
                        (message.qid, message.seq),
                    )
                )
        self.dispatched_total += len(out)
        return out

    def stats(self) -> dict:
        return {
            "connections": len(self.sessions),
            "consumers": sum(1 for s in self.sessions.values() if s.queue is not None),
            "received_total": self.received_total,
            "dispatched_total": self.dispatched_total,
            "closed_bad_input_total": self.closed_total,
        }


MAX_TTL_S = 10 * 365 * 86400


def _ttl(message: phpmq.Message) -> int:
    ttl = message.number(phpmq.TTL)
    if ttl > MAX_TTL_S:
        raise ProtocolError("bad-ttl", f"TTL {ttl} s is over ten years")
    return ttl


_NAMES = {phpmq.ACK: "ack", phpmq.REQUEUE: "re-queue", phpmq.DEAD_LETTER: "dead letter"}
