"""The queue model: named durable FIFO queues, their messages, delivery counts and dead letters.

Key layout (every integer big-endian, so LMDB's byte order is FIFO order)::

    queues      name (utf-8)            -> msgpack [qid, next_seq, count, bytes, dead_count, dead_bytes]
    meta        b"next_qid"             -> u64 (ids are never reused, so message ids stay unique)
                b"format"               -> u64 (layout version, 1)
    messages    qid u64 | seq u64       -> msgpack [enqueued_us, expires_us (0 = never), [frame, ...]
                                                    (, meta: a protocol's own fields, e.g. eMQP's)]
    deliveries  qid u64 | seq u64       -> u32 delivery count (absent = never delivered)
    damaged     qid u64 | seq u64       -> the raw record of a message that could not be read (set aside)
    dead        qid u64 | seq u64       -> msgpack [enqueued_us, expires_us, [frame, ...], deliveries,
                                                    reason, dead_at_us (, meta)]

Side tables (schedules, consumer groups, dedup keys, bindings, eMQP jobs) live in the same
environment, each with one owner in this package (``SIDE_TABLES``); their pages count toward the
store limit with the queues'.

The per-queue counters (count, bytes) live in the ``queues`` record and are written once per commit,
so start-up reads one small record per queue and never scans the messages.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import os
import re
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, NoReturn, overload

import msgpack

from pzq.errors import StoreError, StoreFull
from pzq.store.environment import Environment, KeyExists, LmdbError
from pzq.store.side_table import UNREADABLE

log = logging.getLogger("pzq.store")

_KEY = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
# Accounted bytes per message beyond key and value: LMDB node headers, the deliveries entry and page
# slack. It keeps "store full" honest for tiny messages, whose overhead outweighs their bodies.
_OVERHEAD = 64
_FORMAT = 1
_HEX32 = re.compile(r"[0-9a-f]{32}")
QUEUE_TABLES = ("queues", "meta", "messages", "deliveries", "dead", "damaged")
# Tables of the side-table owners (schedules.py, groups.py, dedup_keys.py, bindings.py, emqp_jobs.py)
SIDE_TABLES = ("schedules", "groups", "leases", "produced", "mqks", "emqp_jobs")


@dataclasses.dataclass(slots=True)
class Message:
    """One stored message. ``frames`` are the body parts exactly as produced.

    Not frozen: a frozen dataclass costs a microsecond more per message on the hot path.
    """

    queue: str
    qid: int
    seq: int
    frames: list[bytes]
    enqueued_us: int
    expires_us: int = 0
    deliveries: int = 0
    meta: dict | None = None  # a protocol's own fields (eMQP: client, msgid, headers); others ignore it

    @property
    def id(self) -> str:
        """32 lowercase hex characters, unique in the store and stable across redeliveries."""
        return message_id(self.qid, self.seq)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A message moved aside after too many deliveries, an expired TTL, or a client's request."""

    message: Message
    reason: str
    dead_at_us: int


@dataclasses.dataclass
class QueueInfo:
    """Counters of one queue, kept in memory and written back with each commit."""

    name: str
    qid: int
    next_seq: int = 1
    count: int = 0
    bytes: int = 0
    dead_count: int = 0
    dead_bytes: int = 0

    def pack(self) -> builtins.bytes:  # ("bytes" is also a field of this class)
        return msgpack.packb([self.qid, self.next_seq, self.count, self.bytes, self.dead_count, self.dead_bytes])

    @classmethod
    def unpack(cls, name: str, raw: builtins.bytes) -> QueueInfo:
        qid, next_seq, count, size, dead_count, dead_bytes = msgpack.unpackb(raw)
        return cls(name, qid, next_seq, count, size, dead_count, dead_bytes)


@dataclasses.dataclass(frozen=True)
class Preview:
    """The start of a stored message or dead letter, as the web console shows it."""

    id: str
    enqueued_us: int
    deliveries: int
    body_head: bytes  # the first bytes of its frames joined
    body_size: int  # of all its frames (its record's size when it has more than PREVIEW_FRAMES frames)
    reason: str = ""  # a dead letter's (left out past PREVIEW_FRAMES frames)
    size_exact: bool = True


PREVIEW_FRAMES = 64  # frames of one record a preview walks: a million empty frames cost no more


_BIN_HEADERS = {0xC4: (2, ">B"), 0xC5: (3, ">H"), 0xC6: (5, ">I")}


