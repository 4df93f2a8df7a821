"""Gateway pairs: each protocol's gateway on a real Store and Broker, facing clients that speak its client
codec from pzq/protocols, with no socket in between (in the manner of h11's connection pairs).

A ``Loop`` drives the gateway as the server's turn does (server.py ``_turn``): what clients sent is
handed to ``received``, leases and ack deadlines are looked at, ``dispatch`` runs, then the store is
committed, or rolled back as after a failed commit (``recover``, then ``rolled_back`` decides what may
still be said). Only then are the sends handed to the clients, which decode them into events. A peer
whose "pipe is full" this turn gets nothing: its sends are offered back through ``unsent`` exactly as
the endpoints do. Time is a ``Clock`` that moves only when a test moves it.

Each gateway is built by ONE factory function below (``make_*``), so a change of a constructor is made
in one place. A protocol joins by a ``Client`` subclass (its verbs in its own codec, its events
decoded) and a line in ``PAIRS``: see ``NativeClient`` for the slot the native gateway fills.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Hashable
from typing import Any

from pzq.broker import Broker
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import ONLY, Send
from pzq.gateways.emqp import BACK, FRONT, EmqpGateway
from pzq.gateways.mqks import MqksGateway
from pzq.gateways.phpmq import PhpmqGateway
from pzq.leases import Leases
from pzq.protocols import api, emqp, mqks, phpmq

try:  # the native gateway and its codec's new name arrive with another branch: paired once they exist
    from pzq.gateways import native as native_gateway
    from pzq.protocols import native as native_codec
except ImportError:
    native_gateway = native_codec = None  # type: ignore[assignment]

ACK_TIMEOUT_S = 3600.0  # far beyond any clock move of these tests: a delivery returns only as a rule says
LEASE_TIMEOUT_S = 60.0  # an API group nobody calls for this long lets its leases go
HEARTBEAT_S, LIVENESS = 3.0, 3  # an eMQP worker silent for 9 s is dead
MAX_INPUT = 4096  # a PHPMQ packet or MQKS line; small, so that an endless one is quick to send


@dataclasses.dataclass
class Clock:
    """The loop's two clocks (monotonic seconds and wall microseconds); they move only by ``advance``."""

    now: float = 1000.0
    wall_us: int = 1_700_000_000_000_000

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_us += int(seconds * 1_000_000)

    def wall_s(self) -> float:
        return self.wall_us / 1e6


# -- the loop ------------------------------------------------------------------------------------------


