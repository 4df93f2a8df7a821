"""Counting and capping the connections libzmq accepts on the ZeroMQ endpoints.

libzmq accepts tcp:// and ipc:// connections in its own I/O thread and offers no limit on them, so a
client opening thousands of idle connections would use up the process's file descriptors: libzmq then
spins on its listener and aborts the next time it needs a descriptor. pzq watches every bound ZeroMQ
socket with a socket monitor (``Sockets.monitors``): each accepted connection is counted with the raw-TCP
ones (``ConnectionLimit``), and one past ``--max-connections`` (or past one endpoint's share) is shut
down at once through a duplicate of its descriptor; libzmq sees the end of the stream and closes it.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from pzq.clock import Now
from pzq.endpoints.base import Endpoint, Sockets
from pzq.endpoints.shares import ConnectionLimit
from pzq.logs import warn_bad
from pzq.zmqio import peer_of_fd

log = logging.getLogger("pzq.server")

EVENTS_PER_TURN = 10_000  # monitor events read per socket per turn (each is a few bytes)


class ConnectionWatch(Endpoint):
    """Reads the socket monitors; keeps ``ConnectionLimit.zmq_open`` per watched socket."""

    name = "connections"

    def __init__(self, binder: Sockets, limit: ConnectionLimit):
        self.binder = binder
        self.limit = limit
        self.limit.zmq_endpoints = len(binder.monitors)  # (each has its reserve of connections)
        self.accept_failed_total = 0
        binder.drain_events = self.drain

    def drain(self, sock: zmq.Socket) -> None:
        """Read the events waiting for ``sock`` now, whatever the turn's budget: an endpoint that maps a
        request to its connection (the memory bound) must have seen every DISCONNECTED before it."""
        for pair, (role, watched) in self.binder.monitors.items():
            if watched is sock:
                # (asked by an endpoint mid-turn, which is not handed the turn's Now: a stamp of its own)
                self._events(pair, role, time.time_ns() // 1000, bounded=False)

    @property
    def refused_total(self) -> int:
        """Connections refused for want of room, on every endpoint (raw TCP too)."""
        return self.limit.refused_total

    @property
    def sockets(self) -> list[zmq.Socket]:  # type: ignore[override]
        return list(self.binder.monitors)  # (a re-bound socket comes with a new monitor)

    def read(self, ready: dict, now: Now) -> None:
        for pair in [p for p in self.limit.zmq_open if p not in self.binder.monitors]:
            del self.limit.zmq_open[pair]  # its socket was closed: so were its connections
        self.limit.zmq_endpoints = len(self.binder.monitors)
        for pair, (role, _) in self.binder.monitors.items():
            if pair in ready:
                self._events(pair, role, now.wall_us)

    def _events(self, pair: zmq.Socket, role: str, wall_us: int, *, bounded: bool = True) -> None:
        sock = self.binder.monitors[pair][1]
        open_fds = self.binder.open_fds.setdefault(sock, set())
        peers = self.binder.peers.setdefault(sock, {})
        for _ in range(EVENTS_PER_TURN):
            if bounded and self.budget.spent():  # (the rest wait in the pipe, which loses none: next turn)
                return
            try:
                event = parse_monitor_message(pair.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self.budget.take()
            kind = event["event"]
            if kind == zmq.EVENT_ACCEPTED:
                held = self.limit.zmq_open.get(pair, 0)
                refuse = self.limit.full(held)  # (the rule raw-TCP connections follow too; counted there)
                # Counted all the same: the one cut off still sends its DISCONNECTED event.
                self.limit.zmq_open[pair] = held + 1
                open_fds.add(event["value"])
                if not refuse:
                    peers[event["value"]] = wall_us
                if refuse:
                    warn_bad(
                        role,
                        "too-many-connections",
                        f"{self.limit.total() - 1} connections are open "
                        f"(--max-connections {self.limit.limit}, at most {self.limit.per_endpoint} on one "
                        f"endpoint, {self.limit.reserve} kept for each): a new one was closed at once",
                    )
                    shut(event["value"], event["endpoint"])
            elif kind == zmq.EVENT_DISCONNECTED:
                self.limit.zmq_open[pair] = max(0, self.limit.zmq_open.get(pair, 0) - 1)
                open_fds.discard(event["value"])
                peers.pop(event["value"], None)
                told = self.binder.on_disconnect.get(sock)
                if told is not None:
                    told(event["value"])
            elif kind == zmq.EVENT_ACCEPT_FAILED:
                self.accept_failed_total += 1
                warn_bad(role, "accept-failed", f"libzmq could not accept a connection: {os.strerror(event['value'])}")

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        """Every watched ZeroMQ socket's TCP connections (native producers and consumers, the monitor,
        the API, eMQP): the peer's address, the endpoint, since when; a page of ``limit`` from ``offset``."""
        watched = [(role, self.binder.peers.get(sock, {})) for role, sock in self.binder.monitors.values()]
        every = ((fd, role, since) for role, peers in watched for fd, since in peers.items())
        rows = [[peer_of_fd(fd), role, since] for fd, role, since in itertools.islice(every, offset, offset + limit)]
        total = sum(len(peers) for _, peers in watched)
        columns = ["address", "endpoint", "connected_us"]
        return [
            {
                "kind": "zmq",
                "gateway": "zeromq",
                "title": "TCP connections",
                "columns": columns,
                "rows": rows,
                "total": total,
            }
        ]

    def output_waiting(self) -> bool:
        return False  # (it closes connections; it sends nothing)

    def stats(self) -> dict | None:
        return {
            "open": self.limit.total(),
            "limit": self.limit.limit,
            "refused_total": self.refused_total,
            "accept_failed_total": self.accept_failed_total,
            **self.limit.stats(),
        }


def shut(fd: int, endpoint: bytes | str) -> None:
    """End the connection on descriptor ``fd`` (libzmq's) without closing the descriptor itself:
    shutting down a duplicate ends the stream for both, and libzmq closes its own when it sees that.
    Only a connected socket accepted on ``endpoint``'s port is touched: if libzmq closed it first and
    the number was reused, whatever holds it now (a listener above all) is left alone."""
    try:
        copy = os.dup(fd)
    except OSError:  # already closed by libzmq: the peer left first
        return
    try:
        dup = socket.socket(fileno=copy)
    except OSError:  # not a socket (the number was reused): nothing of ours to end
        os.close(copy)
        return
    text = endpoint.decode("ascii", "replace") if isinstance(endpoint, bytes) else endpoint
    port = text.rpartition(":")[2]
    try:
        if (
            dup.type == socket.SOCK_STREAM
            and not dup.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            and str(dup.getsockname()[1]) == port
        ):
            dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more: nothing to end
    finally:
        dup.close()
