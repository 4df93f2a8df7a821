"""An MQKS publish carried out in slices: its data checked to be UTF-8 and copied into each queue bound
to its event, a slice of bytes at a time, its answer after the commit of its last copy.

A publish of 1 MiB to an event 100 queues are bound to had written 100 MiB in one turn (every client
waited 1.7 s), and one 15 MiB message was one 15 MiB record in one commit. Now a publish whose copies do
not fit what the turn has left is a ``Publish``: the connection's turn (mqks_lines.py) runs its next
slice, ``STEP_BYTES`` of copies or one part of a big body, and charges its time to that connection like
a line; its later lines wait behind it, in order. A copy past ``Limits.body_chunk_bytes`` is written in
parts, ``body_chunk_bytes`` each (store/bodies.py, as native big messages), its record in the turn of its
last part. It goes on if its connection closes (its client sent all of it).

A publish is refused before it starts when the store has no room for all its copies; one that a full
store (or the memory alarm) stops midway stays in the queues it reached (each copy is a message of its
own, durable with its turn), and its client is answered ``error``.
"""

from __future__ import annotations

import codecs

from pzq.config import Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import BrokerSurface, Budget
from pzq.store import Upload

STEP_BYTES = 256 << 10  # copies (or text checked) in one slice of a connection's turn, beyond its first


class Publish:
    """One publish's copies, written a slice at a time (``step``)."""

    def __init__(
        self,
        broker: BrokerSurface,
        limits: Limits,
        *,
        request_id: str,
        event: str,
        data: bytes | memoryview,
        queues: list[str],
        confirm: bool,
        text_checked: bool,
    ):
        self.broker = broker
        self.chunk = limits.body_chunk_bytes
        self.request_id = request_id
        self.confirm = confirm
        self.data = data
        self.queues = queues
        self.meta = {"mqks": [request_id, event]}
        self._next = 0  # the next queue to copy to
        self._upload: Upload | None = None  # its copy being written in parts
        self._checked = len(data) if text_checked else 0  # bytes found to be UTF-8 so far
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.wrote = False  # a copy or a part was written this step (the turn must commit)

    @property
    def held_bytes(self) -> int:
        """Bytes of its line it holds (its connection's input until it is done)."""
        return len(self.data)

    def step(self, budget: Budget, now_us: int) -> bool:
        """The next slice; True once every copy is stored. ProtocolError when the data is not UTF-8
        (found before anything is stored), StoreFull when the store refused a copy (those before stay)."""
        self.wrote = False
        done = 0
        size = len(self.data)
        while self._checked < size:  # (text first: nothing is stored of a line that is not)
            if done >= STEP_BYTES or done and budget.spent():
                return False
            end = min(size, self._checked + STEP_BYTES)
            try:
                self._decoder.decode(self.data[self._checked : end], end == size)
            except UnicodeDecodeError:
                raise ProtocolError("bad-utf8", "the line is not UTF-8") from None
            done += end - self._checked
            self._checked = end
        while self._next < len(self.queues):
            if done >= STEP_BYTES or done and budget.spent():
                return False
            queue = self.queues[self._next]
            if size <= self.chunk:
                self.broker.produce(queue, [bytes(self.data)], now_us=now_us, meta=self.meta)
                written = size
                self._next += 1
            else:
                written = self._part(queue, budget, now_us)
            self.wrote = True
            budget.take(written, records=1)
            done += max(written, 1)
        return True

    def _part(self, queue: str, budget: Budget, now_us: int) -> int:
        """The next part of the copy to ``queue`` (its record with its last part); the bytes written."""
        try:
            if self._upload is None:
                self._upload = self.broker.begin_big([self.data], self.chunk)
            upload = self._upload
            written = self.broker.write_big(upload, max(min(budget.bytes_left, STEP_BYTES), 0))
            if upload.done:
                self.broker.produce(queue, upload, now_us=now_us, meta=self.meta)
                self._upload = None
                self._next += 1
            return written
        except StoreFull:
            if self._upload is not None:
                self.broker.drop_big(self._upload)
                self._upload = None
            raise

    def stored(self) -> int:
        """Copies stored so far (a refusal's log line says how far it got)."""
        return self._next

    def lost(self) -> None:
        """The turn was rolled back: the store gave up the copy being written (store/bodies.py)."""
        self._upload = None
