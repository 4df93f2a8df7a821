"""Raw-TCP endpoints (PHPMQ, MQKS): a ZeroMQ STREAM socket feeding a connection-oriented gateway.

The gateway offers ``sessions`` (by connection), ``connected(conn)``, ``disconnected(conn)``,
``received(conn, data, now=, now_us=)`` (a ProtocolError closes that connection: the stream cannot be
read any more), ``dispatch(now=, now_us=) -> [(conn, bytes, token)]``, ``unsent(conn, token)`` for what
could not be sent, ``closed_total``, ``stats()`` and optionally ``next_wake()``.
"""
from __future__ import annotations

import zmq

from pzq.config import Config
from pzq.endpoints.base import Endpoint, bind
from pzq.errors import ProtocolError
from pzq.logs import warn_bad
from pzq.zmqio import NOBLOCK, Again, recv_frames, send_frames

READ_BATCH = 4096
CLOSED_MEMORY_S = 60.0  # how long a connection we closed is remembered (STREAM sends no notice for it)


class StreamEndpoint(Endpoint):
    """A ZeroMQ STREAM socket is raw TCP inside the same poller as every other endpoint, with
    connect/disconnect notices and libzmq's buffering; each dispatch goes out as one send, which the
    legacy client needs (it reads a header in one 8-byte read). Memory per slow reader is bounded by
    its send pipe (SNDHWM messages; past it a dispatch is taken back)."""

    def __init__(self, name: str, dsn: str, gateway, config: Config, ctx: zmq.Context, owned: list[zmq.Socket]):
        self.name = name
        self.gateway = gateway
        self.sock = bind(ctx, zmq.STREAM, dsn, f"--{name}-dsn", owned)
        self.sock.setsockopt(zmq.SNDHWM, 2 * config.max_inflight)
        self.sockets = [self.sock]
        self._closed: dict[bytes, float] = {}  # closed by us, and when
        self._closing: list[bytes] = []
        self._out: list = []

    def read(self, ready: dict, now: float, now_us: int) -> None:
        if self.sock not in ready:
            return
        sessions = self.gateway.sessions
        for _ in range(READ_BATCH):
            try:
                conn, data = recv_frames(self.sock, NOBLOCK)
            except Again:
                return
            if data == b"":  # STREAM's notice: the first for a peer is its connect, the next its close
                if conn in sessions:
                    self.gateway.disconnected(conn)
                elif conn not in self._closing and self._closed.pop(conn, None) is None:
                    self.gateway.connected(conn)
                continue
            if conn in self._closing or conn in self._closed:
                continue
            try:
                self.gateway.received(conn, data, now=now, now_us=now_us)
            except ProtocolError as exc:
                warn_bad(self.name, exc.code, f"{exc.detail}; closing the connection")
                self.gateway.closed_total += 1
                self.gateway.disconnected(conn)
                self._closing.append(conn)

    def work(self, now: float, now_us: int) -> None:
        if self.gateway.sessions:
            self._out = self.gateway.dispatch(now=now, now_us=now_us)

    def waiting(self) -> bool:
        return bool(self._out)

    def rolled_back(self) -> None:
        self._out = []

    def flush(self, now: float, now_us: int) -> None:
        out, self._out = self._out, []
        for conn, data, token in out:
            try:
                send_frames(self.sock, [conn, data], NOBLOCK)
            except Again:  # the client reads too slowly: the message stays stored for later
                if token is not None:
                    self.gateway.unsent(conn, token)
            except zmq.ZMQError:  # gone since its bytes were read (EHOSTUNREACH)
                self.gateway.disconnected(conn)
        closing, self._closing = self._closing, []
        for conn in closing:
            try:
                send_frames(self.sock, [conn, b""], NOBLOCK)  # an empty frame closes a STREAM peer
            except zmq.ZMQError:
                pass
            self._closed[conn] = now
        if self._closed:
            for conn in [c for c, t in self._closed.items() if now - t > CLOSED_MEMORY_S]:
                del self._closed[conn]

    def recover(self) -> None:
        recover = getattr(self.gateway, "recover", None)
        if recover is not None:
            recover()

    def wake_at(self, now: float) -> float | None:
        next_wake = getattr(self.gateway, "next_wake", None)
        return None if next_wake is None else next_wake()

    def stats(self) -> dict:
        return self.gateway.stats()
