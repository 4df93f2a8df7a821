"""The batched consume gateway's pair (tests/pairs.py): PZQ-BATCH/1 consumers of the native queue, whose
producers send to the native gateway's receive socket, as on a server. ``BatchedNative`` drives the two
gateways as their endpoints do (pzq/endpoints/native_consume.py: commands in, ``Out`` after the commit,
a consumer whose answers wait unread is ``blocked``, a connection the socket monitor saw close is
``disconnected``); ``BatchClient`` speaks the client codec (pzq/protocols/native_consume.py)."""

from __future__ import annotations

import collections
from collections.abc import Hashable

from pzq.clock import Now
from pzq.gateways import native as native_gateway
from pzq.gateways.contract import Send
from pzq.gateways.native_consume import BatchConsumeGateway, Out
from pzq.protocols import native as native_codec
from pzq.protocols import native_consume as wire

from pair_loop import ACK_TIMEOUT_S, Answered, Client, Delivered, Loop

CONSUME = "consume"  # the batched consumers' ROUTER (--consume-dsn)
RECEIVE = native_gateway.RECEIVE


class BatchedNative:
    """The native gateway (its producers only: no consumer on its send socket) beside the batched
    consume gateway, driven as the native and batched endpoints drive them in one turn."""

    def __init__(self, native: native_gateway.NativeGateway, loop: Loop):
        self.native = native
        self.batch = BatchConsumeGateway(loop.broker, queue="q", ack_timeout_s=ACK_TIMEOUT_S, limits=loop.limits)
        self.chunk = loop.limits.turn_chunk
        self._fds: dict[bytes, int] = {}  # each consumer's connection, as the socket monitor would name it

    def received(self, socket: str, frames: list[bytes], *, now: Now, user: str | None) -> list[Send]:
        if socket != CONSUME:
            return self.native.received(socket, frames, now=now, user=user)
        peer = frames[0]
        outs = self.batch.received(peer, frames[1:], now=now.mono, user=user) if len(frames) > 1 else []
        self.batch.connection(peer, self._fds.setdefault(peer, len(self._fds) + 3), user)
        return [Send(CONSUME, out.frames, out) for out in outs]

    def dispatch(self, *, now: Now, blocked: frozenset[Hashable]) -> list[Send]:
        out = self.native.dispatch(now=now, blocked=blocked | {native_gateway.SEND})
        due = self.batch.next_sweep()
        if due is not None and now.mono >= due:
            self.batch.sweep(now.mono)
        while self.batch.would_send():
            outs = self.batch.dispatch(now=now, most=self.chunk, blocked=blocked.__contains__)
            out += [Send(CONSUME, o.frames, o) for o in outs]
            if self.batch.dispatched < self.chunk:
                break
        return out

    def unsent(self, send: Send) -> bool:
        # (the endpoint's Replies keep what a full pipe did not take, in order, and the consumer is
        # blocked meanwhile; the gateway's unsent is for a consumer that is gone, see disconnected)
        return True if send.socket == CONSUME else self.native.unsent(send)

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        kept = self.native.rolled_back([s for s in sends if s.socket != CONSUME])
        outs = [s.token for s in sends if s.socket == CONSUME and isinstance(s.token, Out)]
        return kept + [Send(CONSUME, out.frames, out) for out in self.batch.rolled_back(outs)]

    def recover(self) -> None:
        self.native.recover()  # (the batched consumers keep their credit: their DELIVERs' comes back)

    def disconnected(self, conn: bytes) -> None:
        fd = self._fds.pop(conn, None)
        if fd is not None:
            self.batch.disconnected(fd)

    def next_wake(self, now: float) -> float | None:
        wakes = [t for t in (self.native.next_wake(now), self.batch.next_sweep()) if t is not None]
        return min(wakes) if wakes else None


class BatchClient(Client):
    """A batched consumer (HELLO, CREDIT, ACK of keys; its deliveries in DELIVERs) that produces as a
    native producer (each message answered "1" or "0"). Each consumer is its own holder; one whose
    answers wait unread is handed nothing (its endpoint keeps them, in order: ``unsent`` "kept"). Its
    disconnect is its connection closing (tcp://: the socket monitor tells); garbage is answered ERR."""

    unsent = "kept"

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.hello = False
        self._acks: collections.deque[str] = collections.deque()  # tags of ACKs not answered yet, in order
        self.errors: list[str] = []  # codes of ERRs that answered no ACK

    def _command(self, frames: list[bytes]) -> None:
        self.loop.feed_frames(CONSUME, [self.peer, *frames])

    def produce(self, queue: str, body: bytes) -> str:
        message_id = self.tag()
        self.loop.feed_frames(RECEIVE, [self.peer, *native_codec.produce(message_id.encode(), [body])])
        return message_id

    def consume(self, queue: str, n: int) -> None:
        if not self.hello:
            self.hello = True
            self._command(wire.hello())
        self._command(wire.credit(n))

    def ack(self, delivery: Delivered) -> str:
        tag = self.tag()
        self._acks.append(tag)
        self._command(wire.ack([delivery.handle[0]]))
        return tag

    def garbage(self) -> None:
        self._command([b"NOT-A-COMMAND", b"x"])

    def disconnect(self) -> None:
        self.loop.hang_up(self.peer)

    def receive(self, send: Send) -> None:
        if send.socket != CONSUME:
            ack = native_codec.parse_produce_ack(send.frames[1:])
            assert ack is not None, f"not a produce ack: {send.frames!r}"
            self.events.append(Answered(ack.message_id.decode(), ack.ok))
            return
        reply = wire.parse_reply(send.frames[1:])
        assert reply is not None, f"not a PZQ-BATCH answer: {send.frames!r}"
        if isinstance(reply, wire.Delivered):
            for key, body in zip(reply.keys, reply.bodies, strict=True):
                self.events.append(Delivered("q", b"".join(body), (key,)))
        elif isinstance(reply, wire.Settled):
            self.events.append(Answered(self._acks.popleft(), not reply.refused))
        elif isinstance(reply, Exception):
            if reply.code == "store-failure" and self._acks:  # (an ACK of a rolled-back turn)
                self.events.append(Answered(self._acks.popleft(), False))
            else:
                self.errors.append(reply.code)
