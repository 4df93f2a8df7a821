"""Small blocking clients of the native protocol, used by the CLI, the benchmark and the Spark connector.

Every receive has a timeout: a client of a silent server raises ClientError instead of hanging.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterable, Sequence

import zmq

from pzq.errors import ClientError


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A message as a native consumer receives it."""

    peer: bytes
    key: bytes
    sent_us: int
    ack_timeout_us: int
    body: list[bytes]


@dataclasses.dataclass(frozen=True)
class ProduceResult:
    message_id: bytes
    ok: bool
    error: str = ""


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


def _socket(ctx: zmq.Context | None, kind: int, endpoint: str, curve: Curve | None = None) -> zmq.Socket:
    check_ipc_owner(endpoint)
    sock = (ctx or zmq.Context.instance()).socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if curve:
        from pzq.curve import secure_client

        secure_client(sock, *curve)
    sock.connect(endpoint)
    return sock


class Producer:
    """A DEALER producer that pipelines up to ``window`` messages and waits for every ack."""

    def __init__(
        self, endpoint: str, *, timeout_ms: int = 10_000, ctx: zmq.Context | None = None, curve: Curve | None = None
    ):
        self.sock = _socket(ctx, zmq.DEALER, endpoint, curve)
        self.timeout_ms = timeout_ms
        self._counter = 0

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def produce(self, body: Sequence[bytes]) -> ProduceResult:
        return self.produce_many([body], window=1)[0]

    def produce_many(self, bodies: Iterable[Sequence[bytes]], *, window: int = 100) -> list[ProduceResult]:
        """Send every body (a list of frames); results come back in sending order."""
        results: dict[bytes, ProduceResult] = {}
        order: list[bytes] = []
        pending = 0
        for body in bodies:
            while pending >= window:
                self._collect(results)
                pending -= 1
            self._counter += 1
            mid = b"%d" % self._counter
            order.append(mid)
            self.sock.send_multipart([mid, b"", *body])
            pending += 1
        while pending:
            self._collect(results)
            pending -= 1
        return [results[mid] for mid in order]

    def _collect(self, results: dict) -> None:
        if not self.sock.poll(self.timeout_ms):
            raise ClientError(f"no ack from the server within {self.timeout_ms} ms")
        frames = self.sock.recv_multipart()
        if len(frames) < 3 or frames[1] not in (b"1", b"0") or frames[2] != b"" or frames[0] in results:
            raise ClientError(
                f"an answer that is not a pzq ack ({len(frames)} frame(s): "
                f"{b' '.join(f[:20] for f in frames[:4])!r}): is a pzq server at this endpoint?"
            )
        ok = frames[1] == b"1"
        error = frames[3].decode("utf-8", "replace") if len(frames) > 3 else ""
        results[frames[0]] = ProduceResult(frames[0], ok, error)


class Consumer:
    """A ROUTER consumer that connects and waits, as PZQ consumers do."""

    def __init__(self, endpoint: str, *, ctx: zmq.Context | None = None, curve: Curve | None = None):
        self.sock = _socket(ctx, zmq.ROUTER, endpoint, curve)

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def receive(self, timeout_ms: int = 10_000) -> Delivery | None:
        """The next delivery, or None if none came within ``timeout_ms``."""
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        if len(frames) < 5 or frames[4] != b"" or not (frames[2].isdigit() and frames[3].isdigit()):
            raise ClientError(f"malformed delivery of {len(frames)} frames: is a pzq server at this endpoint?")
        peer, key, sent, timeout = frames[:4]
        return Delivery(peer, key, int(sent), int(timeout), frames[5:])

    def ack(self, delivery: Delivery) -> None:
        self.sock.send_multipart([delivery.peer, delivery.key, b"1"])

    def nack(self, delivery: Delivery) -> None:
        self.sock.send_multipart([delivery.peer, delivery.key, b"0"])


def monitor_request(
    endpoint: str,
    request: str = "MONITOR",
    *,
    timeout_ms: int = 5000,
    ctx: zmq.Context | None = None,
    curve: Curve | None = None,
) -> str:
    """Send one monitor request and return the reply text; ClientError if no reply in time."""
    sock = _socket(ctx, zmq.REQ, endpoint, curve)
    try:
        sock.send_string(request)
        if not sock.poll(timeout_ms):
            raise ClientError(f"no answer from the monitor at {endpoint} within {timeout_ms} ms")
        return sock.recv().decode("utf-8", "replace")
    finally:
        sock.close(linger=0)


def stats(endpoint: str, *, timeout_ms: int = 5000, curve: Curve | None = None) -> dict:
    """The server's figures as a dict (the STATS request)."""
    text = monitor_request(endpoint, "STATS", timeout_ms=timeout_ms, curve=curve)
    if text.startswith("error:"):
        raise ClientError(text.strip())
    figures = monitor_json(endpoint, text)
    if (
        not isinstance(figures, dict)
        or not isinstance(figures.get("queues"), dict)
        or not all(isinstance(figures.get(name), int) for name in PZQ_FIGURES)
        or not all(isinstance(q, dict) for q in figures["queues"].values())
    ):
        raise ClientError(f"the answer from {endpoint} is not pzq's figures: is a pzq monitor there?")
    return figures


PZQ_FIGURES = ("messages", "messages_inflight", "db_size", "inflight_db_size", "syncs", "expired_messages")


def monitor_json(endpoint: str, text: str):
    """A monitor answer that must be JSON; ClientError (not a traceback) when it is not pzq speaking."""
    try:
        return json.loads(text)
    except ValueError:
        raise ClientError(f"the answer from {endpoint} is not pzq's ({text[:60]!r}): is a pzq monitor there?") from None


def parse_monitor_text(text: str) -> dict[str, str]:
    """Split a MONITOR reply into name -> value, as the PHP client does."""
    out = {}
    for line in text.split("\n"):
        name, sep, value = line.partition(": ")
        if sep:
            out[name] = value
    return out
