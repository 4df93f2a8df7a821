"""The contract between the server loop's endpoint adapters and the protocol gateways.

A gateway is the socket-free state machine of one protocol on the shared store: frames (ZeroMQ) or
bytes (raw TCP) come in with the turn's clock, and what it wants sent comes out as a list of ``Send``.
Its changes to the store go through the broker inside the loop's write transaction: the loop commits
them, or rolls them back (``rolled_back`` then ``recover``); nothing a gateway returns leaves before
that commit. A gateway never sees a socket, and an endpoint adapter keeps no gateway state and asks
nothing but these methods.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple, Protocol, runtime_checkable


class Send(NamedTuple):
    """Frames for one peer, to leave after the turn's commit.

    ``socket`` names which of the endpoint's sockets (eMQP has three; the others one, ``ONLY``).
    ``frames`` starts with the routing frame (a ROUTER identity, a raw TCP connection's id, a PUB
    topic); a raw TCP endpoint writes the rest of a turn's frames for one connection as one write.
    ``token`` lets the gateway take back a delivery that could not leave (see ``unsent``).
    ``close`` asks the endpoint to close that connection once the frames are out (a stream that
    cannot be read any more: the protocol has no error message)."""

    socket: str
    frames: list[bytes]
    token: object = None
    close: bool = False

    @property
    def peer(self) -> bytes:
        return self.frames[0]


ONLY = ""  # the socket of an endpoint that has one


class Gateway(Protocol):
    """What every gateway offers the endpoint that feeds it."""

    def dispatch(self, *, now: float, now_us: int, blocked: frozenset[Hashable]) -> list[Send]:
        """What the turn sends besides direct answers: deliveries, heartbeats, scheduled work.
        ``blocked`` peers read too slowly: hand them nothing more now."""
        ...

    def unsent(self, send: Send) -> bool:
        """``send`` could not leave (its peer's pipe is full): True to keep it for later (a reply);
        False if the gateway took it back (a delivery, ready again for someone else)."""
        ...

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        """The turn's commit failed: what of its sends may still be said (errors instead of
        confirmations of what is gone). ``recover`` follows."""
        ...

    def recover(self) -> None:
        """Start over from what is on disk (the broker was reset): forget deliveries, re-read state."""
        ...

    def next_wake(self, now: float) -> float | None:
        """When the gateway next has work of its own (a heartbeat, a schedule, an expiry)."""
        ...

    def stats(self) -> dict:
        """Figures for MONITOR and metrics."""
        ...

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        """Lists of its clients for the web console: tables of ``title``, ``columns``, ``rows`` (at
        most ``limit`` each, from the ``offset``-th) and ``total``; read by the loop, so bounded by ``limit``."""
        ...

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """The consumers of ``queue`` (at most ``limit``: dicts of ``protocol``, ``client`` (a short id),
        ``address``, ``connected_us``, ``held``, and ``conn`` for a raw-TCP endpoint to fill in the first
        two), and how many there are."""
        ...


@runtime_checkable
class FramesGateway(Gateway, Protocol):
    """A gateway on ZeroMQ sockets: whole messages of frames, routing frame first."""

    def received(self, socket: str, frames: list[bytes], *, now: float, now_us: int, user: str | None) -> list[Send]:
        """One message from ``socket``; ``user`` is the peer's CURVE key (z85) when it has one."""
        ...