def _preview_record(view: memoryview, head_bytes: int, dead: bool) -> tuple[int, bytes, int, int, str, bool] | None:
    """(enqueued_us, first ``head_bytes`` of the body, body size, deliveries, reason, whether the size
    is exact) of a record, read without copying its frames; None if it is not one. Walks the msgpack
    layout (module docstring): the fields before the frames, each frame's bin header (at most
    PREVIEW_FRAMES of them: past that the record's size stands for the body's), and a dead letter's
    fields after them."""
    try:
        fields = msgpack.Unpacker()
        fields.feed(view[:64])
        if fields.read_array_header() < (6 if dead else 3):
            return None
        enqueued_us, _ = int(fields.unpack()), fields.unpack()
        frames = fields.read_array_header()
        at, head, size = fields.tell(), bytearray(), 0
        if frames > PREVIEW_FRAMES:
            for _ in range(PREVIEW_FRAMES):
                header = _BIN_HEADERS.get(view[at])
                if header is None or len(head) >= head_bytes:
                    break
                start = at + header[0]
                length = struct.unpack_from(header[1], view, at + 1)[0]
                head += view[start : start + min(length, head_bytes - len(head))]
                at = start + length
            return enqueued_us, bytes(head), len(view), 0, "", False
        for _ in range(frames):
            header = _BIN_HEADERS.get(view[at])
            if header is None:
                return None
            length = struct.unpack_from(header[1], view, at + 1)[0]
            start = at + header[0]
            if start + length > len(view):
                return None
            head += view[start : start + min(length, head_bytes - len(head))]
            size += length
            at = start + length
        deliveries, reason = 0, ""
        if dead:
            rest = msgpack.Unpacker()
            rest.feed(view[at : at + 1024])
            deliveries, reason = int(rest.unpack()), str(rest.unpack())
        return enqueued_us, bytes(head), size, deliveries, reason, True
    except (ValueError, TypeError, IndexError, struct.error, msgpack.UnpackException):
        return None


def message_id(qid: int, seq: int) -> str:
    return f"{qid:016x}{seq:016x}"


