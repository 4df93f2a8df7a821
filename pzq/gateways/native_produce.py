"""The native producers' side of the native gateway: what producers send on the receive socket, stored
in runs (``produce_many``: a run of messages in one call, acknowledged in the order they came, a rejected
message answered in its place), a batched frame in its place (gateways/native_batches.py), a big message a
part per turn (``received_big``), and every producer of a run that failed told so (``rolled_back``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pzq.errors import StoreFull
from pzq.gateways.contract import BrokerSurface, Send
from pzq.gateways.native_batches import Batches
from pzq.logs import warn_bad
from pzq.protocols import native
from pzq.protocols.native import plain_body
from pzq.protocols.native_batch import is_batch
from pzq.store import Upload

RECEIVE = "receive"  # producers: the server's ROUTER


class Producers:
    """Stores what producers send into ``queue`` and answers them after the commit."""

    def __init__(self, broker: BrokerSurface, queue: str, batches: Batches, *, max_message_size: int):
        self.broker = broker
        self.queue = queue
        self.batches = batches
        self.max_message_size = max_message_size
        self._owed: list[Send] = []  # answers of a run whose store call failed, for rolled_back
        # A big message being written a part per turn (received_big), and (routing, message id) of it
        self._upload: Upload | None = None
        self._uploader: tuple[bytes, bytes] = (b"", b"")
        self.big_written = 0  # bytes of its body the last received_big call wrote

    def received(self, messages: Sequence[list[bytes]], now_us: int) -> list[Send]:
        """A run of producers' messages: their answers, in order. Raises StoreError when the store failed
        (``rolled_back`` then answers every producer of the run)."""
        out: list[Send] = []
        waiting: list[tuple[bytes, bytes]] = []  # (routing, message id) of the messages not yet stored
        bodies: list[list[bytes]] = []
        limit = self.max_message_size
        at = 0  # the message being looked at
        try:
            for at in range(len(messages)):
                frames = messages[at]
                if is_batch(frames):  # a batch (or a probe): in its place
                    self._store(waiting, bodies, out, now_us)
                    out.append(self.batches.received(frames, now_us))
                    continue
                body = plain_body(frames, limit)  # (the usual shape; anything else through parse_produce)
                if body is not None:
                    waiting.append((frames[0], frames[1]))
                    bodies.append(body)
                    continue
                event = native.parse_produce(frames, limit)
                if event is None:
                    continue  # (no id frame: there is no one to answer)
                if isinstance(event, native.Rejected):
                    self._store(waiting, bodies, out, now_us)  # (acks keep the order of the messages)
                    warn_bad("producer", event.error.code, event.error.detail)
                    out.append(Send(RECEIVE, native.refusal(event)))
                    continue
                waiting.append((event.routing, event.message_id))
                bodies.append(event.body)
            at = len(messages)
            self._store(waiting, bodies, out, now_us)
        except Exception:  # noqa: BLE001 - a StoreError, or a bug: the loop rolls the turn back either way
            # Every producer of the run hears so, in order, those whose messages were not looked at yet
            # too (they were read off the socket: nobody else will answer them).
            self._owed = [
                *out,
                *(failed(routing, mid) for routing, mid in waiting),
                *self._all_failed(messages[at:], limit),
            ]
            raise
        return out

    def _store(
        self, waiting: list[tuple[bytes, bytes]], bodies: list[list[bytes]], out: list[Send], now_us: int
    ) -> None:
        """Store the run read so far in one call and append its acks to ``out``; those past the store
        limit are answered "queue full"."""
        if not waiting:
            return
        stored = self.broker.produce_many(self.queue, bodies, now_us=now_us)
        if stored == len(waiting):  # (the usual case: produce_ack's frames for "stored", a call less each)
            make = Send._make
            out += [make((RECEIVE, [routing, message_id, b"1", b""], None, False)) for routing, message_id in waiting]
            waiting.clear()
            bodies.clear()
            return
        for i, (routing, message_id) in enumerate(waiting):
            error = None if i < stored else native.QUEUE_FULL
            out.append(Send(RECEIVE, native.produce_ack(routing, message_id, error)))
        waiting.clear()
        bodies.clear()

    def received_big(self, frames: list[bytes], *, chunk: int, most: int, now_us: int) -> list[Send] | None:
        """A big message from the receive socket, written a part per call (one call a turn): its body in
        chunks of ``chunk`` bytes, about ``most`` bytes a call (``big_written`` says how many this call
        wrote). None while parts remain: call again with the same frames next turn. Its answer once it
        is stored (in the call of its last part, so the ack follows the commit that stored all of it),
        or refused. Raises StoreError when the store failed (``rolled_back`` answers it)."""
        self.big_written = 0
        upload = self._upload
        if upload is None:
            event = native.parse_produce(frames, self.max_message_size)
            if event is None:
                return []
            if isinstance(event, native.Rejected):
                warn_bad("producer", event.error.code, event.error.detail)
                return [Send(RECEIVE, native.refusal(event))]
            self._uploader = (event.routing, event.message_id)
            try:
                upload = self.broker.begin_big(event.body, chunk)
            except StoreFull:
                return [Send(RECEIVE, native.produce_ack(*self._uploader, native.QUEUE_FULL))]
            except Exception:  # noqa: BLE001 - a StoreError, or a bug: the loop rolls the turn back either way
                self._owed = [failed(*self._uploader)]
                raise
            self._upload = upload
        try:
            self.big_written = self.broker.write_big(upload, most)
            if not upload.done:
                return None
            self.broker.produce(self.queue, upload, now_us=now_us)
        except StoreFull:
            self._upload = None
            self.broker.drop_big(upload)
            return [Send(RECEIVE, native.produce_ack(*self._uploader, native.QUEUE_FULL))]
        except Exception:  # noqa: BLE001 - as above
            self._upload = None
            self._owed = [failed(*self._uploader)]
            raise
        self._upload = None
        return [Send(RECEIVE, native.produce_ack(*self._uploader, None))]

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        """The commit failed: a producer's "stored" becomes "store failure", errors stay, deliveries
        (of a state that is gone) are dropped."""
        out = []
        if self._upload is not None:  # (its parts of earlier turns are dropped by the store)
            self._upload = None
            self._owed.append(failed(*self._uploader))
        for send in [*sends, *self._owed]:
            if send.socket != RECEIVE:
                continue
            if send.token is not None:  # a batch's answer
                out.append(self.batches.rolled_back(send))
                continue
            stored = native.stored_ack(send.frames)
            out.append(send if stored is None else failed(*stored))
        self._owed = []
        return out

    def _all_failed(self, messages: Sequence[list[bytes]], limit: int) -> list[Send]:
        """The answers to producers' messages of a turn that failed before they were stored."""
        return [send for frames in messages if (send := self._failed_one(frames, limit)) is not None]

    def _failed_one(self, frames: list[bytes], limit: int) -> Send | None:
        if is_batch(frames):
            return self.batches.failed(frames)
        event = native.parse_produce(frames, limit)
        if isinstance(event, native.Rejected):
            return Send(RECEIVE, native.refusal(event))
        return None if event is None else failed(event.routing, event.message_id)


def failed(routing: bytes, message_id: bytes) -> Send:
    return Send(RECEIVE, native.produce_ack(routing, message_id, native.STORE_FAILED))