@runtime_checkable
class StreamGateway(Gateway, Protocol):
    """A gateway on raw TCP connections: bytes as they arrive, and the connections' life."""

    @property
    def sessions(self) -> dict:
        """Open connections (their count is held against --max-connections)."""
        ...

    def connected(self, conn: bytes, address: str = "") -> None:
        """A new connection from ``address`` ("ip:port"): its network's permissions apply to it."""
        ...

    def narrowed(self) -> list[bytes]:
        """The permissions changed (SIGHUP): the connections consuming a queue their network may no
        longer consume, for the endpoint to close (what they held goes back at once)."""
        ...

    def disconnected(self, conn: bytes) -> None:
        """The connection is gone: what it held goes back to its queue."""
        ...

    def buffered(self, conn: bytes) -> int:
        """Bytes of unfinished input it holds (held against --max-partial-input)."""
        ...

    def holding(self, conn: bytes) -> bool:
        """True while the connection holds deliveries whose ack timeout has not come (a peer that reads
        nothing is cut only after they went back: pzq/endpoints/stuck.py)."""
        ...

    def received(self, conn: bytes, data: bytes, *, now: float, now_us: int) -> list[Send]: ...

    def dispatch(
        self,
        *,
        now: float,
        now_us: int,
        blocked: frozenset[Hashable],
        most: int | None = None,
        most_bytes: int | None = None,
    ) -> list[Send]:
        """As ``Gateway.dispatch``, in slices that fit the turn: ``most`` deliveries and about
        ``most_bytes`` of their bodies at most (None: no bound); ``dispatched`` and ``dispatched_bytes``
        then say what the call handed out, and fewer than ``most`` that there is nothing more now."""
        ...

    @property
    def dispatched(self) -> int: ...

    @property
    def dispatched_bytes(self) -> int: ...


class Budget(Protocol):
    """The turn's budget as a gateway sees it (the loop's ``TurnBudget``): asked before each request,
    told after each one (``size`` bytes let in, ``records`` touched); ``bytes_left`` of the turn's."""

    bytes_left: int

    def spent(self) -> bool: ...

    def take(self, size: int = 0, records: int = 1) -> None: ...


class _Unbounded:
    """A budget that never runs out: a gateway called outside a server's turn (tests, scripts)."""

    bytes_left = 1 << 62

    def spent(self) -> bool:
        return False

    def take(self, size: int = 0, records: int = 1) -> None:
        pass


UNBOUNDED: Budget = _Unbounded()


@runtime_checkable
class PacedGateway(StreamGateway, Protocol):
    """A raw-TCP gateway whose requests may cost more than a turn can give them all (MQKS: a client
    pipelines many lines in one write). ``keep`` only keeps a connection's whole requests; ``serve``
    takes one request of each connection in turn, round after round, while ``budget`` lasts, so a
    connection's one request waits for at most one of each other connection's. What waits counts in
    ``buffered`` (the connection's share of unfinished input: the endpoint stops reading one that holds
    too much, and reads the others)."""

    def keep(self, conn: bytes, data: bytes) -> list[Send]:
        """Bytes from ``conn``: its whole requests wait for ``serve``; what goes out at once is a close
        (a stream that cannot be framed any more). (``received`` is ``keep`` then ``serve`` unbounded.)"""
        ...

    @property
    def waiting_bytes(self) -> int:
        """Bytes of the requests that wait, every connection's together."""
        ...

    def waiting(self) -> bool:
        """True while requests wait to be served."""
        ...

    def serve(self, *, now: float, now_us: int, budget: Budget) -> list[Send]:
        """Serve the waiting requests while ``budget`` lasts: one of each connection in turn, each
        connection's in order; the connection whose turn it was when the budget ran out goes first next."""
        ...

    def served(self) -> set[bytes]:
        """The connections whose waiting requests went down since the last call (their ``buffered``)."""
        ...

    @property
    def writing(self) -> bool:
        """True when a request in slices wrote a part this turn: the turn must commit (or the parts of
        several turns would gather in one commit)."""
        ...

    def flushed(self) -> None:
        """The turn's output went, after its commit."""
        ...


@runtime_checkable
class PipedGateway(StreamGateway, Protocol):
    """A raw-TCP gateway that charges what it sends a connection to that connection (its share of the
    byte account, pzq/broker/accounts.py) until the peer's TCP acknowledged it; its endpoint reads the
    acknowledgements (pzq/endpoints/unread.py)."""

    def piped(self, conn: bytes, sends: list[Send], kept: int) -> int:
        """``sends`` and ``kept`` bytes of earlier replies (a slow reader's backlog) were handed to
        libzmq for ``conn`` as one write: charge what is the gateway's to charge, and say how much."""
        ...

    def unpiped(self, conn: bytes, size: int) -> None:
        """``conn``'s peer acknowledged bytes that carried ``size`` of its charges."""
        ...
