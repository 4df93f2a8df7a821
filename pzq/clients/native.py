"""Small blocking clients of the native protocol, used by the CLI, the benchmark and the Spark connector.

Every receive has a timeout: a client of a silent server raises ClientError instead of hanging.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence

import zmq

from pzq.clients import reach
from pzq.clients.native_batches import BatchSender
from pzq.clients.native_consume import BatchConsumer as BatchConsumer  # (the batched consumer: PZQ-BATCH/1)
from pzq.clients.sockets import Curve, connect, receive, timeout_seconds, wait_ms
from pzq.config import format_duration
from pzq.errors import ClientError, NoMessage
from pzq.protocols import native as wire
from pzq.protocols.monitor import PZQ_FIELDS
from pzq.protocols.native_batch import Caps as BatchCaps


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


class Producer:
    """A DEALER producer that pipelines up to ``window`` messages and waits for every ack; ``send_many``
    packs them into batches (PZQ-BATCH/1) where the server speaks it."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float | None = None,
        ctx: zmq.Context | None = None,
        curve: Curve | None = None,
        timeout_ms: int | None = None,
    ):
        """``timeout_s``: how long to wait for each ack (10 s); ``timeout_ms`` is its deprecated alias."""
        self.timeout_s = timeout_seconds(timeout_s, timeout_ms, 10.0)
        self.sock = connect(zmq.DEALER, endpoint, ctx=ctx, curve=curve)
        self._counter = 0
        self.batches = BatchSender(self.sock, wait_ms(self.timeout_s))

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
            self.sock.send_multipart(wire.produce(mid, body))
            pending += 1
        while pending:
            self._collect(results)
            pending -= 1
        return [results[mid] for mid in order]

    def batch_caps(self) -> BatchCaps | None:
        """What the server takes in one batch, or None if it does not speak PZQ-BATCH/1 (asked once)."""
        return self.batches.probe()

    def send_many(self, bodies: Iterable[Sequence[bytes]], *, batch: int = 100, window: int = 4) -> list[ProduceResult]:
        """Send every body (a list of frames) in batches of up to ``batch`` messages, ``window`` batches
        in flight, and wait for every ack; results in sending order. Against a server without batches,
        one message per ZeroMQ message with ``batch * window`` in flight (``produce_many``). A batch's
        messages are stored and acked together; a message too big for a batch goes alone.

            with Producer("tcp://127.0.0.1:11131") as producer:
                results = producer.send_many([[b"one"], [b"two", b"frames"]])
                assert all(r.ok for r in results)
        """
        if self.batch_caps() is None:
            return self.produce_many(bodies, window=max(1, batch) * max(1, window))
        return [ProduceResult(*result) for result in self.batches.send(bodies, batch=batch, window=window)]

    def _collect(self, results: dict[bytes, ProduceResult]) -> None:
        frames = receive(self.sock, wait_ms(self.timeout_s))
        if frames is None:
            raise NoMessage(f"no ack from the server within {format_duration(self.timeout_s)}")
        ack = wire.parse_produce_ack(frames)
        if ack is None or ack.message_id in results:
            raise ClientError(
                f"an answer that is not a pzq ack ({len(frames)} frame(s): "
                f"{b' '.join(f[:20] for f in frames[:4])!r}): is a pzq server at this endpoint?"
            )
        results[ack.message_id] = ProduceResult(ack.message_id, ack.ok, ack.error)


class Consumer:
    """A ROUTER consumer that connects and waits, as PZQ consumers do."""

    def __init__(self, endpoint: str, *, ctx: zmq.Context | None = None, curve: Curve | None = None):
        self.sock = connect(zmq.ROUTER, endpoint, ctx=ctx, curve=curve)

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def receive(self, timeout_ms: int | None = None, *, timeout_s: float | None = None) -> Delivery | None:
        """The next delivery, or None if none came within ``timeout_s`` (10 s). A number in the first
        place is the deprecated ``timeout_ms`` (still milliseconds, with a DeprecationWarning: never
        read again as seconds)."""
        frames = receive(self.sock, wait_ms(timeout_seconds(timeout_s, timeout_ms, 10.0)))
        if frames is None:
            return None
        routed = wire.parse_routed_delivery(frames)
        if routed is None:
            raise ClientError(f"malformed delivery of {len(frames)} frames: is a pzq server at this endpoint?")
        peer, delivered = routed
        return Delivery(peer, delivered.key, delivered.sent_us, delivered.ack_timeout_us, delivered.body)

    def ack(self, delivery: Delivery) -> None:
        self.sock.send_multipart([delivery.peer, *wire.consumer_ack(delivery.key)])

    def nack(self, delivery: Delivery) -> None:
        self.sock.send_multipart([delivery.peer, *wire.consumer_ack(delivery.key, ok=False)])


def monitor_request(
    endpoint: str,
    request: str = "MONITOR",
    *,
    timeout_s: float | None = None,
    ctx: zmq.Context | None = None,
    curve: Curve | None = None,
    timeout_ms: int | None = None,
) -> str:
    """Send one monitor request and return the reply text; ClientError if no reply within ``timeout_s``
    (5 s; ``timeout_ms`` is its deprecated alias)."""
    wait = timeout_seconds(timeout_s, timeout_ms, 5.0)
    sock = connect(zmq.REQ, endpoint, ctx=ctx, curve=curve)
    try:
        sock.send_string(request)
        frames = receive(sock, wait_ms(wait))
        if frames is None:
            raise NoMessage(no_answer(endpoint, wait))
        return frames[0].decode("utf-8", "replace")
    finally:
        sock.close(linger=0)


def no_answer(endpoint: str, timeout_s: float) -> str:
    """What to say when no monitor answered: the endpoint, the wait, and (for an ipc:// path that is
    not there) that nothing has ever listened at it. A `pzq` command (reach.impatient) got here connected
    and handshaken, else its socket monitor said so: the server is there and did not answer."""
    if reach.patience() is not None:
        return f"no answer from pzq at {endpoint} within {format_duration(timeout_s)}, though connected: is it stuck?"
    text = f"no answer from pzq at {endpoint} within {format_duration(timeout_s)}: is it running?"
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""
    if path and not os.path.exists(path):
        text += f" (there is no socket file {path})"
    return text


def stats(
    endpoint: str, *, timeout_s: float | None = None, curve: Curve | None = None, timeout_ms: int | None = None
) -> dict:
    """The server's figures as a dict (the STATS request), within ``timeout_s`` (5 s; ``timeout_ms`` is its
    deprecated alias)."""
    text = monitor_request(endpoint, "STATS", timeout_s=timeout_seconds(timeout_s, timeout_ms, 5.0), curve=curve)
    if text.startswith("error:"):
        raise ClientError(text.strip())
    figures = monitor_json(endpoint, text)
    if (
        not isinstance(figures, dict)
        or not isinstance(figures.get("queues"), dict)
        or not all(isinstance(figures.get(name), int) for name in PZQ_FIELDS)
        or not all(isinstance(q, dict) for q in figures["queues"].values())
    ):
        raise ClientError(f"the answer from {endpoint} is not pzq's figures: is a pzq monitor there?")
    return figures


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
