"""Big bodies written in chunks over several turns: a message past ``Limits.body_chunk_bytes`` is
stored as chunks in the ``bodies`` table, a part per turn, and its record (written in the turn of the
last chunk, so the producer's ack still follows the commit that stored all of it) names them.

Why: one 16 MiB record is one 16 MiB commit, and every client of that turn waits for its fsync. In
chunks, each turn's commit stays under the turn's byte budget, and other clients' work goes between.

A chunked record is told apart by its length alone (its first byte): a message record of five fields
``[enqueued_us, expires_us, [], meta or nil, ref]``, a dead letter of eight; ``ref`` is
``[body id, chunks, [frame sizes]]``. The body id is the store's own (meta ``next_body``), so a record
that moves (to the dead letters, to the end of its queue) keeps its chunks. A body being written is
listed in ``uploads`` until its record is: what a crash leaves there is removed at start-up, what a
rolled-back turn leaves, by the next commit.

``Bodies`` is a part the store holds (``store.bodies``), handed the core: it writes the next body id
and removes abandoned chunks before each commit, and gives up the bodies being written when a turn is
rolled back.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Sequence
from typing import NamedTuple

import msgpack

from pzq.errors import StoreFull
from pzq.store.core import Core
from pzq.store.layout import OVERHEAD, U64, whole

log = logging.getLogger("pzq.store")

BODY_KEY = struct.Struct(">QI")  # body id, chunk index
CHUNKED_MESSAGE = 0x95  # msgpack fixarray of 5: a message record whose body is in chunks
CHUNKED_DEAD = 0x98  # fixarray of 8: such a dead letter
REF_RECORD_MAX = 1 << 16  # a chunked record is small (its meta aside): past this, no unpack to look


class BodyRef(NamedTuple):
    """Where a chunked body is: its id, how many chunks, and its frames' sizes (their sum is its size)."""

    body_id: int
    chunks: int
    sizes: tuple[int, ...]

    def packed(self) -> list:
        return [self.body_id, self.chunks, list(self.sizes)]

    @classmethod
    def read(cls, value: object) -> BodyRef:
        """A ref from its record field; ValueError (an unreadable record) if it is not one."""
        if type(value) is not list or len(value) != 3 or type(value[2]) is not list:
            raise ValueError("not a body ref")
        sizes = tuple(whole(s, "frame size") for s in value[2])
        return cls(whole(value[0], "body id"), whole(value[1], "chunks", 1, 1 << 31), sizes)

    @property
    def accounted(self) -> int:
        """Bytes its chunks count toward the store limit."""
        return sum(self.sizes) + self.chunks * (BODY_KEY.size + OVERHEAD)


@dataclasses.dataclass(eq=False)
class Upload:
    """A body being written, a part per turn: ``written`` chunks so far, ``committed`` of them durable."""

    ref: BodyRef
    data: memoryview  # the body's frames joined
    chunk: int  # bytes a chunk
    written: int = 0
    committed: int = 0

    @property
    def done(self) -> bool:
        return self.written >= self.ref.chunks

    def chunk_bytes(self, index: int) -> int:
        return min(self.chunk, len(self.data) - index * self.chunk)


def ref_of(value: bytes | memoryview, dead: bool = False) -> BodyRef | None:
    """The body ref of a stored record, None when its body is inline (a look at its first byte)."""
    if not value or value[0] != (CHUNKED_DEAD if dead else CHUNKED_MESSAGE) or len(value) > REF_RECORD_MAX:
        return None
    try:
        return BodyRef.read(msgpack.unpackb(value)[-1])
    except (ValueError, TypeError, IndexError, msgpack.UnpackException):
        return None