class Loop:
    """One gateway, its real broker and store, and the server's turn without sockets."""

    def __init__(
        self,
        store,
        clock: Clock,
        make_gateway: Callable[[Loop], object],
        route: Callable[[Send], Hashable] = lambda send: send.peer,
    ):
        self.store, self.clock, self.route = store, clock, route
        self.broker = Broker(store, ack_timeout_s=ACK_TIMEOUT_S)
        self.leases = Leases(self.broker, timeout_s=LEASE_TIMEOUT_S)
        self.gateway: Any = make_gateway(self)  # (each kind offers its own half of the contract)
        self._inbox: list[Callable[[float, int], list[Send]]] = []
        self.backlog: dict[Hashable, list[Send]] = {}  # what a full pipe did not take, kept by the endpoint
        self.closed: list[bytes] = []  # connections the gateway asked to close, not yet told to their client
        self.taken_back: list[Send] = []  # deliveries ``unsent`` took back (ready again)

    def connect(self, conn: bytes) -> None:
        """A raw TCP connection opens (STREAM's first notice)."""
        self.gateway.connected(conn)

    def feed(self, conn: bytes, data: bytes) -> None:
        """Bytes of a raw TCP connection, read in the next turn; a close it asks for is done at once."""

        def step(now: float, now_us: int) -> list[Send]:
            if conn in self.closed or conn not in self.gateway.sessions:
                return []  # (bytes behind garbage, as the endpoint drops them)
            sends = self.gateway.received(conn, data, now=now, now_us=now_us)
            if sends and sends[-1].close:
                self.gateway.disconnected(conn)
                self.closed.append(conn)
            return sends

        self._inbox.append(step)

    def feed_frames(self, socket: str, frames: list[bytes], user: str | None = None) -> None:
        """One ZeroMQ message (routing frame first), read in the next turn."""
        self._inbox.append(lambda now, now_us: self.gateway.received(socket, frames, now=now, now_us=now_us, user=user))

    def hang_up(self, conn: bytes) -> None:
        """A raw TCP connection closes (STREAM's second notice), in the next turn."""

        def step(now: float, now_us: int) -> list[Send]:
            self.gateway.disconnected(conn)
            return []

        self._inbox.append(step)

    @property
    def busy(self) -> bool:
        return bool(self._inbox)

    def turn(
        self, *, fail: bool = False, full: frozenset[Hashable] = frozenset(), slow: frozenset[Hashable] = frozenset()
    ) -> list[Send]:
        """One turn: read, expire, dispatch, commit (or roll back when ``fail``), flush. Returns what
        left for the peers. A pipe (``route``: a peer, or the native send socket) in ``full`` takes
        nothing this turn; one in ``slow`` is handed to ``dispatch`` as blocked, as a peer with a
        backlog is (the endpoint's own bookkeeping)."""
        now, now_us = self.clock.now, self.clock.wall_us
        inbox, self._inbox = self._inbox, []
        out: list[Send] = []
        for step in inbox:
            out += step(now, now_us)
        self.leases.mark_expired(now_us)
        self.leases.work(now_us)
        self.broker.expire(now)
        out += self.gateway.dispatch(now=now, now_us=now_us, blocked=frozenset(self.backlog) | slow)
        if fail:  # as server._recover and each endpoint's rolled_back
            self.store.abort()
            self.broker.reset()
            self.leases.load()
            self.gateway.recover()
            out = self.gateway.rolled_back(out)
        else:
            self.store.commit()
        return self._flush(out, full)

    def _flush(self, out: list[Send], full: frozenset[Hashable]) -> list[Send]:
        pending = [send for sends in self.backlog.values() for send in sends] + out
        self.backlog = {}
        left = []
        for send in pending:
            if len(send.frames) < 2:  # a bare close: the connection is told below
                continue
            pipe = self.route(send)
            if pipe not in full:
                left.append(send)
            elif send.token is None or self.gateway.unsent(send):
                self.backlog.setdefault(pipe, []).append(send)
            else:
                self.taken_back.append(send)
        return left


# -- what clients see ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Delivered:
    """A message handed to the client; ``handle`` is what its protocol settles it by."""

    queue: str
    body: bytes
    handle: tuple


@dataclasses.dataclass(frozen=True)
class Answered:
    """The answer to one of the client's requests: ``tag`` is what ``produce`` (or another verb) returned."""

    tag: str
    ok: bool


@dataclasses.dataclass(frozen=True)
class Closed:
    """The server closed the client's connection."""


