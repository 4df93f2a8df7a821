"""A native producer's batches (PZQ-BATCH/1, docs/native-batch.md), for ``pzq.clients.native.Producer``.

The producer probes the server once; a server that does not speak batches gets one message per ZeroMQ
message, as before. Otherwise messages go out packed into batches within the server's caps, ``window``
batches in flight. A batch's ack says how many of its messages, from the first, were stored: when some
but not all were, the rest goes again as a new batch (as long as each try stores something); an ack that
does not come within the timeout has its batch sent again with the same id, which the server stores once.
A batch (or a lone message) answered "busy" (stored nothing: it waited behind its producer's held big
one) goes again, with a new id, once another answer came.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence

import zmq

from pzq.clients.sockets import receive
from pzq.config import format_duration
from pzq.errors import ClientError, NoMessage
from pzq.protocols import native as legacy
from pzq.protocols import native_batch as wire

Result = tuple[bytes, bool, str]  # (message id, stored, error)
# A batch bigger than what is left of a server's turn is held there, and the batches its producer sent
# after it wait behind it; past the producer's share of what may wait (16 MiB) they are answered "busy",
# nothing stored: they go again once another answer came (the held one moved on), this many times at most
BUSY_TRIES = 64
ID_RANDOM_BYTES = 16  # of every batch id, before its counter


@dataclasses.dataclass
class _Pending:
    """A batch (or a lone legacy message) waiting for its answer."""

    first: int  # index of its first message in the caller's order
    bodies: list[Sequence[bytes]]
    batch: bool
    resent: bool = False
    busy: int = 0  # times the server answered it "busy" (nothing stored: it goes again)


class BatchSender:
    """Sends runs of messages on a producer's DEALER as batches; ``caps`` is None until ``probe``."""

    def __init__(self, sock: zmq.Socket, timeout_ms: int):  # (internal: the Producer's timeout_s, in ms)
        self.sock = sock
        self.timeout_ms = timeout_ms
        # 16 random bytes per producer: without CURVE every producer's ids share one namespace on the server,
        # so they must not meet another producer's (docs/native-batch.md, "Batch ids: whose they are")
        self.prefix = os.urandom(ID_RANDOM_BYTES).hex().encode()
        self._counter = 0
        self.probed = False
        self.caps: wire.Caps | None = None
        self.resent = 0  # batches sent again after a lost ack
        self.busy_resent = 0  # batches (and lone messages) sent again after a "busy"
        self._busy: list[_Pending] = []  # answered "busy": sent again once another answer came
        self.answered = False  # an answer other than "busy" came since the busy ones were last sent
        self.sent_batches = 0

    def _next_id(self, kind: bytes) -> bytes:
        self._counter += 1
        return b"%s-%s%d" % (self.prefix, kind, self._counter)

    def probe(self) -> wire.Caps | None:
        """Ask the server once whether it speaks PZQ-BATCH/1: its caps, or None (an old server)."""
        if self.probed:
            return self.caps
        probe_id = self._next_id(b"p")
        self.sock.send_multipart(wire.probe(probe_id))
        while True:
            frames = receive(self.sock, self.timeout_ms)
            if frames is None:
                raise NoMessage(
                    f"no ack from the server within {format_duration(self.timeout_ms / 1000)} (to the batch probe)"
                )
            if legacy.answered_id(frames) == probe_id:
                break  # (anything else is a late answer to an earlier call: nobody waits for it)
        self.probed = True
        self.caps = wire.parse_probe_answer(frames)
        return self.caps

    def send(self, bodies: Iterable[Sequence[bytes]], *, batch: int, window: int) -> list[Result]:
        """Send every body in batches of at most ``batch`` messages, ``window`` batches in flight; the
        results in the order of ``bodies``. ``probe`` must have found the server's caps."""
        caps = self.caps
        if caps is None:
            raise ClientError("the server does not speak PZQ-BATCH/1: probe first and send one by one")
        per = max(1, min(batch, caps.max_messages))
        room = caps.max_bytes - 16  # (the array's own header)
        results: list[Result | None] = []
        pending: dict[bytes, _Pending] = {}
        chunk: list[Sequence[bytes]] = []
        size = frames = 0
        for body in bodies:
            need, parts = wire.encoded_size(body), len(body)
            # Too big for any batch (or for the server: then it alone is refused): alone, the legacy way
            if need > room or parts > caps.max_frames or sum(map(len, body)) > caps.max_message_size:
                self._flush(chunk, results, pending, window)
                chunk, size, frames = [], 0, 0
                self._wait(pending, results, window)
                mid = self._next_id(b"m")
                pending[mid] = _Pending(len(results), [body], batch=False)
                results.append(None)
                self.sock.send_multipart(legacy.produce(mid, body))
                continue
            if chunk and (len(chunk) >= per or size + need > room or frames + parts > caps.max_frames):
                self._flush(chunk, results, pending, window)
                chunk, size, frames = [], 0, 0
            chunk.append(body)
            size, frames = size + need, frames + parts
        self._flush(chunk, results, pending, window)
        while pending or self._busy:
            self._collect(pending, results)
        return [r for r in results if r is not None]

    def _flush(
        self, chunk: list[Sequence[bytes]], results: list[Result | None], pending: dict[bytes, _Pending], window: int
    ) -> None:
        if not chunk:
            return
        self._wait(pending, results, window)
        first = len(results)
        results.extend([None] * len(chunk))
        self._send_batch(_Pending(first, chunk, batch=True), pending)

    def _send_batch(self, entry: _Pending, pending: dict[bytes, _Pending]) -> None:
        batch_id = self._next_id(b"b")
        pending[batch_id] = entry
        self.sent_batches += 1
        self.sock.send_multipart(wire.batch(batch_id, entry.bodies))

    def _wait(self, pending: dict[bytes, _Pending], results: list[Result | None], window: int) -> None:
        while len(pending) >= max(1, window):
            self._collect(pending, results)

    def _collect(self, pending: dict[bytes, _Pending], results: list[Result | None]) -> None:
        """Read one answer. None in time: every batch waiting is sent again with its id, once."""
        # (another answer came since, or none is awaited: the server moved on, the busy ones go again)
        if self._busy and (self.answered or not pending):
            self._again(pending)
        frames = receive(self.sock, self.timeout_ms)
        if frames is None:
            again = [(bid, e) for bid, e in pending.items() if e.batch and not e.resent]
            if not again:
                raise NoMessage(f"no ack from the server within {format_duration(self.timeout_ms / 1000)}")
            for batch_id, waiting in again:  # (the server stores a batch id once: a resend is safe)
                waiting.resent = True
                self.resent += 1
                self.sock.send_multipart(wire.batch(batch_id, waiting.bodies))
            return
        answered = legacy.answered_id(frames)
        entry = None if answered is None else pending.pop(answered, None)
        if entry is None or answered is None:
            return  # an answer nobody waits for: the first ack of a batch that was resent, or a probe's
        self.answered = True  # (unless it is a "busy": see _busy_again)
        if not entry.batch:
            ack = legacy.parse_produce_ack(frames)
            if ack is None:
                raise ClientError(f"an answer that is not a pzq ack ({len(frames)} frame(s)): is a pzq server there?")
            if not ack.ok and self._busy_again(entry, ack.error, pending):
                return
            results[entry.first] = (answered, ack.ok, ack.error)
            return
        answer = wire.parse_batch_ack(frames)
        if answer is None:
            raise ClientError(f"an answer that is not a batch ack ({len(frames)} frame(s)): is a pzq server there?")
        stored = max(0, min(answer.stored, len(entry.bodies)))
        for i in range(stored):
            results[entry.first + i] = (b"%s:%d" % (answered, i), True, "")
        if stored == len(entry.bodies):
            return
        if stored > 0:  # some went in: the rest again, as a new batch (a new id: it is other messages)
            self._send_batch(_Pending(entry.first + stored, entry.bodies[stored:], batch=True), pending)
            return
        if self._busy_again(entry, answer.error, pending):
            return
        for i in range(len(entry.bodies)):
            results[entry.first + i] = (b"%s:%d" % (answered, i), False, answer.error)

    def _busy_again(self, entry: _Pending, error: str, pending: dict[bytes, _Pending]) -> bool:
        """True when ``entry`` was answered "busy" (nothing stored) and goes again later."""
        if not error.startswith(legacy.BUSY[:5]) or entry.busy >= BUSY_TRIES:
            return False
        entry.busy += 1
        self._busy.append(entry)
        self.answered = False
        return True

    def _again(self, pending: dict[bytes, _Pending]) -> None:
        """Send the entries answered "busy" again (new ids: a busy one stored nothing)."""
        again, self._busy, self.answered = self._busy, [], False
        for entry in again:
            self.busy_resent += 1
            if entry.batch:
                self._send_batch(entry, pending)
            else:
                mid = self._next_id(b"m")
                pending[mid] = entry
                self.sock.send_multipart(legacy.produce(mid, entry.bodies[0]))