class Bodies:
    """The chunks of big bodies (see the module's text)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.env = core.env
        self._meta_db = core.env.dbs["meta"]
        self._bodies_db, self._uploads_db = self.env.dbs.get("bodies"), self.env.dbs.get("uploads")
        self._uploads: dict[int, Upload] = {}  # bodies being written, by id
        self._abandoned: list[Upload] = []  # of a rolled-back turn: their committed chunks go next commit
        self._next_dirty = False  # the next body id waits for a commit
        with self.env.reading() as txn:
            raw = txn.get(b"next_body", db=self._meta_db)
        self._next_body = U64.unpack(raw)[0] if raw and len(raw) == U64.size else 1
        core.before_commit.append(self._before_commit)
        core.after_commit.append(self._uploads_committed)
        self.env.on_abort.append(self._uploads_rolled_back)
        if not self.env.readonly and self._uploads_db is not None:
            self._sweep_uploads()

    def _before_commit(self) -> None:
        if self._abandoned:
            self._remove_abandoned()
        if self._next_dirty:
            self.env.do(self.env.write().put, b"next_body", U64.pack(self._next_body), db=self._meta_db)
            self._next_dirty = False

    def _sweep_uploads(self) -> None:
        """Remove the chunks of bodies a crash left half written (their records were never stored)."""
        txn = self.env.write()
        left = [(U64.unpack(k)[0], v) for k, v in txn.cursor(db=self._uploads_db)]
        for body_id, raw in left:
            try:
                chunks = whole(msgpack.unpackb(raw), "chunks", 0, 1 << 31)
            except (ValueError, TypeError, msgpack.UnpackException):
                chunks = 1 << 12  # (a damaged row: the most chunks a body of --max-message-size has)
            for index in range(chunks):
                self.env.do(txn.delete, BODY_KEY.pack(body_id, index), db=self._bodies_db)
            self.env.do(txn.delete, U64.pack(body_id), db=self._uploads_db)
        if left:
            self.core.wrote()
            log.warning("removed the chunks of %d big message(s) a stop left half written (never acked)", len(left))
            self.core.commit()
        else:
            self.env.end_clean()

    # -- writing -----------------------------------------------------------------------------------

    def begin(self, frames: Sequence[bytes | bytearray | memoryview], chunk: int) -> Upload:
        """A body to write in chunks of ``chunk`` bytes (``write`` writes them, a part per turn).
        Raises StoreFull, writing nothing, when it would not fit."""
        sizes = tuple(len(f) for f in frames)
        total = sum(sizes)
        chunks = max(1, -(-total // chunk))
        ref = BodyRef(self._next_body, chunks, sizes)
        self.core.check_room(ref.accounted + 256)
        data = memoryview(frames[0] if len(frames) == 1 else b"".join(frames)).cast("B")
        upload = Upload(ref, data, chunk)
        self._next_body += 1
        self._next_dirty = True
        self.core.wrote()
        self.env.do(self.env.write().put, U64.pack(ref.body_id), msgpack.packb(chunks), db=self._uploads_db)
        self._uploads[ref.body_id] = upload
        return upload

    def write(self, upload: Upload, most: int) -> int:
        """Write the next chunks of ``upload``, at least one and no more than ``most`` bytes past the
        first; returns the bytes written. Raises StoreFull when the store filled meanwhile (the upload
        is then abandoned: ``drop``)."""
        if upload.ref.body_id not in self._uploads:
            raise StoreFull("queue full: the message's earlier parts were lost with a failed turn")
        txn, written = self.env.write(), 0
        while not upload.done and (written == 0 or written + upload.chunk_bytes(upload.written) <= most):
            size = upload.chunk_bytes(upload.written)
            self.core.check_room(size + BODY_KEY.size + OVERHEAD)
            start = upload.written * upload.chunk
            key = BODY_KEY.pack(upload.ref.body_id, upload.written)
            self.env.do(txn.put, key, upload.data[start : start + size], db=self._bodies_db)
            self.core.charge(size + BODY_KEY.size + OVERHEAD)  # (the queue's own count takes it at the end)
            upload.written += 1
            written += size
        self.core.wrote()
        return written

    def drop(self, upload: Upload) -> None:
        """Give up a body before its record was written: its chunks go (in the open transaction)."""
        if self._uploads.pop(upload.ref.body_id, None) is not None:
            self._remove_chunks(upload, upload.written)

    def finish(self, upload: Upload) -> BodyRef:
        """Its record is being written in this transaction: it is no longer being uploaded."""
        del self._uploads[upload.ref.body_id]
        self.env.do(self.env.write().delete, U64.pack(upload.ref.body_id), db=self._uploads_db)
        self.core.charge(-upload.ref.accounted)  # (the queue's count takes it now)
        return upload.ref

    def _remove_chunks(self, upload: Upload, chunks: int) -> None:
        txn = self.env.write()
        for index in range(chunks):
            self.env.do(txn.delete, BODY_KEY.pack(upload.ref.body_id, index), db=self._bodies_db)
            self.core.charge(-(upload.chunk_bytes(index) + BODY_KEY.size + OVERHEAD))
        self.env.do(txn.delete, U64.pack(upload.ref.body_id), db=self._uploads_db)
        self.core.wrote()

    def _uploads_committed(self) -> None:
        for upload in self._uploads.values():
            upload.committed = upload.written
        self._abandoned.clear()

    def _uploads_rolled_back(self) -> None:
        """Every body being written is given up (its producer hears "store failure"); what earlier turns
        committed of them is still on disk, counted, and goes with the next commit."""
        self._abandoned += self._uploads.values()
        self._uploads.clear()
        self._next_dirty = False  # (ids handed out in the turn stay unused: the next begin writes past them)
        for upload in self._abandoned:
            upload.written = upload.committed
            self.core.charge(sum(upload.chunk_bytes(i) + BODY_KEY.size + OVERHEAD for i in range(upload.committed)))
        if self._abandoned:
            self.core.wrote()

    def _remove_abandoned(self) -> None:
        for upload in self._abandoned:
            self._remove_chunks(upload, upload.committed)

    # -- reading and deleting ----------------------------------------------------------------------

    def frames(self, ref: BodyRef, txn) -> list[bytes]:
        """The frames of a chunked body; ValueError when a chunk is missing. Read in place from the
        committed map and joined (one copy of the body); from ``txn`` (a second copy) only when its
        last part is not committed yet."""
        if self._bodies_db is None:
            raise ValueError("the store has no bodies table")
        keys = [BODY_KEY.pack(ref.body_id, index) for index in range(ref.chunks)]
        with self.env.snapshot() as committed:
            views = [committed.get(key, db=self._bodies_db) for key in keys]
            data = b"".join(views) if None not in views else None
        if data is None:
            parts = [txn.get(key, db=self._bodies_db) for key in keys]
            if None in parts:
                raise ValueError(f"chunk {parts.index(None)} of body {ref.body_id} is missing")
            data = b"".join(parts)
        if len(data) != sum(ref.sizes):
            raise ValueError(f"body {ref.body_id} has {len(data)} bytes, its record says {sum(ref.sizes)}")
        if len(ref.sizes) == 1:
            return [data]
        frames, at = [], 0
        view = memoryview(data)
        for size in ref.sizes:
            frames.append(bytes(view[at : at + size]))
            at += size
        return frames

    def head(self, ref: BodyRef, head_bytes: int) -> bytes:
        """The first ``head_bytes`` of a chunked body (its first chunk only), b"" if it cannot be read."""
        if self._bodies_db is None:
            return b""
        with self.env.snapshot() as txn:
            chunk = txn.get(BODY_KEY.pack(ref.body_id, 0), db=self._bodies_db)
            return b"" if chunk is None else bytes(chunk[:head_bytes])

    def delete(self, ref: BodyRef) -> int:
        """Remove a stored body's chunks for good (its record went); returns the bytes it counted."""
        txn = self.env.write()
        for index in range(ref.chunks):
            self.env.do(txn.delete, BODY_KEY.pack(ref.body_id, index), db=self._bodies_db)
        return ref.accounted