class Client:
    """One client of a pair: verbs written in its protocol's client codec, and the events it decoded.

    Class attributes say what the protocol can express, so the shared rules know what to expect:
    ``confirms`` (a produce is answered), ``closes`` (garbage closes the connection), ``unsent`` (what
    a delivery its peer could not take becomes: "ready" again for anyone, or "kept" for that peer),
    ``holds_back`` (the gateway hands a blocked reader nothing; else the endpoint keeps a backlog per
    peer and the gateway need not), ``settles_own`` (a delivery is held by the client it went to)."""

    confirms = True
    closes = False
    unsent = "ready"
    holds_back = True
    settles_own = True

    def __init__(self, loop: Loop, name: str):
        self.loop, self.name, self.peer = loop, name, name.encode()
        self.pipe: Hashable = self.peer  # what ``full`` and ``slow`` name to stop its deliveries
        self.events: list[object] = []
        self._ids = itertools.count(1)

    def wants(self, send: Send) -> bool:
        """True if ``send`` is for this client (its routing frame names it)."""
        return send.peer == self.peer

    @staticmethod
    def route(send: Send) -> Hashable:
        """The pipe ``send`` leaves through (what a full pipe holds back): its peer's."""
        return send.peer

    @classmethod
    def idle(cls, clients: list[Client]) -> frozenset[Hashable]:
        """Pipes nobody reads (told to ``dispatch`` as blocked, as an endpoint does): none, as a
        peer's pipe exists only while its peer is connected."""
        return frozenset()

    def tag(self) -> str:
        return f"{self.name}{next(self._ids)}"

    def take(self) -> list[object]:
        """The events decoded since the last call."""
        events, self.events = self.events, []
        return events

    def receive(self, send: Send) -> None:
        raise NotImplementedError

    # the verbs every rule uses
    def produce(self, queue: str, body: bytes) -> str:
        raise NotImplementedError

    def consume(self, queue: str, n: int) -> None:
        raise NotImplementedError

    def ack(self, delivery: Delivered) -> str:
        """Settle ``delivery``; returns the tag of its answer (none in PHPMQ)."""
        raise NotImplementedError

    def garbage(self) -> None:
        raise NotImplementedError

    def disconnect(self) -> None:
        raise NotImplementedError


class PhpmqClient(Client):
    """PHPMQ: SEND, CONSUME with a count, ACK by message id; no answers, garbage closes."""

    confirms, closes = False, True

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        loop.connect(self.peer)

    def _send(self, msg_type: int, packets: list[tuple[int, bytes]]) -> None:
        self.loop.feed(self.peer, phpmq.encode(msg_type, packets))

    def produce(self, queue: str, body: bytes) -> str:
        self._send(phpmq.SEND, [(phpmq.QUEUE, queue.encode()), (phpmq.CONTENT, body)])
        return ""

    def consume(self, queue: str, n: int) -> None:
        self._send(phpmq.CONSUME, [(phpmq.QUEUE, queue.encode()), (phpmq.COUNT, b"%d" % n)])

    def ack(self, delivery: Delivered) -> str:
        queue, message_id = delivery.handle
        self._send(phpmq.ACK, [(phpmq.QUEUE, queue.encode()), (phpmq.MESSAGE_ID, message_id)])
        return ""

    def garbage(self) -> None:
        self.loop.feed(self.peer, b"GARBAGE!")

    def disconnect(self) -> None:
        self.loop.hang_up(self.peer)

    def receive(self, send: Send) -> None:
        data = send.frames[1]
        while data:  # 003 messages: "H01003" count(2), then packets "P" type(2) length(29) content
            assert data[:6] == b"H01003", data[:40]
            count, at, packets = int(data[6:8]), phpmq.HEADER_SIZE, {}
            for _ in range(count):
                kind, length = int(data[at + 1 : at + 3]), int(data[at + 3 : at + phpmq.PACKET_HEADER_SIZE])
                at += phpmq.PACKET_HEADER_SIZE
                packets[kind] = data[at : at + length]
                at += length
            data = data[at:]
            queue = packets[phpmq.QUEUE].decode()
            self.events.append(Delivered(queue, packets[phpmq.CONTENT], (queue, packets[phpmq.MESSAGE_ID])))