def parse_message_id(text: str | bytes) -> tuple[int, int] | None:
    """(qid, seq) of a 32-hex message id, or None when it is not one."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not _HEX32.fullmatch(text):
        return None
    return int(text[:16], 16), int(text[16:], 16)


def _raise(exc: Exception) -> NoReturn:
    raise exc


def _accounted(key: bytes, value: bytes | memoryview) -> int:
    return len(key) + len(value) + _OVERHEAD


class Store:
    """Named durable FIFO queues. Single-threaded: one owner calls every method."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        max_size: int = 4 << 30,
        sync: bool = True,
        readonly: bool = False,
        min_disk_free: int = 0,
        disk_reserve: int = 0,
        max_queues: int = 1_000_000,
        verify: bool = False,
    ):
        self.path = os.fspath(path)
        self.max_size = max_size
        self.max_queues = max_queues
        self.min_disk_free = min_disk_free
        self._readonly = readonly
        self.env = Environment(
            self.path,
            QUEUE_TABLES + SIDE_TABLES,
            max_size=max_size,
            sync=sync,
            readonly=readonly,
            min_disk_free=min_disk_free,
            disk_reserve=disk_reserve,
            verify=verify,
        )
        self.env.on_abort.append(self._rolled_back)
        dbs = self.env.dbs
        self._queues_db, self._meta_db, self._messages_db = dbs["queues"], dbs["meta"], dbs["messages"]
        self._deliveries_db, self._dead_db, self._damaged_db = dbs["deliveries"], dbs["dead"], dbs["damaged"]
        self._unreadable: list[tuple[QueueInfo, bytes, str]] = []  # found by _decode, for _set_aside
        self.on_set_aside: list[Callable[[int, int], None]] = []  # told (qid, seq) of each message set aside
        self.damaged_total = 0
        self.unreadable_records = 0  # side records skipped by read_records
        self._dirty = False
        self._dirty_queues: set[str] = set()
        # Delivery counts not yet written: key -> (count, monotonic time of the delivery).
        self._pending_counts: dict[bytes, tuple[int, float]] = {}
        self._meta_dirty = False
        self._total_bytes = 0
        self._side_bytes = 0  # pages of the side tables: schedules, bindings, dedup keys, groups count too
        self._side_stale = False  # a side table changed since _side_bytes was read
        self._queues: dict[str, QueueInfo] = {}
        self._by_id: dict[int, QueueInfo] = {}
        self._next_qid = 1
        try:
            self._load()
        except BaseException:
            self.env.close()
            raise

    # -- lifecycle --------------------------------------------------------------------------------

    def _load(self) -> None:
        self._queues.clear()
        self._by_id.clear()
        with self.env.reading() as txn:
            fmt = txn.get(b"format", db=self._meta_db)
            if fmt is not None and _U64.unpack(fmt)[0] != _FORMAT:
                raise StoreError(f"{self.path} has store format {_U64.unpack(fmt)[0]}; this pzq reads {_FORMAT}")
            self._meta_dirty = fmt is None and not self._readonly
            raw = txn.get(b"next_qid", db=self._meta_db)
            self._next_qid = _U64.unpack(raw)[0] if raw else 1
            for name, value in txn.cursor(db=self._queues_db):
                try:
                    info = QueueInfo.unpack(name.decode(), value)
                except UNREADABLE as exc:  # the counters of a queue: nothing of it can be served without
                    raise StoreError(
                        f"{self.path}/data.mdb: the record of queue {name[:60]!r} cannot be read "
                        f"({exc}): the store is damaged; run `pzq check`, restore it from a backup, "
                        "or `pzq dump` what is readable"
                    ) from None
                self._queues[info.name] = info
                self._by_id[info.qid] = info
            self._side_bytes = self.env.pages_of(SIDE_TABLES, txn) * self.env.page_size
            self._side_stale = False
        self._dirty_queues.clear()
        self._total_bytes = sum(q.bytes + q.dead_bytes for q in self._queues.values())

    def _side(self) -> int:
        """Bytes of the side tables, read again only after they changed (a lease call writes thousands)."""
        if self._side_stale:
            with self.env.reading() as txn:
                self._side_bytes = self.env.pages_of(SIDE_TABLES, txn) * self.env.page_size
            self._side_stale = False
        return self._side_bytes

    def side_changed(self) -> None:
        """A side table's owner wrote: its pages are counted again when next needed."""
        self._side_stale = True
        self._dirty = True

    def close(self) -> None:
        """Commit what is pending and close the environment."""
        if self.env.closed:
            return
        try:
            self.commit()
        finally:
            self.env.close()

    @property
    def dirty(self) -> bool:
        """True while writes (or delivery counts) wait for a commit."""
        return self._dirty or bool(self._pending_counts)

    def commit(self, counts_older_than: float | None = None) -> bool:
        """End the open write transaction durably. Returns True if anything was written.

        Delivery counts are written too: all of them, or with ``counts_older_than`` (a monotonic time)
        only those of deliveries made before it. Younger ones stay pending, since most deliveries are
        acked within a millisecond and their counts then never need a write.
        """
        due = [
            (key, count)
            for key, (count, since) in self._pending_counts.items()
            if counts_older_than is None or since <= counts_older_than
        ]
        if not self._dirty and not due:
            self.env.end_clean()  # (a transaction only read in, or nothing at all)
            return False
        txn = self.env.write()
        for key, count in due:
            self.env.do(txn.put, key, _U32.pack(count), db=self._deliveries_db)
        # Only what changed: every extra record written is another B-tree path copied and synced.
        for name in self._dirty_queues:
            self.env.do(txn.put, name.encode(), self._queues[name].pack(), db=self._queues_db)
        if self._meta_dirty:
            self.env.do(txn.put, b"next_qid", _U64.pack(self._next_qid), db=self._meta_db)
            self.env.do(txn.put, b"format", _U64.pack(_FORMAT), db=self._meta_db)
        self.env.commit()  # (a failure rolls back and calls _rolled_back, then raises StoreError)
        self._dirty = False
        self._dirty_queues.clear()
        for key, _ in due:
            del self._pending_counts[key]
        self._meta_dirty = False
        return True

    @property
    def syncs(self) -> int:
        """Durable commits so far."""
        return self.env.syncs

    def abort(self) -> None:
        """Drop every write since the last commit, counters included."""
        self.env.abort()

    def _rolled_back(self) -> None:
        """The environment dropped the open transaction: the counters are read again from the disk."""
        self._dirty = False
        self._pending_counts.clear()
        self._load()

    # -- queues -----------------------------------------------------------------------------------

    @overload
    def queue(self, name: str, create: Literal[True] = True) -> QueueInfo: ...
    @overload
    def queue(self, name: str, create: bool) -> QueueInfo | None: ...

    def queue(self, name: str, create: bool = True) -> QueueInfo | None:
        """The counters of queue ``name`` (created empty on first use unless ``create`` is False)."""
        info = self._queues.get(name)
        if info is None and create:
            if not name or len(name.encode()) > 255:
                raise StoreError(f"queue name must be 1 to 255 bytes: {name!r}")
            if len(self._queues) >= self.max_queues:  # every queue costs memory and a line of figures
                raise StoreFull(f"queue full: there are {len(self._queues)} queues, the most --max-queues allows")
            info = QueueInfo(name, self._next_qid)
            self._next_qid += 1
            self._queues[name] = info
            self._by_id[info.qid] = info
            self.env.write()
            self._dirty = self._meta_dirty = True
            self._dirty_queues.add(name)
        return info

    def ref_in(self, queue: str, message_id: str | bytes) -> tuple[int, int] | None:
        """(qid, seq) of ``message_id`` if it names a message (or dead letter) of ``queue``: a client's
        id of another queue, or no id at all, gets None."""
        ref = parse_message_id(message_id)
        info = self._queues.get(queue)
        return ref if ref is not None and info is not None and ref[0] == info.qid else None

    def queue_by_id(self, qid: int) -> QueueInfo | None:
        return self._by_id.get(qid)

    def queues(self) -> list[QueueInfo]:
        return list(self._queues.values())

    # -- messages ---------------------------------------------------------------------------------

    @property
    def stored_bytes(self) -> int:
        """Accounted bytes of every message, dead letter and side record: what the store limit applies to."""
        return self._total_bytes + self._side()

    def _account(self, info: QueueInfo, count: int = 0, size: int = 0, dead_count: int = 0, dead_size: int = 0) -> None:
        info.count += count
        info.bytes += size
        info.dead_count += dead_count
        info.dead_bytes += dead_size
        self._total_bytes += size + dead_size
        self._dirty_queues.add(info.name)
        self._dirty = True

    def put(
        self, queue: str, frames: Sequence[bytes], *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Append a message to ``queue``. Raises StoreFull (writing nothing) past the store limit."""
        return self._append(queue, frames, now_us, expires_us, check_limit=True, meta=meta)

    def put_many(self, queue: str, bodies: Sequence[Sequence[bytes]], *, now_us: int) -> int:
        """Append messages (no TTL, no meta) to ``queue`` in one call: how many of them, from the first,
        were stored; the others did not fit under the store limit (or the disk is short). The native
        producers' hot path: one LMDB call for a turn's messages, no Message objects. Raises
        StoreFull, storing nothing, when the queue cannot be made."""
        if not bodies or self.low_disk:
            return 0
        info = self._queues.get(queue) or self.queue(queue)
        room = self.max_size - self._total_bytes - self._side()
        items: list[tuple[bytes, bytes]] = []
        pack, key, qid, seq, total = msgpack.packb, _KEY.pack, info.qid, info.next_seq, 0
        for body in bodies:
            value = pack([now_us, 0, body])
            size = len(value) + _KEY.size + _OVERHEAD
            if total + size > room:
                break
            items.append((key(qid, seq), value))
            seq += 1
            total += size
        if not items:
            return 0
        cursor = self.env.write().cursor(db=self._messages_db)
        try:
            _, added = cursor.putmulti(items, overwrite=False)
        except LmdbError as exc:
            self.env.do(_raise, exc)
        if added != len(items):  # another writer used these seqs: storing over them would lose messages
            self.env.do(_raise, KeyExists(f"messages of queue {queue!r} from seq {info.next_seq} are already stored"))
        info.next_seq = seq
        self._account(info, len(items), total)
        return len(items)

    def _append(
        self,
        queue: str,
        frames: Sequence[bytes],
        enqueued_us: int,
        expires_us: int,
        *,
        check_limit: bool,
        meta: dict | None = None,
    ) -> Message:
        record = [enqueued_us, expires_us, list(frames)]
        if meta:
            record.append(meta)
        value = msgpack.packb(record)
        size = _accounted(_KEY.pack(0, 0), value)
        if check_limit and self._total_bytes + self._side() + size > self.max_size:
            raise StoreFull(f"queue full: the store holds {self.stored_bytes} of {self.max_size} bytes")
        if check_limit and self.low_disk:
            raise StoreFull(f"queue full: the disk of {self.path} has less than {self.min_disk_free} bytes free")
        info = self._queues.get(queue) or self.queue(queue)
        seq = info.next_seq
        txn = self.env.write()
        try:  # inline rather than through env.do(): this is the hottest write
            fresh = txn.put(_KEY.pack(info.qid, seq), value, db=self._messages_db, overwrite=False)
        except LmdbError as exc:
            self.env.do(_raise, exc)
        if not fresh:  # another writer used this seq: storing over it would lose a message someone was acked for
            self.env.do(_raise, KeyExists(f"message {message_id(info.qid, seq)} is already stored"))
        info.next_seq = seq + 1
        self._account(info, 1, size)
        return Message(queue, info.qid, seq, list(frames), enqueued_us, expires_us, 0, meta)

    def _deliveries(self, key: bytes, txn) -> int:
        pending = self._pending_counts.get(key)
        if pending is not None:
            return pending[0]
        raw = txn.get(key, db=self._deliveries_db)
        # (a damaged count reads as 0: the message is still delivered, its retry count starts over)
        return _U32.unpack(raw)[0] if raw and len(raw) == 4 else 0

    def _decode(self, info: QueueInfo, key: bytes, value: bytes, txn) -> Message | None:
        """The stored message, or None (noted for ``_set_aside``) when its record cannot be read."""
        try:
            record = msgpack.unpackb(value)
            if (
                type(record) is not list
                or len(record) < 3
                or type(record[2]) is not list
                or not all(type(f) is bytes for f in record[2])
                or (len(record) > 3 and record[3] is not None and type(record[3]) is not dict)
            ):
                raise ValueError("not a message record")
            return Message(
                info.name,
                info.qid,
                _KEY.unpack(key)[1],
                record[2],
                int(record[0]),
                int(record[1]),
                self._deliveries(key, txn),
                record[3] if len(record) > 3 else None,
            )
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            self._unreadable.append((info, key, f"{type(exc).__name__}: {exc}"))
            return None

    def get(self, queue: str, seq: int) -> Message | None:
        info = self._queues.get(queue)
        if info is None:
            return None
        key = _KEY.pack(info.qid, seq)
        with self.env.reading() as txn:
            value = txn.get(key, db=self._messages_db)
            message = None if value is None else self._decode(info, key, value, txn)
        self._set_aside()
        return message

    def scan(self, queue: str, from_seq: int = 0, limit: int = 100) -> list[Message]:
        """Up to ``limit`` messages of ``queue`` with seq >= ``from_seq``, in FIFO order."""
        while True:
            damaged = self.damaged_total
            messages = [m for m in self._iter(self._messages_db, queue, from_seq, limit, self._decode) if m is not None]
            self._set_aside()
            if self.damaged_total == damaged or len(messages) >= limit:
                return messages  # (else read again: what was set aside is gone, more may follow it)

    def headers(self, queue: str, from_seq: int, limit: int) -> list[tuple[int, int, int, int]]:
        """``(seq, expires_us, max_deliveries or 0, deliveries)`` of up to ``limit`` messages of
        ``queue`` from ``from_seq`` on, in FIFO order: what a lease needs to know of each, read in one
        cursor walk without building messages (a quarter of ``scan``'s cost). Unreadable records
        are set aside, as ``scan`` does."""
        info = self._queues.get(queue)
        if info is None or limit <= 0:
            return []
        out: list[tuple[int, int, int, int]] = []
        prefix, unpack_key, unpackb, pending = _U64.pack(info.qid), _KEY.unpack, msgpack.unpackb, self._pending_counts
        deliveries_db = self._deliveries_db
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if cursor.set_range(_KEY.pack(info.qid, from_seq)):
                for key, value in cursor:
                    if len(out) >= limit or not key.startswith(prefix):
                        break
                    try:
                        record = unpackb(value)
                        expires_us = record[1]
                        if type(expires_us) is not int or type(record[2]) is not list:
                            raise ValueError("not a message record")
                        meta = record[3] if len(record) > 3 else None
                        cap = meta.get("max_deliveries") or 0 if type(meta) is dict else 0
                    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
                        self._unreadable.append((info, key, f"{type(exc).__name__}: {exc}"))
                        continue
                    count = pending.get(key)
                    if count is not None:
                        deliveries = count[0]
                    else:
                        raw = txn.get(key, db=deliveries_db)
                        deliveries = _U32.unpack(raw)[0] if raw and len(raw) == 4 else 0
                    out.append((unpack_key(key)[1], expires_us, cap if type(cap) is int else 0, deliveries))
        self._set_aside()
        return out

    def _set_aside(self) -> None:
        """Move unreadable message records (a damaged page, a bug) out of their queue into the
        ``damaged`` table, raw, and count them: one bad record must not fail every turn that meets it
        (a crash loop), and its bytes stay for ``pzq dump``. Written with the turn's commit."""
        while self._unreadable:
            info, key, reason = self._unreadable.pop()
            txn = self.env.write()
            value = txn.get(key, db=self._messages_db)
            if value is None or info.name not in self._queues:
                continue
            self.env.do(txn.put, key, value, db=self._damaged_db)
            self.env.do(txn.delete, key, db=self._messages_db)
            self._pending_counts.pop(key, None)
            self._account(info, -1, -_accounted(key, value))
            self.damaged_total += 1
            for listener in self.on_set_aside:
                listener(info.qid, _KEY.unpack(key)[1])
            log.error(
                "message %s of queue %r cannot be read (%s): set aside in the store's damaged table "
                "(`pzq dump` copies it out); the queue goes on",
                message_id(info.qid, _KEY.unpack(key)[1]),
                info.name,
                reason,
            )

    def _iter(self, db, queue: str, from_seq: int, limit: int, decode) -> Iterator:
        info = self._queues.get(queue)
        if info is None or limit <= 0:
            return
        prefix = _U64.pack(info.qid)
        with self.env.reading() as txn:
            cursor = txn.cursor(db=db)
            if not cursor.set_range(_KEY.pack(info.qid, from_seq)):
                return
            n = 0
            for key, value in cursor:
                if not key.startswith(prefix) or n >= limit:
                    return
                n += 1
                yield decode(info, key, value, txn)

    def preview(self, queue: str, limit: int, head_bytes: int, *, dead: bool = False) -> list[Preview]:
        """The first ``limit`` committed messages (or dead letters) of ``queue``, each with only the
        first ``head_bytes`` of its body: a look that costs the same for 16 MiB bodies as for tiny
        ones. Unreadable records are left out (``scan`` sets them aside)."""
        info = self._queues.get(queue)
        if info is None or limit <= 0:
            return []
        out: list[Preview] = []
        prefix = _U64.pack(info.qid)
        with self.env.snapshot() as txn:
            cursor = txn.cursor(db=self._dead_db if dead else self._messages_db)
            if not cursor.set_range(prefix):
                return out
            for walked, key in enumerate(cursor.iternext(keys=True, values=False)):
                if bytes(key[:8]) != prefix or len(out) >= limit or walked >= 2 * limit:
                    break  # (unreadable records count too: a damaged queue is not walked to its end)
                found = _preview_record(cursor.value(), head_bytes, dead)
                if found is None:
                    continue
                enqueued_us, head, size, deliveries, reason, exact = found
                key = bytes(key)
                if not dead:
                    deliveries = self._deliveries(key, txn)
                seq = _KEY.unpack(key)[1]
                out.append(Preview(message_id(info.qid, seq), enqueued_us, deliveries, head, size, reason, exact))
        return out

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
        key = _KEY.pack(self._queues[queue].qid, seq)
        if current is None:
            with self.env.reading() as txn:
                current = self._deliveries(key, txn)
        count = max(0, current + step)
        self._pending_counts[key] = (count, time.monotonic())
        return count

    def delete(self, queue: str, seq: int) -> bool:
        """Remove a message for good (it was acknowledged). False if it was not stored."""
        info = self._queues.get(queue)
        if info is None:
            return False
        txn = self.env.write()
        key = _KEY.pack(info.qid, seq)
        try:  # inline rather than through env.do(): every ack comes here
            value = txn.pop(key, db=self._messages_db)
            if value is not None:
                txn.delete(key, db=self._deliveries_db)  # a lookup only, when it was never written
        except LmdbError as exc:
            self.env.do(_raise, exc)  # (rolls the turn back and raises StoreError)
            raise
        if value is None:
            return False
        self._pending_counts.pop(key, None)
        self._account(info, -1, -_accounted(key, value))
        return True

    def delete_range(self, queue: str, lo: int, hi: int, limit: int) -> tuple[int, int]:
        """Remove at most ``limit`` stored messages with seqs ``lo .. hi-1``, walking only the records
        that exist (a consumer group's acknowledged range); returns (how many, the seq to go on from:
        ``hi`` once the range is done)."""
        info = self._queues.get(queue)
        if info is None or lo >= hi:
            return 0, hi
        txn = self.env.write()
        removed = size = 0
        end = _KEY.pack(info.qid, hi)
        try:
            cursor = txn.cursor(db=self._messages_db)
            key: bytes = bytes(cursor.key()) if cursor.set_range(_KEY.pack(info.qid, lo)) else b""
            while key and key < end and removed < limit:
                size += _accounted(key, cursor.value())
                txn.delete(key, db=self._deliveries_db)
                self._pending_counts.pop(key, None)
                removed += 1
                cursor.delete()  # (and moves to the next record: b"" past the last)
                key = bytes(cursor.key())
            at = hi if not key or key >= end else _KEY.unpack(key)[1]
        except LmdbError as exc:
            self.env.do(_raise, exc)  # (rolls the turn back and raises StoreError)
            raise
        if removed:
            self._account(info, -removed, -size)
        return removed, at

    def set_delivered(self, queue: str, seqs: Sequence[int], count: int) -> None:
        """Write the delivery count of stored messages at once, in the open transaction (durable with
        its commit, with whatever else that commit makes durable: a returned lease's record goes in
        the same one, so a crash can lose neither without the other)."""
        info = self._queues.get(queue)
        if info is None or not seqs:
            return
        txn, value = self.env.write(), _U32.pack(count)
        for seq in seqs:
            key = _KEY.pack(info.qid, seq)
            self._pending_counts.pop(key, None)
            self.env.do(txn.put, key, value, db=self._deliveries_db)
        self._dirty = True

    def count_in(self, queue: str, lo: int, hi: int) -> int:
        """How many messages of ``queue`` are stored with seqs ``lo .. hi-1`` (a walk of keys only)."""
        info = self._queues.get(queue)
        if info is None or lo >= hi:
            return 0
        end, n = _KEY.pack(info.qid, hi), 0
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if cursor.set_range(_KEY.pack(info.qid, lo)):
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
        end, out = _KEY.pack(info.qid, hi), list[int]()
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if cursor.set_range(_KEY.pack(info.qid, lo)):
                for key in cursor.iternext(keys=True, values=False):
                    if key >= end or len(out) >= limit:
                        break
                    out.append(_KEY.unpack(key)[1])
        return out

    def requeue_at_end(self, message: Message, *, expires_us: int | None = None) -> Message:
        """Move a stored message to the end of its queue (new seq, deliveries kept); it must exist."""
        if not self.delete(message.queue, message.seq):
            raise StoreError(f"message {message.id} is not stored")
        moved = self._append(
            message.queue,
            message.frames,
            message.enqueued_us,
            message.expires_us if expires_us is None else expires_us,
            check_limit=False,
            meta=message.meta,
        )
        if message.deliveries:  # written now, not lazily: a retry count must survive a crash
            self.env.do(
                self.env.write().put,
                _KEY.pack(moved.qid, moved.seq),
                _U32.pack(message.deliveries),
                db=self._deliveries_db,
            )
        moved.deliveries = message.deliveries
        return moved

    def drop_queue(self, name: str) -> int:
        """Delete a queue with its messages, delivery counts and dead letters (MQKS delete_queue);
        returns how many messages went. A later ``queue(name)`` makes a new, empty queue."""
        info = self._queues.get(name)
        if info is None:
            return 0
        txn, prefix = self.env.write(), _U64.pack(info.qid)
        for db in (self._messages_db, self._deliveries_db, self._dead_db):
            cursor = txn.cursor(db=db)
            if cursor.set_range(prefix):
                while cursor.key()[:8] == prefix and self.env.do(cursor.delete):
                    pass
        for key in [k for k in self._pending_counts if k[:8] == prefix]:
            del self._pending_counts[key]
        self.env.do(txn.delete, name.encode(), db=self._queues_db)
        del self._queues[name]
        del self._by_id[info.qid]
        self._dirty_queues.discard(name)
        self._total_bytes -= info.bytes + info.dead_bytes
        self._dirty = True
        return info.count

    # -- dead letters -----------------------------------------------------------------------------

    def dead_letter(self, message: Message, reason: str, *, now_us: int) -> bool:
        """Move a stored message to its queue's dead letters. False if it was no longer stored."""
        if not self.delete(message.queue, message.seq):
            return False
        info = self._queues[message.queue]
        key = _KEY.pack(info.qid, message.seq)
        record = [message.enqueued_us, message.expires_us, message.frames, message.deliveries, reason, now_us]
        if message.meta:
            record.append(message.meta)
        value = msgpack.packb(record)
        if not self.env.do(self.env.write().put, key, value, db=self._dead_db, overwrite=False):
            self.env.do(_raise, KeyExists(f"dead letter {message.id} is already stored"))
        self._account(info, dead_count=1, dead_size=_accounted(key, value))
        return True

    def _decode_dead(self, info: QueueInfo, key: bytes, value: bytes, txn) -> DeadLetter:
        record = msgpack.unpackb(value)
        enqueued_us, expires_us, frames, deliveries, reason, dead_at_us = record[:6]
        message = Message(
            info.name,
            info.qid,
            _KEY.unpack(key)[1],
            frames,
            enqueued_us,
            expires_us,
            deliveries,
            record[6] if len(record) > 6 else None,
        )
        return DeadLetter(message, reason, dead_at_us)

    def dead_letters(self, queue: str, from_seq: int = 0, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of ``queue``, oldest first."""
        return list(self._iter(self._dead_db, queue, from_seq, limit, self._decode_dead))

    def requeue_dead(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> list[Message]:
        """Put dead letters back at the end of their queue with a fresh delivery count.

        One by ``seq``, or up to ``limit`` of the oldest when ``seq`` is None. Returns the new messages.
        """
        info = self._queues.get(queue)
        if info is None:
            return []
        letters = self.dead_letters(queue, seq or 0, 1 if seq is not None else limit)
        if seq is not None:
            letters = [d for d in letters if d.message.seq == seq]
        moved = []
        for letter in letters:
            self._remove_dead(info, letter.message.seq)
            moved.append(
                self._append(
                    queue,
                    letter.message.frames,
                    letter.message.enqueued_us,
                    letter.message.expires_us,
                    check_limit=False,
                    meta=letter.message.meta,
                )
            )
        return moved

    def delete_dead(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> int:
        """Delete dead letters for good: one by ``seq``, or up to ``limit`` of the oldest when ``seq``
        is None. Returns how many went."""
        info = self._queues.get(queue)
        if info is None:
            return 0
        letters = self.dead_letters(queue, seq or 0, 1 if seq is not None else limit)
        gone = 0
        for letter in letters:
            if seq is not None and letter.message.seq != seq:
                continue
            self._remove_dead(info, letter.message.seq)
            gone += 1
        return gone

    def _remove_dead(self, info: QueueInfo, seq: int) -> None:
        key = _KEY.pack(info.qid, seq)
        value = self.env.write().get(key, db=self._dead_db) or b""
        self.env.do(self.env.write().delete, key, db=self._dead_db)
        self._account(info, dead_count=-1, dead_size=-_accounted(key, value))

    # -- room ---------------------------------------------------------------------------------------

    def check_room(self, size: int) -> None:
        """Raise StoreFull unless ``size`` more bytes fit under the store limit and the disk has room."""
        if self.low_disk:
            raise StoreFull(f"queue full: the disk of {self.path} has less than {self.min_disk_free} bytes free")
        if self._total_bytes + self._side() + size > self.max_size:
            raise StoreFull(f"queue full: the store holds {self.stored_bytes} of {self.max_size} bytes")

    @property
    def low_disk(self) -> bool:
        """Free space is under --min-disk-free: producers are refused."""
        return self.env.low_disk

    def watch_disk(self) -> int | None:
        """One statvfs of the store's filesystem (see Environment.watch_disk); returns the free bytes."""
        return self.env.watch_disk()

    def disk_bytes(self) -> int:
        """Bytes of the store's pages in use on disk (the high-water mark of the data file)."""
        return self.env.disk_bytes()

    # -- checking -----------------------------------------------------------------------------------

    def audit(self, queue: str) -> Iterator[tuple[str, Message | DeadLetter | None]]:
        """Every record of ``queue``, in order: ("message", Message), ("dead", DeadLetter), or (kind,
        None) for one that cannot be read. Read-only: nothing is set aside (``pzq check``, ``pzq dump``)."""
        info = self._queues[queue]
        prefix = _U64.pack(info.qid)
        with self.env.reading() as txn:
            for kind, db in (("message", self._messages_db), ("dead", self._dead_db)):
                cursor = txn.cursor(db=db)
                if not cursor.set_range(prefix):
                    continue
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    if kind == "message":
                        yield kind, self._decode(info, key, value, txn)
                        self._unreadable.clear()
                        continue
                    try:
                        yield kind, self._decode_dead(info, key, value, txn)
                    except (ValueError, TypeError, msgpack.UnpackException):
                        yield kind, None

    def damaged(self) -> list[tuple[bytes, bytes]]:
        """The raw records set aside as unreadable (for ``pzq dump``)."""
        with self.env.reading() as txn:
            return list(txn.cursor(db=self._damaged_db))
