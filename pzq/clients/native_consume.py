"""A blocking batched native consumer (PZQ-BATCH/1, docs/native-batch.md "Batched consumers"), with a
fallback to the legacy send socket for a server without the batched endpoint.

    from pzq.clients.native import BatchConsumer

    with BatchConsumer("tcp://127.0.0.1:11134", fallback="tcp://127.0.0.1:11132") as consumer:
        while batch := consumer.receive(100, timeout_ms=5000):
            for key, frames in batch:
                handle(frames)
            consumer.ack([key for key, _ in batch])   # one message, answered after the server's commit

``receive(n)`` grants the server just enough credit that at most ``n`` messages are taken for it beyond
what it already has unread, so nothing is taken that the caller is not about to be shown. With
``prefetch=p`` it keeps ``p`` more granted ahead, so that the server goes on delivering while the caller
handles and acks a batch (the pipe never runs empty between rounds: half the server's CPU per message
end to end, issue 27); those messages are held (their ack timeout runs) before the caller sees them.
Every wait has a timeout: a silent server raises ClientError instead of hanging.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence

import zmq

from pzq.clients.sockets import Curve, connect, receive
from pzq.errors import ClientError, ProtocolError
from pzq.protocols import native as legacy
from pzq.protocols import native_consume as wire

Message = tuple[bytes, list[bytes]]  # (key, body frames)


class BatchConsumer:
    """A DEALER on the batched endpoint: credit, batches of deliveries, batched ack and nack.

    ``endpoint``: the server's ``--consume-dsn`` (None: use ``fallback`` at once). If no PZQ-BATCH HELLO
    answers within ``hello_timeout_ms`` and ``fallback`` (the ``--send-dsn``) is given, it consumes from
    the legacy send socket instead (``batched`` is then False): deliveries come as the server pushes
    them, and ``ack``/``nack`` are not answered (SETTLED counts them all). ``prefetch``: deliveries
    granted ahead of what ``receive`` asks for (a window of credit in flight; 0: none)."""

    def __init__(
        self,
        endpoint: str | None,
        *,
        fallback: str | None = None,
        hello_timeout_ms: int = 2000,
        ctx: zmq.Context | None = None,
        curve: Curve | None = None,
        prefetch: int = 0,
    ):
        if prefetch < 0:
            raise ValueError(f"prefetch must be 0 or more, not {prefetch}")
        self.prefetch = prefetch
        self.limits: wire.Limits | None = None
        self.batched = False
        self._buffer: collections.deque[tuple[bytes, list[bytes], int]] = collections.deque()  # (key, body, sent µs)
        self.sent_us: dict[bytes, int] = {}  # when the server sent each message the last receive returned
        self._credit = 0  # granted and not yet used by a delivery
        self._unsettled = 0  # delivered (buffered or returned) and not yet acked or nacked by us
        self._heard = time.monotonic()  # when the server was last told we are here
        self._peers: dict[bytes, bytes] = {}  # legacy: key -> the server's peer id (to answer on)
        if endpoint:
            self.sock = connect(zmq.DEALER, endpoint, ctx=ctx, curve=curve)
            self.limits = self._hello(hello_timeout_ms)
            if self.limits is not None:
                self.batched = True
                return
            self.sock.close(linger=0)
            if not fallback:
                raise ClientError(f"no PZQ-BATCH/1 answer from {endpoint} within {hello_timeout_ms} ms")
        if not fallback:
            raise ClientError("no endpoint to consume from")
        self.sock = connect(zmq.ROUTER, fallback, ctx=ctx, curve=curve)

    def close(self) -> None:
        """Say BYE (what this consumer holds goes back to the queue at once) and close, letting the last
        message leave (on the send socket: the last acks, which nothing answers)."""
        try:
            if self.batched:
                self.sock.send_multipart(wire.bye(), zmq.NOBLOCK)
            self.sock.setsockopt(zmq.LINGER, 2000)
        except zmq.ZMQError:
            pass
        self.sock.close()

    def __enter__(self) -> BatchConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def receive(self, most: int = 100, timeout_ms: int = 10_000) -> list[Message]:
        """Up to ``most`` messages as (key, body frames), oldest first; [] if none came in time. The
        credit granted is topped up to ``most`` (and ``prefetch`` more) less what is already delivered or
        granted."""
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

    def ack(self, keys: Sequence[bytes], timeout_ms: int = 10_000) -> wire.Settled:
        """Delete these messages; returns once the server committed it: how many, and the keys refused
        (not held by this consumer: unknown, settled already, or another's)."""
        return self._settle(wire.ack, keys, timeout_ms, ok=True)

    def nack(self, keys: Sequence[bytes], timeout_ms: int = 10_000) -> wire.Settled:
        """Put these messages back at the head of the queue (their delivery still counts)."""
        return self._settle(wire.nack, keys, timeout_ms, ok=False)

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
        count, refused = 0, list[bytes]()
        step = self.limits.max_keys  # (an ACK names at most that many)
        for start in range(0, len(keys), step):
            self.sock.send_multipart(make(keys[start : start + step]))
            while True:
                reply = self._next(deadline)
                if reply is None:
                    raise ClientError(f"no SETTLED from the server within {timeout_ms} ms")
                if isinstance(reply, wire.Settled):
                    count, refused = count + reply.count, refused + reply.refused
                    break
                self._unexpected(reply)
        return wire.Settled(count, refused)

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

    def _next(self, deadline: float) -> wire.Delivered | wire.Settled | wire.Limits | ProtocolError | int | None:
        """The next answer (a DELIVER's messages go to the buffer first); None at the deadline. Says
        "still here" (CREDIT 0) while waiting long, so that the server keeps this consumer's credit."""
        assert self.limits is not None
        keepalive = self.limits.idle_us / 3e6
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            if now - self._heard >= keepalive:
                self.sock.send_multipart(wire.credit(0))
                self._heard = now
            frames = receive(self.sock, max(1, round(min(deadline - now, keepalive) * 1000)))
            if frames is None:
                continue
            reply = wire.parse_reply(frames)
            if isinstance(reply, wire.Delivered):
                self._credit = max(0, self._credit - len(reply.keys))
                self._unsettled += len(reply.keys)
                self._buffer.extend((k, b, reply.sent_us) for k, b in zip(reply.keys, reply.bodies, strict=True))
            if reply is None:
                raise ClientError(
                    f"an answer that is not PZQ-BATCH/1 ({len(frames)} frame(s)): is pzq at this endpoint?"
                )
            return reply

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
            delivered = legacy.parse_delivery(frames[1:])
            if delivered is None:
                raise ClientError(f"malformed delivery of {len(frames)} frames: is a pzq server at this endpoint?")
            self._peers[delivered.key] = frames[0]
            self.sent_us[delivered.key] = delivered.sent_us
            out.append((delivered.key, delivered.body))
            if len(out) >= most:
                break
            frames = receive(self.sock, 0)
        return out
