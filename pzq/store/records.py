"""Messages one at a time: put, get, scan; delivery counts (the take bookkeeping, written lazily with a
commit); deletes (acks), requeues. Drawn on the core (``core.py``); the verbs of runs of messages are
``runs.py``'s, and the layout is in ``layout.py``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import msgpack

from pzq.errors import StoreError, StoreFull
from pzq.store.bodies import CHUNKED_DEAD, CHUNKED_MESSAGE, Bodies, BodyRef, Upload, ref_of
from pzq.store.core import Core
from pzq.store.environment import KeyExists, LmdbError, raise_
from pzq.store.layout import KEY, U32, U64, Message, QueueInfo, accounted, message_id

log = logging.getLogger("pzq.store")
CHUNKED, CHUNKED_TAGS = bytes([CHUNKED_MESSAGE]), (CHUNKED_MESSAGE, CHUNKED_DEAD)  # a chunked record's first byte


class Records(Core):
    """The messages of the queues, one at a time (see the module's text)."""

    bodies: Bodies  # (the store's part, set by the store as it opens: a chunked body's record names it)

    def put(
        self, queue: str, frames: Sequence[bytes], *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Append a message to ``queue``. Raises StoreFull (writing nothing) past the store limit."""
        return self.append(queue, frames, now_us, expires_us, check_limit=True, meta=meta)

    def put_body(
        self, queue: str, upload: Upload, *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Append the message whose body ``upload`` wrote (every chunk of it, in this or earlier turns)
        to ``queue``: its record, in the transaction of the last chunk. Raises StoreFull when the
        queue cannot be made."""
        if not upload.done:
            raise ValueError("the body is not all written")
        # (the upload ends after its record is put: a put that fails leaves it to the rollback, which
        # removes its chunks)
        message = self.append(queue, [], now_us, expires_us, check_limit=False, meta=meta, body=upload.ref)
        self.bodies.finish(upload)
        return message

    def append(
        self,
        queue: str,
        frames: Sequence[bytes],
        enqueued_us: int,
        expires_us: int,
        *,
        check_limit: bool,
        meta: dict | None = None,
        body: tuple | None = None,
    ) -> Message:
        ref = None if body is None else BodyRef(*body)
        if ref is not None:  # (a chunked body: the record names its chunks, which count with it)
            record = [enqueued_us, expires_us, [], meta or None, ref.packed()]
        else:
            record = [enqueued_us, expires_us, list(frames)]
            if meta:
                record.append(meta)
        value = msgpack.packb(record)
        size = accounted(KEY.pack(0, 0), value) + (ref.accounted if ref is not None else 0)
        if check_limit and self._total_bytes + self._side() + size > self.max_size:
            raise StoreFull(f"queue full: the store holds {self.stored_bytes} of {self.max_size} bytes")
        if check_limit and self.low_disk:
            raise StoreFull(f"queue full: the disk of {self.path} has less than {self.min_disk_free} bytes free")
        info = self._queues.get(queue) or self.queue(queue, implicit=True)
        seq = info.next_seq
        txn = self.env.write()
        try:  # inline rather than through env.do(): this is the hottest write
            fresh = txn.put(KEY.pack(info.qid, seq), value, db=self._messages_db, overwrite=False)
        except LmdbError as exc:
            self.env.do(raise_, exc)
        if not fresh:  # another writer used this seq: storing over it would lose a message someone was acked for
            self.env.do(raise_, KeyExists(f"message {message_id(info.qid, seq)} is already stored"))
        info.next_seq = seq + 1
        self.account(info, 1, size)
        return Message(queue, info.qid, seq, list(frames), enqueued_us, expires_us, 0, meta, ref)

    def _decode_uncounted(self, info: QueueInfo, key: bytes, value: bytes, txn) -> Message | None:
        return self._decode(info, key, value, txn, False)

    def _decode(self, info: QueueInfo, key: bytes, value: bytes, txn, counts: bool = True) -> Message | None:
        """The stored message, or None (noted for ``_set_aside``) when its record cannot be read."""
        try:
            record = msgpack.unpackb(value)
            if (
                type(record) is not list
                or len(record) < 3
                or type(frames := record[2]) is not list  # (one bytes frame, the usual case, checked alone)
                or not (len(frames) == 1 and type(frames[0]) is bytes or all(type(f) is bytes for f in frames))
                or (len(record) > 3 and record[3] is not None and type(record[3]) is not dict)
            ):
                raise ValueError("not a message record")
            body = BodyRef.read(record[4]) if value[0] == CHUNKED_MESSAGE else None
            return Message(
                info.name,
                info.qid,
                KEY.unpack(key)[1],
                record[2] if body is None else self.bodies.frames(body, txn),
                int(record[0]),
                int(record[1]),
                self.deliveries(key, txn) if counts else 0,
                record[3] if len(record) > 3 else None,
                body,
            )
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            self._unreadable.append((info, key, f"{type(exc).__name__}: {exc}"))
            return None

    def read_record(self, info: QueueInfo, key: bytes, value: bytes, txn) -> Message | None:
        """The stored message, or None when its record cannot be read: nothing is set aside (the
        audit of ``pzq check``, which only looks)."""
        message = self._decode(info, key, value, txn)
        self._unreadable.clear()
        return message

    def get(self, queue: str, seq: int) -> Message | None:
        info = self._queues.get(queue)
        if info is None:
            return None
        key = KEY.pack(info.qid, seq)
        with self.env.reading() as txn:
            value = txn.get(key, db=self._messages_db)
            message = None if value is None else self._decode(info, key, value, txn)
        self.set_aside()
        return message

    def scan(
        self, queue: str, from_seq: int = 0, limit: int = 100, max_bytes: int | None = None, counts: bool = True
    ) -> list[Message]:
        """Up to ``limit`` messages of ``queue`` with seq >= ``from_seq``, in FIFO order; with
        ``max_bytes``, no more once their bodies reach it (the first is always read): what a turn
        reads of big bodies is bounded like what it writes. Without ``counts`` their delivery counts
        are not read (0: a group's fetch, whose lease record has them)."""
        decode = self._decode if counts else self._decode_uncounted
        while True:
            damaged = self.damaged_total
            found = self.walk(self._messages_db, queue, from_seq, limit, decode, max_bytes)
            messages = [m for m in found if m is not None]
            self.set_aside()
            if self.damaged_total == damaged or len(messages) >= limit:
                return messages  # (else read again: what was set aside is gone, more may follow it)

    def walk(self, db, queue: str, from_seq: int, limit: int, decode, max_bytes: int | None = None) -> Iterator:
        info = self._queues.get(queue)
        if info is None or limit <= 0:
            return
        prefix = U64.pack(info.qid)
        size, most = 0, (1 << 62) if max_bytes is None else max_bytes
        with self.env.reading() as txn:
            cursor = txn.cursor(db=db)
            if not cursor.set_range(KEY.pack(info.qid, from_seq)):
                return
            n = 0
            for key, value in cursor:
                if not key.startswith(prefix) or n >= limit or size >= most:
                    return
                n += 1
                size += len(value)
                if value[0] in CHUNKED_TAGS and (ref := ref_of(value, value[0] == CHUNKED_DEAD)) is not None:
                    size += ref.accounted
                yield decode(info, key, value, txn)

    def mark_delivered(self, queue: str, seq: int, *, current: int | None = None) -> int:
        """Count one more delivery of the message, durably with a later commit; returns the new count.

        ``current`` is the count the caller just read with the message (the hot path): no second read.
        """
        return self._bump(queue, seq, +1, current)

    def unmark_delivered(self, queue: str, seq: int) -> int:
        """Take back a delivery that never left (the socket refused it)."""
        return self._bump(queue, seq, -1)

    def _bump(self, queue: str, seq: int, step: int, current: int | None = None) -> int:
        # Counts wait in memory and are written by commit(), only for messages still stored then: most
        # deliveries are acked before the next commit, and their counts never cost a write.
        key = KEY.pack(self._queues[queue].qid, seq)
        if current is None:
            with self.env.reading() as txn:
                current = self.deliveries(key, txn)
        count = max(0, current + step)
        self._pending_counts[key] = (count, time.monotonic())
        return count

    def delete(self, queue: str, seq: int, *, keep_body: bool = False) -> bool:
        """Remove a message for good (it was acknowledged). False if it was not stored. ``keep_body``:
        its chunks stay (the message moves: to the dead letters, to the end of its queue)."""
        info = self._queues.get(queue)
        if info is None:
            return False
        txn = self.env.write()
        key = KEY.pack(info.qid, seq)
        try:  # inline rather than through env.do(): every ack comes here
            value = txn.pop(key, db=self._messages_db)
            if value is not None:
                txn.delete(key, db=self._deliveries_db)  # a lookup only, when it was never written
        except LmdbError as exc:
            self.env.do(raise_, exc)  # (rolls the turn back and raises StoreError)
            raise
        if value is None:
            return False
        self._pending_counts.pop(key, None)
        size = accounted(key, value)
        if value[:1] == CHUNKED and (ref := ref_of(value)) is not None:
            size += ref.accounted if keep_body else self.bodies.delete(ref)
        self.account(info, -1, -size)
        return True

    def set_delivered(self, queue: str, seqs: Sequence[int], count: int) -> None:
        """Write the delivery count of stored messages at once, in the open transaction (durable with
        its commit, with whatever else that commit makes durable: a returned lease's record goes in
        the same one, so a crash can lose neither without the other)."""
        info = self._queues.get(queue)
        if info is None or not seqs:
            return
        txn, value = self.env.write(), U32.pack(count)
        for seq in seqs:
            key = KEY.pack(info.qid, seq)
            self._pending_counts.pop(key, None)
            self.env.do(txn.put, key, value, db=self._deliveries_db)
        self._dirty = True

    def count_in(self, queue: str, lo: int, hi: int) -> int:
        """How many messages of ``queue`` are stored with seqs ``lo .. hi-1`` (a walk of keys only)."""
        info = self._queues.get(queue)
        if info is None or lo >= hi:
            return 0
        end, n = KEY.pack(info.qid, hi), 0
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if cursor.set_range(KEY.pack(info.qid, lo)):
                for key in cursor.iternext(keys=True, values=False):
                    if key >= end:
                        break
                    n += 1
        return n

    def seqs_in(self, queue: str, lo: int, hi: int, limit: int) -> list[int]:
        """The seqs of at most ``limit`` stored messages of ``queue`` from ``lo`` to ``hi - 1``, keys only."""
        info = self._queues.get(queue)
        if info is None or lo >= hi or limit <= 0:
            return []
        end, out = KEY.pack(info.qid, hi), list[int]()
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if cursor.set_range(KEY.pack(info.qid, lo)):
                for key in cursor.iternext(keys=True, values=False):
                    if key >= end or len(out) >= limit:
                        break
                    out.append(KEY.unpack(key)[1])
        return out

    def requeue_at_end(self, message: Message, *, expires_us: int | None = None) -> Message:
        """Move a stored message to the end of its queue (new seq, deliveries kept); it must exist."""
        if not self.delete(message.queue, message.seq, keep_body=True):
            raise StoreError(f"message {message.id} is not stored")
        moved = self.append(
            message.queue,
            message.frames,
            message.enqueued_us,
            message.expires_us if expires_us is None else expires_us,
            check_limit=False,
            meta=message.meta,
            body=message.body,
        )
        if message.deliveries:  # written now, not lazily: a retry count must survive a crash
            self.env.do(
                self.env.write().put,
                KEY.pack(moved.qid, moved.seq),
                U32.pack(message.deliveries),
                db=self._deliveries_db,
            )
        moved.deliveries = message.deliveries
        return moved