class MqksClient(Client):
    """MQKS: publish --confirm (its queue bound to an event of its own name), manual-ack consumers,
    ack by consumer and msg_id; an endless line closes."""

    closes = True

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        loop.connect(self.peer)

    def _line(self, action: str, data: str, confirm: bool = False) -> str:
        request_id = self.tag()
        self.loop.feed(self.peer, mqks.request_line(request_id, action, data, confirm))
        return request_id

    def produce(self, queue: str, body: bytes) -> str:
        self._line("rebind", f"{queue} --add {queue}")  # so that the event reaches the queue
        return self._line("publish", f"{queue} {body.decode()}", confirm=True)

    def consume(self, queue: str, n: int) -> None:
        self._line("consume", f"{queue} --add {queue} --manual-ack --prefetch={n}")

    def ack(self, delivery: Delivered) -> str:
        consumer, msg_id = delivery.handle
        return self._line("ack", f"{consumer} {msg_id}", confirm=True)

    def garbage(self) -> None:
        self.loop.feed(self.peer, b"x" * (MAX_INPUT + 1))

    def disconnect(self) -> None:
        self.loop.hang_up(self.peer)

    def receive(self, send: Send) -> None:
        for line in send.frames[1].decode().splitlines():
            delivery = mqks.parse_delivery(line)
            if delivery is not None:  # (a consumer's id is the id of its consume request: deliveries first)
                queue = delivery.event  # (each queue is bound to the event of its name)
                self.events.append(Delivered(queue, delivery.data.encode(), (delivery.consumer, delivery.msg_id)))
                continue
            request_id = line.split(" ", 1)[0]
            answer = mqks.parse_answer(line, request_id)
            if answer is not None:
                self.events.append(Answered(request_id, answer.ok))


class EmqpClient(Client):
    """eMQP: REQUESTs as a client (answered by ACK), jobs as a worker (INFORM, one READY per job),
    settled by REPLY. A worker's only disconnect is silence (a ROUTER never tells of a peer gone), and
    garbage is dropped: a ZeroMQ peer has no connection of its own to close."""

    unsent, holds_back = "kept", False

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.user = f"key-{name}"  # its CURVE key: part of what a worker holds by
        self.queues: list[str] = []

    def _command(self, socket: str, name: str, *args: str) -> str:
        msgid = self.tag()
        self.loop.feed_frames(socket, [self.peer, *emqp.command(name, msgid, *args)], self.user)
        return msgid

    def _worker(self, queue: str) -> None:
        if queue not in self.queues:
            self.queues.append(queue)
            self._command(BACK, "INFORM", json.dumps([[10, q] for q in self.queues]), "worker")

    def produce(self, queue: str, body: bytes) -> str:
        return self._command(FRONT, "REQUEST", queue, "", body.decode())

    def consume(self, queue: str, n: int) -> None:
        self._worker(queue)
        for _ in range(n):
            self._command(BACK, "READY")

    def ack(self, delivery: Delivered) -> str:
        self._worker(delivery.queue)
        return self._command(BACK, "REPLY", '"done"', delivery.handle[0])

    def garbage(self) -> None:
        self.loop.feed_frames(BACK, [self.peer, b"", b"not eMQP"], self.user)

    def disconnect(self) -> None:
        self.loop.clock.advance(HEARTBEAT_S * LIVENESS + 1)

    def receive(self, send: Send) -> None:
        cmd = emqp.parse(send.frames)
        if cmd.name == "ACK":
            self.events.append(Answered(cmd.args[0], True))
        elif cmd.name == "REPLY" and "error" in json.loads(cmd.args[0]):
            self.events.append(Answered(cmd.args[1], False))
        elif cmd.name == "REQUEST":
            queue, _, payload = cmd.args
            self.events.append(Delivered(queue, payload.encode(), (cmd.msgid,)))


