"""The contract between the server loop's endpoint adapters and the protocol gateways.

A gateway is the socket-free state machine of one protocol on the shared store: frames (ZeroMQ) or
bytes (raw TCP) come in with the turn's clock, and what it wants sent comes out as a list of ``Send``.
Its changes to the store go through the broker inside the loop's write transaction: the loop commits
them, or rolls them back (``rolled_back`` then ``recover``); nothing a gateway returns leaves before
that commit. A gateway never sees a socket, and an endpoint adapter keeps no gateway state and asks
nothing but these methods. What a gateway (or an endpoint) may ask of the broker is ``BrokerSurface``:
they are typed with it, never with the Broker (tests/test_architecture.py forbids importing pzq.broker).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from pzq.clock import Now
from pzq.store import Message, QueueInfo, Upload

Ref = tuple[int, int]  # (queue id, seq): names a message across the store and the in-flight table


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

    def dispatch(self, *, now: Now, blocked: frozenset[Hashable]) -> list[Send]:
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

    def received(self, socket: str, frames: list[bytes], *, now: Now, user: str | None) -> list[Send]:
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

    def received(self, conn: bytes, data: bytes, *, now: Now) -> list[Send]: ...

    def dispatch(
        self,
        *,
        now: Now,
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

    def serve(self, *, now: Now, budget: Budget) -> list[Send]:
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


# -- what a gateway may ask of the broker ---------------------------------------------------------


class QueueUser(Protocol):
    """A part that keeps things of its own for queues (consumers, bindings, workers, schedules)."""

    def uses_queue(self, queue: str) -> bool: ...
    def queue_expired(self, queue: str) -> None: ...


class Columns(Protocol):
    """A run ``take_columns`` handed out, as columns (the batch path): one entry a message each."""

    @property
    def refs(self) -> list[Ref]: ...
    @property
    def enqueued(self) -> list[int]: ...  # µs
    @property
    def frames(self) -> list[list[bytes]]: ...
    @property
    def sizes(self) -> list[int]: ...  # bytes of each body, charged to its payer
    @property
    def ids(self) -> list[bytes]: ...  # 16 bytes each (qid, seq), its record's key


class Account(Protocol):
    """A payer's part of the byte account (``BrokerSurface.account``): what it holds (in flight, stale
    copies, piped), what of it is in flight, its share (every payer's unless set here), whether a notice
    (``may_hand``, counting ``unsent`` bytes made for it this turn) or an answer (``may_pipe``) may be
    handed to it now, and the bytes other than bodies charged to it (``charge``: > 0 handed to libzmq,
    < 0 its peer or libzmq has them)."""

    def held(self) -> int: ...
    def in_flight(self) -> int: ...
    @property
    def share(self) -> int: ...
    @share.setter
    def share(self, share: int) -> None: ...
    def may_hand(self, size: int, unsent: int = 0) -> bool: ...
    def may_pipe(self, unsent: int) -> bool: ...
    def charge(self, size: int) -> None: ...


class Deliveries(Protocol):
    """Deliveries in flight (``BrokerSurface.deliveries``): who holds one (None: not in flight), how many
    a holder has, when a holder's deliveries time out (a function read once for a run: None, not its);
    ``hold``: a stored message kept for a holder until a deadline (inf: until it settles; a durable lease
    re-registered), or a delivery in flight given its own; ``redo_on_rollback``: a holder whose gateway
    keeps nothing a rollback undoes (its deliveries outlive a failed turn, its acks are done again)."""

    def holder(self, ref: Ref) -> Hashable | None: ...
    def count(self, holder: Hashable) -> int: ...
    def deadline_of(self, holder: Hashable) -> Callable[[Ref], float | None]: ...
    def held_by(self, holder: Hashable) -> Callable[[Ref], bool]: ...  # (``deadline_of``'s, as a bool)
    def hold(self, ref: Ref, holder: Hashable, deadline: float = ...) -> None: ...
    def redo_on_rollback(self, holder: Hashable) -> None: ...


class Queues(Protocol):
    """Queues (``BrokerSurface.queues``): read (None: no such queue, nothing created), made by a client's
    request (implicit: StoreFull past its ``owner``'s share), a part that keeps things for them, a
    read-only look at their messages, the ref a client's message id names, whether holders other than
    ``ours`` hold a queue's messages (a scan: rare requests), and what of deleted queues is left to drop."""

    def info(self, queue: str) -> QueueInfo | None: ...
    def name(self, qid: int) -> str | None: ...
    def create(self, queue: str, owner: Hashable | None = None) -> QueueInfo: ...
    def add_user(self, user: QueueUser) -> None: ...
    def peek(self, queue: str, from_seq: int, limit: int) -> list[Message]: ...
    def message(self, ref: Ref) -> Message | None: ...
    def ref_in(self, queue: str, message_id: str | bytes) -> Ref | None: ...
    def held_by_others(self, qid: int, ours: Callable[[Any], bool]) -> bool: ...
    def dropping_left(self) -> tuple[int, int]: ...


class BrokerSurface(Protocol):
    """The broker as gateways and endpoints see it: every name here is one of ``pzq.broker.Broker``'s
    (the server hands them the Broker; mypy checks that it fits). ``by``/``consumer`` is the holder a
    delivery is in flight to; ``payer`` whose byte share it is charged to. What belongs together is a
    view of its own (``deliveries``, ``queues``, ``account``): named questions and verbs, never a table.
    Anything else of the broker (the store, the in-flight table, ranges, figures) is not a gateway's."""

    # -- what the turn reads: a number that grows when messages may have become ready
    @property
    def readiness(self) -> int: ...

    # -- producing: one message (its body whole, or an ``Upload`` written in full), a run into one queue
    # (how many stored), all or none; a big body written in parts; room before a side record or a body
    # written in slices (``producing``: refused too while the memory alarm refuses every producer)
    def produce(
        self, queue: str, body: Sequence[bytes] | Upload, *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message: ...
    def produce_many(
        self, queue: str, bodies: Sequence[Sequence[bytes]] | Sequence[bytes], *, now_us: int, encoded: bool = False
    ) -> int: ...
    def produce_all(
        self, items: Sequence[tuple[str, Sequence[bytes]]], *, now_us: int, meta: dict | None = None
    ) -> list[Message]: ...
    def begin_big(self, body: Sequence[bytes | bytearray | memoryview], chunk: int) -> Upload: ...
    def write_big(self, upload: Upload, most: int) -> int: ...
    def drop_big(self, upload: Upload) -> None: ...
    def check_room(self, size: int, *, producing: bool = False) -> None: ...  # StoreFull unless it fits

    # -- handing out: how many are ready; a run as messages, or as columns (the batch path)
    def ready_count(self, queue: str) -> int: ...
    def take(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: Now,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
        payer: Hashable = None,
    ) -> list[Message]: ...
    def take_columns(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: Now,
        max_bytes: int | None = None,
        payer: Hashable = None,
    ) -> Columns: ...

    # -- settling: each verb False (or the refs refused) where ``by`` does not hold the message; a run
    # of acks in one ``ack_many`` (an ``ack_many`` of one costs 2-4 times an ``ack``: both stay); back to
    # the queue ahead of newer ones or ``at_end``; taken back (None: they never left; how many went back)
    def ack(self, ref: Ref, *, by: Hashable) -> bool: ...
    def ack_many(self, refs: Iterable[Ref], *, by: Hashable) -> list[Ref]: ...
    def requeue(self, ref: Ref, *, by: Hashable, at_end: bool = False, expires_us: int = 0) -> bool: ...
    def dead_letter(self, ref: Ref, reason: str, *, by: Hashable, now_us: int) -> bool: ...
    def take_back_many(self, refs: Iterable[Ref], *, by: Hashable = None) -> int: ...

    # -- an end, whatever ended (a holder, a payer, an owner): its deliveries go back (how many), its
    # charges and the queues it made are let go
    def gone(self, key: Hashable) -> int: ...

    # -- the views: deliveries in flight, queues, a payer's part of the byte account (pzq/broker/accounts.py)
    @property
    def deliveries(self) -> Deliveries: ...
    @property
    def queues(self) -> Queues: ...
    def account(self, payer: Hashable) -> Account: ...
