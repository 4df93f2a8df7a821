"""What every blocking client does with its sockets: connect (ZeroMQ or raw TCP), wait with a timeout,
use CURVE keys from files, and refuse an ipc socket file someone else may have planted."""

from __future__ import annotations

import os
import socket
import stat

import zmq

from pzq.errors import ClientError

Curve = tuple[str, str]  # (this client's .key_secret file, the server's .key file)


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


def connect(kind: int, endpoint: str, *, ctx: zmq.Context | None = None, curve: Curve | None = None) -> zmq.Socket:
    """A ZeroMQ socket connected to ``endpoint``. Linger 0: a client that gives up on a server must not
    hang at exit over messages that server will never take."""
    check_ipc_owner(endpoint)
    sock = (ctx or zmq.Context.instance()).socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if curve:
        from pzq.curve_keys import secure_client

        secure_client(sock, *curve)
    sock.connect(endpoint)
    return sock


def receive(sock: zmq.Socket, timeout_ms: int) -> list[bytes] | None:
    """The next message, or None if none came within ``timeout_ms``."""
    if not sock.poll(timeout_ms):
        return None
    return sock.recv_multipart()


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
