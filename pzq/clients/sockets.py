"""What every blocking client does with its sockets: connect (ZeroMQ or raw TCP), wait with a timeout,
use CURVE keys from files, hear at once when the server refuses the key, and refuse an ipc socket file
someone else may have planted."""

from __future__ import annotations

import itertools
import os
import socket
import stat
import time
import warnings
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from pzq.errors import ClientError, NotPermitted

Curve = tuple[str, str]  # (this client's .key_secret file, the server's .key file)
_watch_ids = itertools.count(1)  # (the inproc addresses of the clients' socket monitors)


def check_ipc_owner(endpoint: str) -> None:
    """Refuse an ipc socket file that someone other than its server may have made: it must belong to
    this user, or sit in a directory that only its owner can write to (``/run/pzq/monitor`` of the
    ``pzq`` user, for root). A file of another user in a shared directory such as /tmp may be a squatter
    waiting for our requests. A missing file is fine: ZeroMQ connects once the server binds it."""
    if not endpoint.startswith("ipc://") or endpoint.startswith("ipc://@"):
        return
    path = endpoint[len("ipc://") :]
    try:
        info = os.lstat(path)
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ClientError(f"cannot check {endpoint}: {exc.strerror}") from None
    if info.st_uid == os.geteuid():
        return
    if info.st_uid == parent.st_uid and not parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return
    raise ClientError(
        f"refusing to talk to {endpoint}: the socket file belongs to uid {info.st_uid}, not to you, "
        "in a directory others can write to (another user may have put it there)"
    )


class KeyedSocket(zmq.Socket):
    """A CURVE client socket that hears, through its socket monitor, when the server refuses its key.
    A refused CURVE handshake is silence on the wire (ZeroMQ only tries again, and again): without the
    monitor a client would wait out its whole timeout and then say "no answer", not "not permitted"."""

    handshakes: zmq.Socket | None = None
    endpoint: str = ""

    def watch(self, endpoint: str) -> None:
        """Listen for refused handshakes (before the connect: the first one may come at once)."""
        self.endpoint = endpoint
        address = f"inproc://pzq-client-watch-{next(_watch_ids)}"
        self.monitor(address, zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        events = self.context.socket(zmq.PAIR)
        events.setsockopt(zmq.LINGER, 0)
        # (unbounded, set before the connect: libzmq sends its events from its I/O thread and would block
        # that thread, every socket of the context, on a full pipe; a key refused again and again while
        # its client does not read adds an event of ~100 bytes each reconnection, 10 a second)
        events.setsockopt(zmq.RCVHWM, 0)
        events.connect(address)
        self.handshakes = events

    def check_refused(self) -> None:
        """Raise NotPermitted if the server refused a handshake since the last look."""
        events = self.handshakes
        while events is not None and events.poll(0):
            event = parse_monitor_message(events.recv_multipart())
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise NotPermitted(
                    f"not permitted: pzq at {self.endpoint} refused this client's CURVE key (it is not one of "
                    "its clients, or its permissions do not give it this socket's right)"
                )

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False, **kwargs: Any) -> Any:  # type: ignore[override]
        """Send as a ZeroMQ socket does, but a blocking send gives up with NotPermitted once the server
        refused the key: libzmq drops the connection's pipe then, and a DEALER or REQ without a pipe
        would wait for one for ever."""
        if self.handshakes is None or flags & zmq.NOBLOCK:
            return super().send(data, flags, copy=copy, track=track, **kwargs)
        poller = zmq.Poller()
        poller.register(self, zmq.POLLOUT)
        poller.register(self.handshakes, zmq.POLLIN)
        while True:
            try:
                return super().send(data, flags | zmq.NOBLOCK, copy=copy, track=track, **kwargs)
            except zmq.Again:
                self.check_refused()
                poller.poll()  # (until it may send, or a refusal came: checked above next time round)

    def close(self, linger: int | None = None) -> None:
        # (the monitor goes first: libzmq would send its events to a reader that is no more)
        events, self.handshakes = self.handshakes, None
        if events is not None and not self.closed:
            self.monitor(None, 0)
            events.close(linger=0)
        super().close(linger=linger)


def connect(kind: int, endpoint: str, *, ctx: zmq.Context | None = None, curve: Curve | None = None) -> zmq.Socket:
    """A ZeroMQ socket connected to ``endpoint``. Linger 0: a client that gives up on a server must not
    hang at exit over messages that server will never take. With ``curve``, a ``KeyedSocket``: its
    receives raise NotPermitted as soon as the server refuses the key."""
    check_ipc_owner(endpoint)
    context = ctx or zmq.Context.instance()
    if curve:
        from pzq.curve_keys import secure_client

        keyed = context.socket(kind, socket_class=KeyedSocket)
        keyed.setsockopt(zmq.LINGER, 0)
        secure_client(keyed, *curve)
        keyed.watch(endpoint)
        keyed.connect(endpoint)
        return keyed
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket, timeout_ms: int) -> list[bytes] | None:
    """The next message, or None if none came within ``timeout_ms``; NotPermitted as soon as the server
    refuses a ``KeyedSocket``'s key."""
    if not isinstance(sock, KeyedSocket) or sock.handshakes is None:
        return sock.recv_multipart() if sock.poll(timeout_ms) else None
    events = sock.handshakes
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(events, zmq.POLLIN)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        sock.check_refused()
        ready = dict(poller.poll(max(0, round((deadline - time.monotonic()) * 1000))))
        if sock in ready:
            return sock.recv_multipart()
        if events not in ready:
            return None


def timeout_seconds(timeout_s: float | None, timeout_ms: float | None, default_s: float) -> float:
    """The seconds a client waits: ``timeout_s`` (every client's wait is seconds, as docs/configuration.md's
    rule says), else the deprecated ``timeout_ms`` with a DeprecationWarning, else ``default_s``."""
    if timeout_ms is None:
        return default_s if timeout_s is None else timeout_s
    if timeout_s is not None:
        raise TypeError("give timeout_s (seconds) or the deprecated timeout_ms, not both")
    warnings.warn("timeout_ms is deprecated: give timeout_s, in seconds", DeprecationWarning, stacklevel=3)
    return timeout_ms / 1000


def wait_ms(seconds: float) -> int:
    """``seconds`` as the whole milliseconds zmq's poll takes (at least 0)."""
    return max(0, round(seconds * 1000))


def tcp_address(endpoint: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` (or ``HOST:PORT``) as the pair the socket module takes."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise ClientError(f"{endpoint!r} is not tcp://HOST:PORT") from None


def tcp_connect(endpoint: str, *, timeout_s: float | None, nodelay: bool = False) -> socket.socket:
    """A raw TCP connection whose reads time out after ``timeout_s`` (None: never, for a caller that
    sets its own); ClientError if nothing answers."""
    try:
        sock = socket.create_connection(tcp_address(endpoint), timeout=timeout_s)
    except OSError as exc:
        raise ClientError(f"cannot connect to {endpoint}: {exc}") from None
    if nodelay:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
