"""Fair shares of the pools every connection draws on: connection slots (raw TCP and ZeroMQ tcp://) and
unfinished raw-TCP input.

Each pool is split in three: a reserve per endpoint that no other endpoint can take (every client on
loopback has the same address, so an endpoint is the only line that tells them apart), a shared part
that any endpoint may use once its reserve is full, and a share per connection (unfinished input). A
client past its share is refused or closed, never another client: a flood of PHPMQ connections leaves
the native producers their reserve, and the connection holding the most unfinished input is the one
closed when the pool is full, not the honest one whose message happened to arrive last.
"""

from __future__ import annotations

from collections.abc import Callable

from pzq.config import DEFAULT_LIMITS, Limits

Closer = Callable[[bytes], None]


class ConnectionLimit:
    """What the connections of every endpoint hold together (raw TCP, and ZeroMQ through
    ``ConnectionWatch``).

    At most ``limit`` connections: each costs a file descriptor, and a process out of them can accept
    nothing (libzmq spins, or aborts on the next one it needs). Each endpoint has a reserve (its even
    part of ``limit / limits.connections_reserved_part``) and may take from the shared rest up to nine
    tenths of the limit; past that a new connection is refused (closed at once) and counted.

    At most ``partial_limit`` bytes of unfinished input (a PHPMQ message or MQKS line not yet whole) in
    all raw-TCP connections: each may hold up to a message's size, and thousands of them would hold
    gigabytes. One connection may hold its share (``connection_share``); each raw-TCP endpoint has a
    reserve the same way as for connections; when the shared rest is full, the connection holding the
    most of an endpoint past its reserve is closed (the one that grew, on a tie)."""

    def __init__(
        self,
        limit: int,
        partial_limit: int = 1 << 62,
        message_size: int = 1 << 62,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.limit = limit
        self.partial_limit = partial_limit
        self.limits = limits
        # One connection's share: a part of the pool, or one whole message and its framing, if smaller.
        part = partial_limit // limits.partial_connection_part
        self.connection_share = min(part, message_size + limits.partial_slack)
        self.gateways: list = []  # each raw-TCP endpoint's gateway (its ``sessions`` are its connections)
        self.zmq_open: dict[object, int] = {}  # connections open on each watched ZeroMQ socket
        self.zmq_endpoints = 0  # watched ZeroMQ sockets (set by ConnectionWatch)
        self.refused_total = 0  # connections refused for want of room, on every endpoint
        self._closers: dict[str, Closer] = {}  # raw-TCP endpoint -> how to close one of its connections
        self._partial: dict[tuple[str, bytes], int] = {}
        self._endpoint_partial: dict[str, int] = {}
        self.partial_total = 0
        self.partial_closed_total = 0  # connections closed for holding more than their share

    def join(self, name: str, gateway, close: Closer) -> None:
        """Count raw-TCP endpoint ``name``: its gateway's sessions are its connections, ``close`` ends one."""
        self.gateways.append(gateway)
        self._closers[name] = close
        self._endpoint_partial.setdefault(name, 0)

    # Connections

    @property
    def per_endpoint(self) -> int:
        """What one endpoint may hold at most: a flood of one leaves a tenth of the limit to the others."""
        return self.limit - self.limit // 10

    @property
    def reserve(self) -> int:
        """Connections each endpoint may always open, whatever the others hold."""
        endpoints = max(1, len(self.gateways) + self.zmq_endpoints)
        return _reserve(self.limit, self.limits.connections_reserved_part, endpoints)

    def total(self) -> int:
        return sum(len(g.sessions) for g in self.gateways) + sum(self.zmq_open.values())

    def full(self, held: int) -> bool:
        """True if a new connection of an endpoint that holds ``held`` must be refused (closed at once);
        the refusal is counted."""
        reserve = self.reserve
        if held < reserve:
            return False  # its own reserve: no other endpoint can have taken it
        helds = [len(g.sessions) for g in self.gateways] + list(self.zmq_open.values())
        shared = self.limit - reserve * max(1, len(self.gateways) + self.zmq_endpoints)
        used = sum(max(0, h - reserve) for h in helds)
        refuse = held >= self.per_endpoint or used >= shared or self.total() >= self.limit
        if refuse:
            self.refused_total += 1
        return refuse

    # Unfinished input

    @property
    def partial_reserve(self) -> int:
        """Unfinished bytes each raw-TCP endpoint may always hold, whatever the others hold."""
        return _reserve(self.partial_limit, self.limits.partial_reserved_part, max(1, len(self._closers)))

    def hold(self, name: str, conn: bytes, size: int) -> list[tuple[str, bytes]]:
        """Note that connection ``conn`` of endpoint ``name`` now holds ``size`` unfinished bytes; return
        the connections to close: itself if it is over its share, or, while the pool is over, the one
        holding the most of an endpoint past its reserve. Each is counted out here; the caller closes it."""
        self._set(name, conn, size)
        if size > self.connection_share:
            self._set(name, conn, 0)
            self.partial_closed_total += 1
            return [(name, conn)]
        victims: list[tuple[str, bytes]] = []
        reserve = self.partial_reserve
        shared = self.partial_limit - reserve * max(1, len(self._closers))
        while sum(max(0, used - reserve) for used in self._endpoint_partial.values()) > shared:
            over = {e for e, used in self._endpoint_partial.items() if used > reserve}
            victim = max(
                (key for key in self._partial if key[0] in over),
                key=lambda key: (self._partial[key], key == (name, conn)),
            )
            self._set(*victim, 0)
            self.partial_closed_total += 1
            victims.append(victim)
        return victims

    def room(self, name: str, conn: bytes) -> bool:
        """Whether connection ``conn`` of endpoint ``name`` may be read on: it holds less than its read-ahead
        (``connection_share / limits.partial_read_ahead_part``). One without room is left to libzmq's pipe
        and TCP (back-pressure) rather than closed, while the others are read."""
        return self._partial.get((name, conn), 0) < self.connection_share // self.limits.partial_read_ahead_part

    def partial_of(self, name: str) -> int:
        """Unfinished bytes the connections of raw-TCP endpoint ``name`` hold."""
        return self._endpoint_partial.get(name, 0)

    def close(self, name: str, conn: bytes) -> None:
        """Close connection ``conn`` of raw-TCP endpoint ``name`` (one that ``hold`` named)."""
        self._closers[name](conn)

    def _set(self, name: str, conn: bytes, size: int) -> None:
        before = self._partial.pop((name, conn), 0)
        self.partial_total += size - before
        self._endpoint_partial[name] = self._endpoint_partial.get(name, 0) + size - before
        if size:
            self._partial[(name, conn)] = size

    def stats(self) -> dict:
        """The shares, for the monitor."""
        return {
            "reserve_per_endpoint": self.reserve,
            "partial_input_reserve_per_endpoint": self.partial_reserve,
            "partial_input_per_connection": self.connection_share,
            "partial_input_closed_total": self.partial_closed_total,
        }


def _reserve(limit: int, part: int, endpoints: int) -> int:
    """Each of ``endpoints``' even part of ``limit / part``, at least 1 while the limit allows it."""
    return min(max(1, limit // part // endpoints), limit // endpoints)
