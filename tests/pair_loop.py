"""The loop of the gateway pairs (tests/pairs.py): a gateway on a real Store and Broker driven as the
server's turn drives it, with no socket, on a clock that moves only when a test moves it; what clients
see (events); and the base of every pair's client.

A ``Loop`` turn (server.py ``_turn``): what clients sent is handed to ``received``, leases and ack
deadlines are looked at, ``dispatch`` runs, a gateway's big messages are written a turn's bytes further
(``parts``, as its endpoint drives them), then the store is committed, or rolled back as after a
failed commit (``recover``, then ``rolled_back`` decides what may still be said). Only then do the sends
leave. A pipe that is "full" this turn takes nothing: its sends are offered back through ``unsent``
exactly as the endpoints do.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable
from typing import Any

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.endpoints.base import TurnBudget
from pzq.gateways.contract import PacedGateway, Send
from pzq.leases import Leases

ACK_TIMEOUT_S = 3600.0  # far beyond any clock move of these tests: a delivery returns only as a rule says
LEASE_TIMEOUT_S = 60.0  # an API group nobody calls for this long lets its leases go
HEARTBEAT_S, LIVENESS = 3.0, 3  # an eMQP worker silent for 9 s is dead
MAX_INPUT = 4096  # a PHPMQ packet or MQKS line; small, so that an endless one is quick to send


@dataclasses.dataclass
class Clock:
    """The loop's time: one ``Now`` (monotonic seconds and wall microseconds together), read once a turn
    as the server reads it; it moves only by ``advance``, both clocks alike."""

    now: Now = Now(mono=1000.0, wall_us=1_700_000_000_000_000)

    def advance(self, seconds: float) -> None:
        self.now = Now(self.now.mono + seconds, self.now.wall_us + int(seconds * 1_000_000))

    def wall_s(self) -> float:
        return self.now.wall_us / 1e6


# -- the loop ------------------------------------------------------------------------------------------


class Loop:
    """One gateway, its real broker and store, and the server's turn without sockets."""

    def __init__(
        self,
        store,
        clock: Clock,
        make_gateway: Callable[[Loop], object],
        route: Callable[[Send], Hashable] = lambda send: send.peer,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.store, self.clock, self.route, self.limits = store, clock, route, limits
        self.broker = Broker(store, ack_timeout_s=ACK_TIMEOUT_S, limits=limits)
        self.leases = Leases(self.broker, timeout_s=LEASE_TIMEOUT_S)
        self.gateway: Any = make_gateway(self)  # (each kind offers its own half of the contract)
        self._inbox: list[Callable[[Now], list[Send]]] = []
        self.backlog: dict[Hashable, list[Send]] = {}  # what a full pipe did not take, kept by the endpoint
        self.closed: list[bytes] = []  # connections the gateway asked to close, not yet told to their client
        self.taken_back: list[Send] = []  # deliveries ``unsent`` took back (ready again)

    def connect(self, conn: bytes) -> None:
        """A raw TCP connection opens (STREAM's first notice)."""
        self.gateway.connected(conn)

    def feed(self, conn: bytes, data: bytes) -> None:
        """Bytes of a raw TCP connection, read in the next turn; a close it asks for is done at once."""

        def step(now: Now) -> list[Send]:
            if conn in self.closed or conn not in self.gateway.sessions:
                return []  # (bytes behind garbage, as the endpoint drops them)
            if isinstance(self.gateway, PacedGateway):  # (as the endpoint: kept, then served in turn)
                sends = self.gateway.keep(conn, data)
            else:
                sends = self.gateway.received(conn, data, now=now)
            if sends and sends[-1].close:
                self.gateway.disconnected(conn)
                self.closed.append(conn)
            return sends

        self._inbox.append(step)

    def feed_frames(self, socket: str, frames: list[bytes], user: str | None = None) -> None:
        """One ZeroMQ message (routing frame first), read in the next turn."""
        self._inbox.append(lambda now: self.gateway.received(socket, frames, now=now, user=user))

    def hang_up(self, conn: bytes) -> None:
        """A raw TCP connection closes (STREAM's second notice), in the next turn."""

        def step(now: Now) -> list[Send]:
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
        now = self.clock.now  # (one Now for every step of the turn, as the server's loop hands out)
        inbox, self._inbox = self._inbox, []
        out: list[Send] = []
        for step in inbox:
            out += step(now)
        if isinstance(self.gateway, PacedGateway):  # (the endpoint serves what it read, one line of each in turn)
            # (within the turn's bytes and records, as the endpoint serves: a fan-out or a big publish goes
            # on over turns; no clock, so that a rule never depends on the machine's speed)
            serving = TurnBudget(float("inf"), self.limits.turn_write_bytes, self.limits.turn_records)
            out += self.gateway.serve(now=now, budget=serving)
            self.gateway.served()
        self.leases.mark_expired(now.wall_us)
        self.leases.work(now.wall_us)
        self.broker.expire(now.mono)
        out += self.gateway.dispatch(now=now, blocked=frozenset(self.backlog) | slow)
        parts = getattr(self.gateway, "parts", None)
        if parts is not None and parts.pending:  # (a turn's bytes of its big messages, as its endpoint does)
            budget = TurnBudget(float("inf"), self.limits.turn_write_bytes, self.limits.turn_records)
            out += self._closes(parts.step(budget, now.wall_us))
        if fail:  # as server._recover and each endpoint's rolled_back
            self.store.abort()
            self.broker.reset()
            self.leases.load()
            self.gateway.recover()
            out = self.gateway.rolled_back(out) + (self._closes(parts.rolled_back()) if parts is not None else [])
        else:
            self.store.commit()
        sent = self._flush(out, full)
        if isinstance(self.gateway, PacedGateway):  # (as the endpoint, once the turn's output went)
            self.gateway.flushed()
        return sent

    def _closes(self, sends: list[Send]) -> list[Send]:
        """Closes asked for by what a gateway's big messages answered, done at once (as the endpoint)."""
        for send in sends:
            if send.close and send.peer in self.gateway.sessions:
                self.gateway.disconnected(send.peer)
                self.closed.append(send.peer)
        return [send for send in sends if not send.close]

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
        """Decode what the gateway sent this client into events (in its protocol's client codec)."""
        raise NotImplementedError

    # -- the verbs every rule uses, each read by the gateway in the next turn --------------------------

    def produce(self, queue: str, body: bytes) -> str:
        """Send ``body`` to ``queue``; returns the tag its answer will carry (none in PHPMQ)."""
        raise NotImplementedError

    def consume(self, queue: str, n: int) -> None:
        """Ask for up to ``n`` deliveries of ``queue``, as the protocol asks."""
        raise NotImplementedError

    def ack(self, delivery: Delivered) -> str:
        """Settle ``delivery``; returns the tag of its answer (none in PHPMQ, native and eMQP)."""
        raise NotImplementedError

    def garbage(self) -> None:
        """Send what is not the protocol."""
        raise NotImplementedError

    def disconnect(self) -> None:
        """Go away as such a client does: a closed connection, or silence past the protocol's timeout."""
        raise NotImplementedError
