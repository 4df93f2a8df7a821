"""PHPMQ connections on the shared store: sessions, credit windows, dialects, and the broker calls.

A ``StreamGateway`` (gateways/contract.py): the endpoint hands every connection's bytes to
``received`` and sends what it and ``dispatch`` return after the turn's commit. Input that is not
PHPMQ (or a send the store refuses) closes the connection: the protocol has no error message. So does
a request its peer's network may not make (``permissions``: sending needs produce on the queue,
consuming and settling consume); nothing of it is applied.

Body mapping: a PHPMQ content blob is stored as a one-frame body; a multi-frame body from another
protocol reaches PHPMQ consumers as its frames concatenated in order.

A content past ``Limits.body_chunk_bytes`` is written a part per turn (gateways/parted.py, driven by the
endpoint); the connection's sends after it wait behind it, in order (its other requests need no wait:
PHPMQ answers nothing, and an ack or a consume does not depend on a send). Deliveries go out in slices
that fit the turn (``dispatch``'s ``most`` and ``most_bytes``), the connections served in turn.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging

from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import ONLY, BrokerSurface, Send
from pzq.gateways.parted import Big, Parted
from pzq.gateways.peer_rights import PeerRights
from pzq.logs import warn_bad
from pzq.permissions import CONSUME, PRODUCE, Permissions
from pzq.protocols import phpmq
from pzq.store import Upload

log = logging.getLogger("pzq.phpmq")


@dataclasses.dataclass
class Session:
    """One PHPMQ connection."""

    conn: bytes
    decoder: phpmq.Decoder
    dialect: phpmq.Dialect
    queue: str | None = None  # what its consume request asked for
    count: int = 0
    # Every queue it was handed messages of since it last held nothing: it may still hold messages of
    # one it moved away from, which a SIGHUP that takes that queue away must take back too.
    consumed: set[str] = dataclasses.field(default_factory=set)

    @property
    def consumer(self) -> tuple:
        return ("phpmq", self.conn)


class PhpmqGateway:
    """Every PHPMQ session of the server, and what they ask of the broker."""

    def __init__(
        self,
        broker: BrokerSurface,
        *,
        max_content: int,
        dialect: str = "auto",
        max_credit: int = 1000,
        permissions: Permissions | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ):
        """``permissions``: who may send to and consume which queue, per source network (None: anyone);
        ``limits`` gives the big messages' chunks and shares (gateways/parted.py)."""
        self.broker = broker
        self.rights = PeerRights(permissions, "phpmq")
        self.max_content = max_content
        self.max_credit = max_credit  # a client's count is capped: it must not size the server's memory
        self.forced = None if dialect == "auto" else phpmq.Dialect(dialect)
        self.sessions: dict[bytes, Session] = {}
        self.received_total = 0
        self.dispatched_total = 0
        self.consumed: collections.Counter[str] = collections.Counter()  # queue -> sessions consuming it
        # Consuming connections, the one served least recently first: a turn's slices of deliveries
        # (``dispatch``'s most, most_bytes) go round them, so none is left out turn after turn
        self._order: dict[bytes, None] = {}
        self.parts = Parted(broker, limits)  # big sends, written a part per turn (the endpoint drives it)
        self.dispatched = 0  # deliveries the last dispatch call handed out, and their bodies' bytes
        self.dispatched_bytes = 0
        broker.queues.add_user(self)

    def uses_queue(self, queue: str) -> bool:
        """A queue a session consumes is in use (the broker's implicit queues)."""
        return self.consumed[queue] > 0

    def queue_expired(self, queue: str) -> None:
        pass  # (nothing is kept for a queue nobody consumes)

    def connected(self, conn: bytes, address: str = "") -> None:
        self.sessions[conn] = Session(conn, phpmq.Decoder(self.max_content), self.forced or phpmq.Dialect.LEGACY)
        self.rights.connected(conn, address)

    def disconnected(self, conn: bytes) -> None:
        """Forget the connection; everything it held goes back to its queue at once."""
        session = self.sessions.pop(conn, None)
        self.rights.gone(conn)
        if session is not None:  # (a big send of its still goes to the store: it was sent whole)
            self.broker.gone(session.consumer)
            self._consume(session, None)

    def narrowed(self) -> list[bytes]:
        """The connections consuming a queue their network may no longer consume, or holding messages
        of one they consumed before (after a SIGHUP)."""
        if not self.rights.enabled:
            return []

        def lost(s: Session) -> bool:
            if s.queue is not None and not self.rights.allows(s.conn, CONSUME, s.queue):
                return True
            return bool(self.broker.deliveries.count(s.consumer)) and not all(
                self.rights.allows(s.conn, CONSUME, queue) for queue in s.consumed
            )

        return [s.conn for s in self.sessions.values() if lost(s)]

    def _consume(self, session: Session, queue: str | None) -> None:
        if session.queue is not None:
            self.consumed[session.queue] -= 1
            if self.consumed[session.queue] <= 0:
                del self.consumed[session.queue]
        if queue is not None:
            self.consumed[queue] += 1
            self._order.setdefault(session.conn)
        else:
            self._order.pop(session.conn, None)
        session.queue = queue

    def buffered(self, conn: bytes) -> int:
        """Bytes of an unfinished message this connection holds, and of its sends waiting behind a big one."""
        session = self.sessions.get(conn)
        return 0 if session is None else session.decoder.buffered + self.parts.behind_of(conn)

    def holding(self, conn: bytes) -> bool:
        return self.broker.deliveries.count(("phpmq", conn)) > 0

    def unsent(self, send: Send) -> bool:
        """A dispatch the client's connection would not take: it stays stored for later."""
        self.broker.take_back_many((send.token,))  # type: ignore[arg-type]  # (dispatch's tokens are refs)
        return False

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        return []  # only dispatches, of deliveries the rollback took back

    def recover(self) -> None:
        pass  # credit windows stay; the broker forgot what was delivered

    def next_wake(self, now: float) -> float | None:
        return None

    def received(self, conn: bytes, data: bytes, *, now: Now) -> list[Send]:
        """Apply every whole message in ``data``; garbage closes the connection."""
        session = self.sessions.get(conn)
        if session is None:  # bytes still queued from a connection closed for garbage: drop them
            return []
        try:
            for message in session.decoder.feed(data):
                self.received_total += 1
                if self.forced is None and phpmq.speaks_current(message):
                    session.dialect = phpmq.Dialect.CURRENT
                closing = self._apply(session, message, now.wall_us)
                if closing:  # (its send was refused: what followed it is not applied)
                    return closing
            if session.decoder.broken is not None:  # garbage after the whole messages just applied
                raise session.decoder.broken
        except ProtocolError as exc:
            warn_bad("phpmq", exc.code, f"{exc.detail}; closing the connection")
            return [Send(ONLY, [conn], close=True)]
        return []

    def _apply(self, session: Session, message: phpmq.Message, now_us: int) -> list[Send]:
        try:
            queue = message.packets[phpmq.QUEUE].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("bad-queue", "queue names must be UTF-8") from None
        if len(message.packets[phpmq.QUEUE]) > 255:
            raise ProtocolError("bad-queue", "queue names are at most 255 bytes")
        right = PRODUCE if message.type == phpmq.SEND else CONSUME
        if not self.rights.may(session.conn, right, queue, _WHAT[message.type]):
            # (peer_may logged the refusal; PHPMQ has no error message: closing is the only signal)
            raise ProtocolError("not-permitted", f"no {right} right on queue {queue!r}")
        if message.type == phpmq.SEND:
            ttl = _ttl(message)
            content, conn = message.packets[phpmq.CONTENT], session.conn
            expires_us = now_us + ttl * 1_000_000 if ttl else 0
            # (behind a big send of this connection still being written, it waits its turn: in order)
            return self.parts.after(
                conn, lambda now: self._send(conn, queue, content, expires_us, now), len(content), now_us
            )
        if message.type == phpmq.CONSUME:
            self._consume(session, queue)
            session.count = min(message.number(phpmq.COUNT), self.max_credit)
        else:
            ref = self._ref(queue, message)
            if ref is None:
                done = False
            elif message.type == phpmq.ACK:
                done = self.broker.ack(ref, by=session.consumer)
            elif message.type == phpmq.REQUEUE:
                ttl = _ttl(message)
                done = self.broker.requeue(
                    ref, by=session.consumer, at_end=True, expires_us=now_us + ttl * 1_000_000 if ttl else 0
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
        return []

    def _send(self, conn: bytes, queue: str, content: bytes | bytearray, expires_us: int, now_us: int) -> list[Send]:
        """Store a send's content (a big one a part per turn, through ``parts``); a close when the store
        refuses it. Its connection may have closed since: the client sent it whole, so it is stored."""
        session = self.sessions.get(conn)
        try:
            if self.broker.queues.info(queue) is None:  # made on this connection's share of --max-queues
                self.broker.queues.create(queue, owner=session.consumer if session is not None else None)
            if self.parts.big(len(content)):
                size = len(content)

                def finish(upload: Upload, now: int) -> list[Send]:
                    self.broker.produce(queue, upload, now_us=now, expires_us=expires_us)
                    return []

                refused = functools.partial(self._refused, conn, queue, size)
                self.parts.write(conn, [content], Big(finish, refused, list))  # (a failed turn: lost, as a small one)
                return []
            self.broker.produce(queue, [bytes(content)], now_us=now_us, expires_us=expires_us)
        except StoreFull as exc:
            return self._refused(conn, queue, len(content), str(exc))
        return []

    def _refused(self, conn: bytes, queue: str, size: int, reason: str) -> list[Send]:
        """PHPMQ has no reply to a send: closing the connection is the only way to tell the client."""
        warn_bad(
            "phpmq", "queue-full", f"{reason}: a message of {size} bytes for {queue!r} refused; closing the connection"
        )
        return [Send(ONLY, [conn], close=True)] if conn in self.sessions else []

    def _ref(self, queue: str, message: phpmq.Message):
        return self.broker.queues.ref_in(queue, bytes(message.packets[phpmq.MESSAGE_ID]))

    def dispatch(
        self,
        *,
        now: Now,
        blocked: frozenset = frozenset(),
        most: int | None = None,
        most_bytes: int | None = None,
    ) -> list[Send]:
        """Fill consumers' credit windows from their queues, ``most`` deliveries and about ``most_bytes``
        of bodies at most (one message past it; None: no bound), the connections served least recently
        first (``dispatched`` and ``dispatched_bytes`` say what this call handed out). Each send's token
        is the message's ref, to take it back if the connection cannot take it. What a connection was
        handed is charged to it (pzq/broker/accounts.py) until acked or its connection closes."""
        out = []
        left = (1 << 62) if most is None else most
        room = (1 << 62) if most_bytes is None else most_bytes
        visited: list[bytes] = []
        for conn in self._order:
            if left <= 0 or room <= 0:
                break
            visited.append(conn)
            session = self.sessions[conn]
            if session.queue is None or conn in blocked:
                continue
            held = self.broker.deliveries.count(session.consumer)
            credit = min(session.count - held, left)
            if credit <= 0 or self.broker.ready_count(session.queue) <= 0:
                continue
            taken = self.broker.take(session.queue, credit, session.consumer, now=now, max_bytes=room)
            if taken:  # (a queue it got messages of; named at a CONSUME, a million names would be kept)
                if not held:
                    session.consumed.clear()
                session.consumed.add(session.queue)
            left -= len(taken)
            for message in taken:
                # Whole seconds left, rounded up and at least 1: "0" would tell the client "never".
                ttl_left = max(1, -(-(message.expires_us - now.wall_us) // 1_000_000)) if message.expires_us else 0
                body = message.frames[0] if len(message.frames) == 1 else b"".join(message.frames)
                room -= len(body)
                data = phpmq.encode_dispatch(message.queue, body, message.id, ttl_left, session.dialect)
                out.append(Send(ONLY, [conn, data], (message.qid, message.seq)))
        for conn in visited:  # (to the end of the round: the others go first next time)
            del self._order[conn]
            self._order[conn] = None
        self.dispatched = len(out)
        self.dispatched_bytes = (most_bytes - room) if most_bytes is not None else 0
        self.dispatched_total += len(out)
        return out

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        held = self.broker.deliveries.count
        rows = [
            [s.conn.hex(), s.dialect.name.lower(), s.queue or "-", held(s.consumer), s.decoder.buffered]
            for s in itertools.islice(self.sessions.values(), offset, offset + limit)
        ]
        columns = ["connection", "dialect", "consuming", "in flight", "unfinished input bytes"]
        total = len(self.sessions)
        return [{"kind": "phpmq", "title": "Connections", "columns": columns, "rows": rows, "total": total}]

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        if not self.consumed[queue]:  # (no walk of every session for a queue nobody here consumes)
            return [], 0
        mine = [s for s in self.sessions.values() if s.queue == queue]
        return [
            {
                "protocol": "phpmq",
                "client": s.conn.hex(),
                "held": self.broker.deliveries.count(s.consumer),
                "conn": s.conn,
            }
            for s in mine[:limit]
        ], len(mine)

    def stats(self) -> dict:
        return {
            "connections": len(self.sessions),
            "consumers": sum(1 for s in self.sessions.values() if s.queue is not None),
            "received_total": self.received_total,
            "dispatched_total": self.dispatched_total,
            **self.parts.stats(),
        }


MAX_TTL_S = 10 * 365 * 86400


def _ttl(message: phpmq.Message) -> int:
    ttl = message.number(phpmq.TTL)
    if ttl > MAX_TTL_S:
        raise ProtocolError("bad-ttl", f"TTL {ttl} s is over ten years")
    return ttl


_NAMES = {phpmq.ACK: "ack", phpmq.REQUEUE: "re-queue", phpmq.DEAD_LETTER: "dead letter"}
_WHAT = {phpmq.SEND: "send", phpmq.CONSUME: "consume", **_NAMES}
