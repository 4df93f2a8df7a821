"""The broker's part that stores what producers send: one message, a run, a big body in parts.

Every producer is refused while the server's memory alarm is up (``BrokerState.refusing``): consumers
and acks go on, so that memory drains. A refusal for room is counted (``refused_full``); what is stored
raises readiness (rule 9 in state.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pzq.broker.state import BrokerState
from pzq.errors import StoreFull
from pzq.store import Message, Upload


class Producing:
    """The Broker's producing: messages stored, durable at the next commit."""

    def __init__(self, state: BrokerState):
        self._s, self._store, self._counters, self._count = state, state.store, state.counters, state.count

    def produce(
        self, queue: str, body: Sequence[bytes] | Upload, *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Store a message (durable at the next commit). Raises StoreFull when there is no room. A body
        ``begin_big`` began and ``write_big`` wrote in full is an ``Upload`` (``produce_big``)."""
        if isinstance(body, Upload):
            return self.produce_big(queue, body, now_us=now_us, expires_us=expires_us, meta=meta)
        try:
            if self._s.refusing is not None:
                raise StoreFull(self._s.refusing)
            message = self._store.put(queue, body, now_us=now_us, expires_us=expires_us, meta=meta)
        except StoreFull:
            self._counters.refused_full += 1
            raise
        self._counters.produced += 1
        self._s.readiness += 1
        self._count(queue, "produced")
        return message

    def produce_many(
        self, queue: str, bodies: Sequence[Sequence[bytes]] | Sequence[bytes], *, now_us: int, encoded: bool = False
    ) -> int:
        """Store messages in one go (see Store.put_many; ``encoded``: each message is the msgpack array
        of its frames, as a batch carries it: Store.put_encoded): how many, from the first, were stored;
        the rest were refused for room."""
        store = self._store.put_encoded if encoded else self._store.put_many
        try:
            stored = 0 if self._s.refusing is not None else store(queue, bodies, now_us=now_us)  # type: ignore[arg-type]
        except StoreFull:
            stored = 0
        self._counters.refused_full += len(bodies) - stored
        if stored:
            self._counters.produced += stored
            self._s.readiness += 1
            self._count(queue, "produced", stored)
        return stored

    # A big body is written a part per turn (store/bodies.py): begun, written, then produced as a message
    # in the turn of its last part; dropped when its producer is answered otherwise.

    def begin_big(self, body: Sequence[bytes | bytearray | memoryview], chunk: int) -> Upload:
        """A big body to write in parts of ``chunk`` bytes. Raises StoreFull (counted) when refused."""
        try:
            if self._s.refusing is not None:
                raise StoreFull(self._s.refusing)
            return self._store.bodies.begin(body, chunk)
        except StoreFull:
            self._counters.refused_full += 1
            raise

    def write_big(self, upload: Upload, most: int) -> int:
        """Write the next parts of ``upload`` (about ``most`` bytes); StoreFull (counted) when the store filled."""
        try:
            return self._store.bodies.write(upload, most)
        except StoreFull:
            self._counters.refused_full += 1
            raise

    def produce_big(
        self, queue: str, upload: Upload, *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Store the message whose body ``upload`` wrote in full (durable at the next commit)."""
        message = self._store.put_body(queue, upload, now_us=now_us, expires_us=expires_us, meta=meta)
        self._counters.produced += 1
        self._s.readiness += 1
        self._count(queue, "produced")
        return message

    def drop_big(self, upload: Upload) -> None:
        """Give up a body not yet produced: its parts are removed."""
        self._store.bodies.drop(upload)

    def check_room(self, size: int, *, producing: bool = False) -> None:
        """Raise StoreFull unless ``size`` more bytes fit (a gateway's side record, or a message it will
        write in slices, checked before anything changes); ``producing``: also while every producer is
        refused (the memory alarm)."""
        if producing and self._s.refusing is not None:
            raise StoreFull(self._s.refusing)
        self._store.check_room(size)