class ApiClient(Client):
    """The API: PRODUCE; a consumer group of its own read by LEASE, then FETCH of what was leased;
    ACK_UPTO. Its disconnect is silence: a group nobody calls for the lease timeout lets go. Garbage
    (a request without its delimiter) gets no answer; nothing is closed."""

    unsent, holds_back = "kept", False

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.user, self.group = f"key-{name}", f"group-{name}"
        self._pending: dict[str, tuple[str, str]] = {}  # request id -> (command, queue)
        self.after: dict[str, int] = {}  # per queue: the group's leases end here

    def _request(self, command: str, queue: str, args: dict) -> str:
        request_id = self.tag()
        self._pending[request_id] = (command, queue)
        self.loop.feed_frames(ONLY, [self.peer, *api.request(request_id.encode(), command, args)], self.user)
        return request_id

    def produce(self, queue: str, body: bytes) -> str:
        return self._request("PRODUCE", queue, {"messages": [[queue, body]]})

    def consume(self, queue: str, n: int) -> None:
        after = self.after.get(queue, 0)
        self._request("LEASE", queue, {"queue": queue, "group": self.group, "after": after, "max": n})

    def ack(self, delivery: Delivered) -> str:
        group, lseq = delivery.handle
        return self._request("ACK_UPTO", delivery.queue, {"queue": delivery.queue, "group": group, "upto": lseq + 1})

    def garbage(self) -> None:
        self.loop.feed_frames(ONLY, [self.peer, b"no delimiter, no request id"], self.user)

    def disconnect(self) -> None:
        self.loop.clock.advance(LEASE_TIMEOUT_S + 1)

    def receive(self, send: Send) -> None:
        reply = api.parse_reply(send.frames[1:])
        assert reply is not None, f"not an API reply: {send.frames[1:]!r}"
        request_id, ok, body = reply
        tag = request_id.decode()
        command, queue = self._pending.pop(tag)
        if command == "LEASE" and ok:
            lo = self.after.get(queue, 0)
            self.after[queue] = body["end"]
            if body["end"] > lo:  # what was leased is read in the next turn
                self._request("FETCH", queue, {"queue": queue, "group": self.group, "lo": lo, "hi": body["end"]})
        elif command == "FETCH" and ok:
            for lseq, _key, _enqueued, _deliveries, payload in body["messages"]:
                self.events.append(Delivered(queue, payload, (self.group, lseq)))
        else:
            self.events.append(Answered(tag, ok))


class NativeClient(Client):
    """Native: a producer's DEALER (each message answered "1" or "0" with the error) and a consumer's
    ROUTER on the send socket. The server's DEALER picks the consumer and hides which one got what: every
    delivery has the one holder, so one consumer may settle another's (``settles_own`` is False), and a
    slow or full consumer pipe is the send socket's (``pipe``). A consumer's disconnect is silence: what it
    held returns at its ack timeout. Garbage from a producer is answered "0"; nothing is closed."""

    settles_own = False

    def __init__(self, loop: Loop, name: str):
        super().__init__(loop, name)
        self.pipe = native_gateway.SEND
        self.consuming = False

    def wants(self, send: Send) -> bool:
        if send.socket == native_gateway.SEND:
            return self.consuming
        return send.peer == self.peer

    @staticmethod
    def route(send: Send) -> Hashable:
        return native_gateway.SEND if send.socket == native_gateway.SEND else send.peer

    @classmethod
    def idle(cls, clients: list[Client]) -> frozenset[Hashable]:
        consuming = any(isinstance(c, NativeClient) and c.consuming for c in clients)
        return frozenset() if consuming else frozenset({native_gateway.SEND})  # (no consumer connected)

    def produce(self, queue: str, body: bytes) -> str:
        message_id = self.tag()
        self.loop.feed_frames(native_gateway.RECEIVE, [self.peer, *native_codec.produce(message_id.encode(), [body])])
        return message_id

    def consume(self, queue: str, n: int) -> None:
        self.consuming = True  # (its ROUTER connects to the send socket: the server's credit decides)

    def ack(self, delivery: Delivered) -> str:
        self.loop.feed_frames(native_gateway.SEND, native_codec.consumer_ack(delivery.handle[0]))
        return ""

    def garbage(self) -> None:
        self.loop.feed_frames(native_gateway.RECEIVE, [self.peer, b"an id and nothing more"])

    def disconnect(self) -> None:
        self.consuming = False
        self.loop.clock.advance(ACK_TIMEOUT_S + 1)

    def receive(self, send: Send) -> None:
        if send.socket == native_gateway.SEND:
            got = native_codec.parse_delivery(send.frames)
            assert got is not None, f"not a delivery: {send.frames!r}"
            self.events.append(Delivered("q", b"".join(got.body), (got.key,)))
            return
        ack = native_codec.parse_produce_ack(send.frames[1:])
        assert ack is not None, f"not a produce ack: {send.frames!r}"
        self.events.append(Answered(ack.message_id.decode(), ack.ok))


