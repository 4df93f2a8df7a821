"""What every blocking client does with its sockets: connect (ZeroMQ or raw TCP), wait with a timeout,
use CURVE keys from files, hear at once what the socket monitor knows (reach.py: nothing listens, the
key refused), and refuse an ipc socket file someone else may have planted."""

from __future__ import annotations

import os
import socket
import stat
import time
import warnings
from collections.abc import Mapping

import zmq

from pzq.clients import reach
from pzq.errors import ClientError, ConfigError, NotListening

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


def check_endpoint(endpoint: str) -> None:
    """ConfigError for a tcp:// endpoint a client cannot connect to: no port, or one outside 1-65535
    (libzmq refuses the first with EINVAL, and takes port 0 or 99999 and retries for ever)."""
    if endpoint.startswith("tcp://"):
        port = endpoint.rpartition(":")[2]
        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"cannot connect to {endpoint!r}: an endpoint is tcp://HOST:PORT (PORT 1-65535)")


def connect(
    kind: int,
    endpoint: str,
    *,
    ctx: zmq.Context | None = None,
    curve: Curve | None = None,
    eager: bool = False,
    options: Mapping[int, int] | None = None,
) -> zmq.Socket:
    """A ZeroMQ socket connected to ``endpoint``. Linger 0: a client that gives up on a server must not
    hang at exit over messages that server will never take. With ``curve`` or within ``reach.impatient()``
    (a `pzq` command), a ``WatchedSocket``: its sends and ``receive`` raise NotPermitted, CurveRefused or
    NotListening as soon as its monitor says so (``eager``: a refused connect is final at once). An
    endpoint ZeroMQ cannot read (``tcp://HOST`` without a port) is a ConfigError naming it."""
    check_ipc_owner(endpoint)
    check_endpoint(endpoint)
    impatient = reach.patience() is not None
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@") else ""
    if impatient and path and not os.path.exists(path):  # (known at once: no wait tells more)
        raise NotListening(f"nothing listens at {endpoint}: there is no socket file {path} (is pzq running there?)")
    context = ctx or zmq.Context.instance()
    watched = bool(curve) or impatient
    sock = context.socket(kind, socket_class=reach.WatchedSocket) if watched else context.socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        for option, value in (options or {}).items():  # (before the connect: its connection takes them)
            sock.setsockopt(option, value)
        if curve:
            from pzq.curve_keys import secure_client

            secure_client(sock, *curve)
        if isinstance(sock, reach.WatchedSocket):
            sock.watch(endpoint, keyed=bool(curve), eager=eager)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:  # (only the endpoint's: a key's or a socket option's error says its own)
            raise ConfigError(
                f"cannot connect to {endpoint!r} ({zmq.strerror(exc.errno or 0)}): an endpoint is tcp://HOST:PORT or "
                "ipc://PATH"
            ) from None
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


def receive(sock: zmq.Socket, timeout_ms: int) -> list[bytes] | None:
    """The next message, or None if none came within ``timeout_ms``; for a ``WatchedSocket``, its
    monitor's verdict (NotPermitted, CurveRefused, NotListening) as soon as there is one."""
    watch = sock.reach if isinstance(sock, reach.WatchedSocket) else None
    if watch is None:
        return sock.recv_multipart() if sock.poll(timeout_ms) else None
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(watch.events, zmq.POLLIN)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        watch.check()
        due = watch.due()
        wake = deadline if due is None else min(deadline, due)
        ready = dict(poller.poll(max(0, round((wake - time.monotonic()) * 1000))))
        if sock in ready:
            return sock.recv_multipart()
        if not ready and time.monotonic() >= deadline:
            watch.at_end()
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
        raise ConfigError(f"{endpoint!r} is not tcp://HOST:PORT") from None


def tcp_connect(endpoint: str, *, timeout_s: float | None, nodelay: bool = False) -> socket.socket:
    """A raw TCP connection whose reads time out after ``timeout_s`` (None: never, for a caller that
    sets its own); NotListening if the connection is refused (or, within ``reach.impatient()``, not made
    within its patience), ClientError for another failure."""
    address = tcp_address(endpoint)
    wait = reach.patience()
    started = time.monotonic()
    try:
        sock = socket.create_connection(address, timeout=timeout_s if wait is None else wait)
    except (ConnectionRefusedError, TimeoutError) as exc:
        how = "refused" if isinstance(exc, ConnectionRefusedError) else "not answered"
        raise NotListening(
            f"nothing listens at {endpoint} (the connection was {how}, {time.monotonic() - started:.1f} s): "
            "is pzq running there?"
        ) from None
    except OSError as exc:
        raise ClientError(f"cannot connect to {endpoint}: {exc}") from None
    sock.settimeout(timeout_s)
    if nodelay:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
