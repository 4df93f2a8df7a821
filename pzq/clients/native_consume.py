"""A blocking batched native consumer (PZQ-BATCH/1, docs/native-batch.md "Batched consumers"), with a
fallback to the legacy send socket for a server without the batched endpoint.

    from pzq.clients.native import BatchConsumer

    with BatchConsumer("tcp://127.0.0.1:11134", fallback="tcp://127.0.0.1:11132") as consumer:
        while batch := consumer.receive(100, timeout_s=5):
            for key, frames in batch:
                handle(frames)
            consumer.ack([key for key, _ in batch])   # one message, answered after the server's commit

``receive(n)`` grants the server just enough credit that at most ``n`` messages are taken for it beyond
what it already has unread, so nothing is taken that the caller is not about to be shown. With
``prefetch=p`` it keeps ``p`` more granted ahead, so that the server goes on delivering while the caller
handles and acks a batch (the pipe never runs empty between rounds: half the server's CPU per message
end to end, issue 27); those messages are held (their ack timeout runs) before the caller sees them.
``ack_async(keys)`` sends the ACK without waiting for its SETTLED (at most ``ack_window`` ACKs in flight:
more acks share one of the server's commits); ``settle()`` waits for them all and sums their answers.
Every wait has a timeout: a silent server raises ClientError instead of hanging. A dropped connection (the
server killed or restarted) is heard at once from the socket monitor (consume_link.py): the consumer
starts afresh on a new socket, HELLO and its credit again, and an ACK the old connection never answered
raises AnswerLost (``ack``, ``settle``) instead of waiting for its timeout.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

import zmq

from pzq.clients.consume_link import DROPPED, OPTIONS, Dropped, Link
from pzq.clients.sockets import Curve, connect, receive, timeout_seconds, wait_ms
from pzq.errors import AnswerLost, ClientError, NoMessage, NotListening, ProtocolError
from pzq.protocols import native as legacy
from pzq.protocols import native_consume as wire

Message = tuple[bytes, list[bytes]]  # (key, body frames)
Sink = list[wire.Settled] | None  # where an ACK's or NACK's answer goes: ack()'s list, or None (ack_async's sum)
LOST = wire.Settled(0, [])  # (by identity) the answer its dropped connection never gave: see _afresh


class BatchConsumer:
    """A DEALER on the batched endpoint: credit, batches of deliveries, batched ack and nack.

    ``endpoint``: the server's ``--consume-dsn`` (None: use ``fallback`` at once). If no PZQ-BATCH HELLO
    answers within ``hello_timeout_s`` (2 s; ``hello_timeout_ms``, deprecated: in ms) and ``fallback``
    (the ``--send-dsn``) is given, it consumes from the legacy send socket instead (``batched`` is then
    False): deliveries come as the server pushes them, and ``ack``/``nack`` are not answered (SETTLED
    counts them all). ``prefetch``: deliveries granted ahead of what ``receive`` asks for (a window of
    credit in flight; 0: none). ``ack_window``: ACK messages ``ack_async`` keeps in flight before it waits
    for the oldest one's SETTLED.

    Every wait is ``timeout_s``, in seconds (10 s); ``timeout_ms`` is its deprecated alias, and a number in
    its place (``receive(100, 5000)``) is still milliseconds, with a DeprecationWarning: never read again
    as seconds."""

    def __init__(
        self,
        endpoint: str | None,
        *,
        fallback: str | None = None,
        hello_timeout_s: float | None = None,
        ctx: zmq.Context | None = None,
        curve: Curve | None = None,
        prefetch: int = 0,
        ack_window: int = 4,
        hello_timeout_ms: int | None = None,
    ):
        hello_timeout_ms = wait_ms(timeout_seconds(hello_timeout_s, hello_timeout_ms, 2.0))
        if prefetch < 0:
            raise ValueError(f"prefetch must be 0 or more, not {prefetch}")
        if ack_window < 1:
            raise ValueError(f"ack_window must be 1 or more, not {ack_window}")
        self.prefetch = prefetch
        self.ack_window = ack_window
        # One entry per ACK or NACK sent and not yet answered, oldest first (the server answers each
        # consumer's in order): its sink and its keys (a store-failure, read as its connection dropped, refuses them)
        self._awaiting: collections.deque[tuple[Sink, Sequence[bytes]]] = collections.deque()
        self._async = wire.Settled(0, [])
        self._lost = 0  # ack_async's ACKs whose answer was lost with a dropped connection (settle raises)
        self.limits: wire.Limits | None = None
        self.batched = False
        self._buffer: collections.deque[tuple[bytes, list[bytes], int]] = collections.deque()  # (key, body, sent µs)
        self.sent_us: dict[bytes, int] = {}  # when the server sent each message the last receive returned
        self._credit = 0  # granted and not yet used by a delivery
        self._unsettled = 0  # delivered (buffered or returned) and not yet acked or nacked by us
        self._heard = time.monotonic()  # when the server was last told we are here
        self._peers: dict[bytes, bytes] = {}  # legacy: key -> the server's peer id (to answer on)
        self._link: Link | None = None  # (batched: the socket and its monitor, to hear a dropped connection)
        self._again = (endpoint, ctx, curve)  # (what a new connection is made of)
        self.reconnects = 0  # connections started afresh after one dropped
        if endpoint and self._batched(endpoint, hello_timeout_ms, ctx=ctx, curve=curve, fallback=bool(fallback)):
            return
        if not fallback:
            raise ClientError("no endpoint to consume from")
        self.sock = connect(zmq.ROUTER, fallback, ctx=ctx, curve=curve, options=OPTIONS)  # (libzmq reconnects it)

    def _batched(self, endpoint: str, hello_ms: int, *, ctx, curve, fallback: bool) -> bool:
        """Say HELLO at ``endpoint``: True if it speaks PZQ-BATCH/1; False to fall back (a ``fallback``
        exists, and the endpoint did not answer, or nothing listens there: a `pzq` command knows it at
        once, as a refused connect is final for this probe)."""
        try:
            # (eager with a fallback: a refused batched endpoint is left at once for the send socket)
            self.sock = connect(zmq.DEALER, endpoint, ctx=ctx, curve=curve, eager=fallback, options=OPTIONS)
            self.limits = self._hello(hello_ms)
        except NotListening:  # (only a `pzq` command hears it: reach.impatient)
            self._close_probe()
            if not fallback:
                raise
            return False
        except ClientError:  # (the key refused, the HELLO refused: nobody will close it but us)
            self._close_probe()
            raise
        if self.limits is not None:
            self.batched = True
            self._link = Link(self.sock)
            return True
        self._close_probe()
        if not fallback:
            raise ClientError(f"no PZQ-BATCH/1 answer from {endpoint} within {hello_ms} ms")
        return False

    def _close_probe(self) -> None:
        if getattr(self, "sock", None) is not None:
            self.sock.close(linger=0)

    def sockets(self) -> tuple[zmq.Socket, ...]:
        """What to poll to learn that ``receive`` has something to read: the socket (and its monitor)."""
        return self._link.sockets() if self._link is not None else (self.sock,)

    def close(self) -> None:
        """Say BYE (what this consumer holds goes back to the queue at once) and close, letting the last
        message leave (on the send socket: the last acks, which nothing answers)."""
        try:
            if self.batched:
                self.sock.send_multipart(wire.bye(), zmq.NOBLOCK)
            self.sock.setsockopt(zmq.LINGER, 2000)
        except zmq.ZMQError:
            pass
        if self._link is not None:
            self._link.close()
        self.sock.close()

    def __enter__(self) -> BatchConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def receive(
        self, most: int = 100, timeout_ms: int | None = None, *, timeout_s: float | None = None
    ) -> list[Message]:
        """Up to ``most`` messages as (key, body frames), oldest first; [] if none came in time. The
        credit granted is topped up to ``most`` (and ``prefetch`` more) less what is already delivered or
        granted."""
        timeout_ms = wait_ms(timeout_seconds(timeout_s, timeout_ms, 10.0))  # (ms below: zmq's poll)
        if not self.batched:
            return self._receive_legacy(most, timeout_ms)
        assert self.limits is not None
        # (what it holds and its credit stay under the server's max_credit, or the CREDIT is refused)
        ahead = most + self.prefetch - len(self._buffer) - self._credit
        want = min(ahead, self.limits.max_credit - self._credit - self._unsettled)
        if want > 0:
            self.sock.send_multipart(wire.credit(want))
            self._credit += want
            self._heard = time.monotonic()
        deadline = time.monotonic() + timeout_ms / 1000
        while not self._buffer:
            reply = self._next(deadline)
            if reply is None:
                return []
            self._unexpected(reply)
        batch = [self._buffer.popleft() for _ in range(min(most, len(self._buffer)))]
        self.sent_us = {key: sent for key, _, sent in batch}
        return [(key, body) for key, body, _ in batch]

    def ack(
        self, keys: Sequence[bytes], timeout_ms: int | None = None, *, timeout_s: float | None = None
    ) -> wire.Settled:
        """Delete these messages; returns once the server committed it: how many, and the keys refused
        (not held by this consumer: unknown, settled already, or another's). AnswerLost (at once) if the
        connection dropped before the answer came: the keys may or may not be settled."""
        timeout_ms = wait_ms(timeout_seconds(timeout_s, timeout_ms, 10.0))  # (ms below: zmq's poll)
        return self._settle(wire.ack, keys, timeout_ms, ok=True)

    def nack(
        self, keys: Sequence[bytes], timeout_ms: int | None = None, *, timeout_s: float | None = None
    ) -> wire.Settled:
        """Put these messages back at the head of the queue (their delivery still counts)."""
        timeout_ms = wait_ms(timeout_seconds(timeout_s, timeout_ms, 10.0))  # (ms below: zmq's poll)
        return self._settle(wire.nack, keys, timeout_ms, ok=False)

    def ack_async(
        self, keys: Sequence[bytes], timeout_ms: int | None = None, *, timeout_s: float | None = None
    ) -> None:
        """Delete these messages without waiting for the server's commit: ``settle()`` tells how many
        were and which were refused. Waits (up to ``timeout_s``) only while ``ack_window`` ACKs are
        unanswered. Until its SETTLED comes, an ack may be lost with the server (the message then comes
        back: at-least-once)."""
        timeout_ms = wait_ms(timeout_seconds(timeout_s, timeout_ms, 10.0))  # (ms below: zmq's poll)
        if not keys:
            return
        if not self.batched:
            self._async = wire.Settled(self._async.count + self._settle(wire.ack, keys, timeout_ms, ok=True).count, [])
            return
        assert self.limits is not None
        deadline = time.monotonic() + timeout_ms / 1000
        self._unsettled = max(0, self._unsettled - len(keys))
        step = self.limits.max_keys  # (an ACK names at most that many)
        for start in range(0, len(keys), step):
            while len(self._awaiting) >= self.ack_window:
                self._answer(deadline, timeout_ms)
            chunk = keys[start : start + step]
            self.sock.send_multipart(wire.ack(chunk))
            self._awaiting.append((None, chunk))

    def settle(self, timeout_ms: int | None = None, *, timeout_s: float | None = None) -> wire.Settled:
        """Wait for the SETTLED of every ``ack_async`` sent; return their sum since the last ``settle``
        (the count acked, the keys refused in the order sent)."""
        timeout_ms = wait_ms(timeout_seconds(timeout_s, timeout_ms, 10.0))  # (ms below: zmq's poll)
        deadline = time.monotonic() + timeout_ms / 1000
        while any(sink is None for sink, _ in self._awaiting):
            self._answer(deadline, timeout_ms)
        done, self._async = self._async, wire.Settled(0, [])
        lost, self._lost = self._lost, 0
        if lost:
            raise AnswerLost(
                f"the connection to the server dropped before it answered {lost} ACK(s): their keys may or may "
                f"not be settled (one not settled comes again); the others settled {done.count}, refused "
                f"{len(done.refused)}"
            )
        return done

    def _answer(self, deadline: float, timeout_ms: int) -> None:
        """Read until one more answer came (a SETTLED or ERR is matched by ``_next``)."""
        waiting = len(self._awaiting)
        while len(self._awaiting) >= waiting:
            reply = self._next(deadline)
            if reply is None:
                raise NoMessage(f"no SETTLED from the server within {timeout_ms} ms")
            self._unexpected(reply)

    def _settle(self, make, keys: Sequence[bytes], timeout_ms: int, *, ok: bool) -> wire.Settled:
        if not keys:
            return wire.Settled(0, [])
        if not self.batched:
            for key in keys:
                self.sock.send_multipart([self._peers.pop(key, b""), *legacy.consumer_ack(key, ok)])
            return wire.Settled(len(keys), [])
        assert self.limits is not None
        self._unsettled = max(0, self._unsettled - len(keys))
        deadline = time.monotonic() + timeout_ms / 1000
        answers: list[wire.Settled] = []
        step = self.limits.max_keys  # (an ACK names at most that many)
        chunks = range(0, len(keys), step)
        for start in chunks:
            chunk = keys[start : start + step]
            self.sock.send_multipart(make(chunk))
            self._awaiting.append((answers, chunk))
        while len(answers) < len(chunks):  # (after any ack_async sent before: answered in order)
            self._answer(deadline, timeout_ms)
        if any(answer is LOST for answer in answers):
            raise AnswerLost(
                "the connection to the server dropped before it answered: these keys may or may not be settled "
                "(one not settled comes again; this consumer holds none of them now)"
            )
        return wire.Settled(sum(a.count for a in answers), [key for a in answers for key in a.refused])

    def _hello(self, timeout_ms: int) -> wire.Limits | None:
        self.sock.send_multipart(wire.hello())
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            frames = receive(self.sock, max(0, round((deadline - time.monotonic()) * 1000)))
            if frames is None:
                return None
            reply = wire.parse_reply(frames)
            if isinstance(reply, wire.Limits):
                return reply
            if isinstance(reply, ProtocolError):
                raise ClientError(f"the server refused HELLO: {reply.code}: {reply.detail}")

    def _next(
        self, deadline: float
    ) -> wire.Delivered | wire.Settled | wire.Limits | ProtocolError | int | Dropped | None:
        """The next answer (a DELIVER's messages go to the buffer first); None at the deadline; DROPPED
        once a dropped connection was replaced (``_afresh``: every ACK and NACK unanswered is answered).
        Says "still here" (CREDIT 0) while waiting long, so that the server keeps this consumer's credit."""
        assert self.limits is not None and self._link is not None
        keepalive = self.limits.idle_us / 3e6
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            if now - self._heard >= keepalive:
                self.sock.send_multipart(wire.credit(0))
                self._heard = now
            frames = self._link.read(max(1, round(min(deadline - now, keepalive) * 1000)))
            if frames is None:
                if self._link.dropped:
                    self._afresh()
                    return DROPPED
                continue
            reply = wire.parse_reply(frames)
            if isinstance(reply, wire.Delivered):
                self._credit = max(0, self._credit - len(reply.keys))
                self._unsettled += len(reply.keys)
                self._buffer.extend((k, b, reply.sent_us) for k, b in zip(reply.keys, reply.bodies, strict=True))
            elif isinstance(reply, wire.Settled) and self._awaiting:
                self._answered(self._awaiting.popleft()[0], reply)
            elif isinstance(reply, ProtocolError) and reply.code == "store-failure" and self._awaiting:
                self._awaiting.popleft()  # (only an ACK or NACK is answered so: the turn that took it rolled back)
            elif isinstance(reply, wire.Limits):
                self.limits = reply  # (a HELLO said again: the server's limits, maybe changed by its restart)
            if reply is None:
                raise ClientError(
                    f"an answer that is not PZQ-BATCH/1 ({len(frames)} frame(s)): is pzq at this endpoint?"
                )
            return reply

    def _answered(self, sink: Sink, reply: wire.Settled) -> None:
        if sink is None and reply is LOST:
            self._lost += 1
        elif sink is None:
            self._async = wire.Settled(self._async.count + reply.count, self._async.refused + reply.refused)
        else:
            sink.append(reply)

    def _afresh(self) -> None:
        """The connection dropped: to the server this consumer is gone (what it held went back to the
        queue, its credit is forgotten), and a reconnection would be a stranger to it. So: read what the
        old socket still has (the answers its connection sent), answer every ACK and NACK left unanswered
        as lost (``AnswerLost``: it may have been committed before the server went, or not), drop the
        deliveries not yet returned (they are back in the queue), and start on a new socket with HELLO and
        the credit again, sent at once (they leave when the server is back: nothing waits for them here)."""
        assert self.limits is not None and self._link is not None
        old = self.sock
        answers: list[wire.Settled | None] = []  # (None: ERR store-failure, nothing settled)
        while True:
            try:
                reply = wire.parse_reply(old.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            if isinstance(reply, wire.Settled):
                answers.append(reply)
            elif isinstance(reply, ProtocolError) and reply.code == "store-failure":
                answers.append(None)
        # The old connection's answers come first, in order; after them may come the new connection's to ACKs
        # that waited in the old socket's pipe and reached the server as a stranger's (SETTLED 0, all refused:
        # they answer no entry of ours, and cannot be told from a 0 of the old one). So the answers up to the
        # last that settled some are the old connection's; a tail of 0s is not known to be.
        known = max((i + 1 for i, a in enumerate(answers) if a is None or a.count), default=0)
        for answer in answers[:known]:
            if not self._awaiting:
                break
            sink, keys = self._awaiting.popleft()
            self._answered(sink, answer if answer is not None else wire.Settled(0, list(keys)))
        while self._awaiting:
            self._answered(self._awaiting.popleft()[0], LOST)
        grant = min(self._credit + len(self._buffer), self.limits.max_credit)
        self._buffer.clear()
        self._unsettled = 0
        self._link.close()
        old.close(linger=0)
        endpoint, ctx, curve = self._again
        assert endpoint is not None
        self.sock = connect(zmq.DEALER, endpoint, ctx=ctx, curve=curve, options=OPTIONS)
        self._link = Link(self.sock)
        self.sock.send_multipart(wire.hello())
        self._credit = grant
        if grant:
            self.sock.send_multipart(wire.credit(grant))
        self._heard = time.monotonic()
        self.reconnects += 1

    def _unexpected(self, reply) -> None:
        """An answer nothing waits for: an ERR is raised, except "hello-first" (this consumer was
        forgotten while silent): then it says HELLO again and grants its credit again."""
        if isinstance(reply, ProtocolError):
            if reply.code != "hello-first":
                raise ClientError(f"the server answered ERR {reply.code}: {reply.detail}")
            self.sock.send_multipart(wire.hello())
            if self._credit:
                self.sock.send_multipart(wire.credit(self._credit))

    def _receive_legacy(self, most: int, timeout_ms: int) -> list[Message]:
        out: list[Message] = []
        self.sent_us = {}
        frames = receive(self.sock, timeout_ms)
        while frames is not None:
            routed = legacy.parse_routed_delivery(frames)
            if routed is None:
                raise ClientError(f"malformed delivery of {len(frames)} frames: is a pzq server at this endpoint?")
            peer, delivered = routed
            self._peers[delivered.key] = peer
            self.sent_us[delivered.key] = delivered.sent_us
            out.append((delivered.key, delivered.body))
            frames = receive(self.sock, 0) if len(out) < most else None  # (none read past ``most``)
        return out