# -- one factory per gateway: the one place each constructor is called --------------------------------


def make_phpmq(loop: Loop) -> PhpmqGateway:
    return PhpmqGateway(loop.broker, max_content=MAX_INPUT)


def make_mqks(loop: Loop) -> MqksGateway:
    return MqksGateway(
        loop.broker, max_line=MAX_INPUT, window=10, drop_queue=loop.broker.drop_queue, error_id=lambda: "E1"
    )


def make_emqp(loop: Loop) -> EmqpGateway:
    ids = itertools.count(1)
    return EmqpGateway(
        loop.broker,
        default_queues=["default"],
        heartbeat_s=HEARTBEAT_S,
        liveness=LIVENESS,
        new_id=lambda: f"server{next(ids)}",
        wall_clock=loop.clock.wall_s,
    )


def make_api(loop: Loop) -> ApiGateway:
    return ApiGateway(loop.broker, loop.leases, max_message_size=MAX_INPUT, dedup_window_s=60)


def make_native(loop: Loop):
    """The native gateway serves one queue, the one every rule uses."""
    return native_gateway.NativeGateway(
        loop.broker,
        queue="q",
        max_message_size=MAX_INPUT,
        max_inflight=100,
        ack_timeout_us=int(ACK_TIMEOUT_S * 1_000_000),
    )


@dataclasses.dataclass(frozen=True)
class Spec:
    """A gateway, its factory and the client class that speaks to it."""

    name: str
    make: Callable[[Loop], object]
    client: type[Client]


PAIRS = {
    spec.name: spec
    for spec in (
        Spec("phpmq", make_phpmq, PhpmqClient),
        Spec("mqks", make_mqks, MqksClient),
        Spec("emqp", make_emqp, EmqpClient),
        Spec("api", make_api, ApiClient),
        *([Spec("native", make_native, NativeClient)] if native_gateway is not None else []),
    )
}


class Pair:
    """A gateway and its clients: ``client()`` adds one, ``turn()`` runs the loop and hands every
    client what was sent to it. Time moves only by ``clock.advance``."""

    def __init__(self, spec: Spec, store, clock: Clock | None = None):
        self.spec = spec
        self.clock = clock or Clock()
        self.loop = Loop(store, self.clock, spec.make, spec.client.route)
        self.gateway, self.broker, self.store = self.loop.gateway, self.loop.broker, store
        self.clients: dict[bytes, Client] = {}
        self._turns = 0

    def client(self, name: str) -> Client:
        client = self.spec.client(self.loop, name)
        self.clients[client.peer] = client
        return client

    def turn(
        self, *, fail: bool = False, full: frozenset[Hashable] = frozenset(), slow: frozenset[Hashable] = frozenset()
    ) -> None:
        """One turn, then more while clients have something to say (a FETCH after its LEASE), so that
        a rule reads as request, turn, answer. ``fail``, ``full`` and ``slow`` apply to the first turn
        only (see ``Loop.turn``); a pipe no client reads is always blocked."""
        idle = self.spec.client.idle(list(self.clients.values()))
        self._hand_out(self.loop.turn(fail=fail, full=full, slow=slow | idle))
        for _ in range(4):
            if not self.loop.busy:
                break
            self._hand_out(self.loop.turn(slow=self.spec.client.idle(list(self.clients.values()))))

    def _hand_out(self, sends: list[Send]) -> None:
        for send in sends:
            takers = [client for client in self.clients.values() if client.wants(send)]
            if takers:  # (several only behind a DEALER, which takes turns)
                takers[self._turns % len(takers)].receive(send)
                self._turns += len(takers) > 1
        for conn in self.loop.closed:
            if conn in self.clients:
                self.clients[conn].events.append(Closed())
        self.loop.closed = [c for c in self.loop.closed if c not in self.clients]

    def stored(self, queue: str) -> int:
        """Messages of ``queue`` on disk (delivered or not); 0 for a queue that does not exist."""
        info = self.store.queue(queue, create=False)
        return 0 if info is None else info.count
