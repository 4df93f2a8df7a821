"""The durable store: named FIFO queues in one LMDB environment. The only module that imports lmdb.

Key layout (every integer big-endian, so LMDB's byte order is FIFO order)::

    queues      name (utf-8)            -> msgpack [qid, next_seq, count, bytes, dead_count, dead_bytes]
    meta        b"next_qid"             -> u64 (ids are never reused, so message ids stay unique)
                b"format"               -> u64 (layout version, 1)
    messages    qid u64 | seq u64       -> msgpack [enqueued_us, expires_us (0 = never), [frame, ...]
                                                    (, meta: a protocol's own fields, e.g. eMQP's)]
    deliveries  qid u64 | seq u64       -> u32 delivery count (absent = never delivered)
    schedules   schedule id (utf-8)     -> msgpack {a protocol's recurring job: eMQP SCHEDULE}
    groups      qid u64 | group (utf-8) -> msgpack [gid, base, end, deadline_us]  (leases.py)
    leases      gid u64 | lease seq u64 -> seq u64 | deliveries u32                 (leases.py)
    produced    dedup key (utf-8)       -> msgpack [stored_us, count, [digest, ...]] (gateways/api.py)
    mqks        queue name (utf-8)      -> msgpack [[event, ...], unused seconds | nil] (gateways/mqks.py)
    damaged     qid u64 | seq u64       -> the raw record of a message that could not be read (set aside)
    dead        qid u64 | seq u64       -> msgpack [enqueued_us, expires_us, [frame, ...], deliveries,
                                                    reason, dead_at_us (, meta)]

Group commit: every write joins one open write transaction; ``commit()`` ends it with one durable
commit (fsync'd unless ``sync=False``). Nothing else in pzq decides when data reaches the disk.

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
from collections.abc import Iterator, Sequence
from typing import Any, Literal, overload

import lmdb
import msgpack

from pzq.errors import StoreDamaged, StoreError, StoreFull, StoreLocked

log = logging.getLogger("pzq.store")

_KEY = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
# Accounted bytes per message beyond key and value: LMDB node headers, the deliveries entry and page
# slack. It keeps "store full" honest for tiny messages, whose overhead outweighs their bodies.
_OVERHEAD = 64
_FORMAT = 1
RESERVE_RETRY_S = 60  # after the reserve was given back, or could not be made
_MIN_DATA_FILE = 2 * 4096  # LMDB's two meta pages (4 KiB pages on every platform pzq runs on)
_HEX32 = re.compile(r"[0-9a-f]{32}")
TABLES = ("schedules", "groups", "leases", "produced", "mqks", "damaged", "emqp_jobs")


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


def _lock_exclusively(path: str) -> int:
    """Hold an exclusive flock on the store's data file for as long as the returned descriptor is open.

    LMDB lets several processes open one environment; pzq's in-memory state (in-flight deliveries,
    cursors, queue counters) assumes it is the only writer, so a second server on the same store must be
    refused. The lock is on ``data.mdb`` itself, not on a file of its own that anyone could delete: the
    only way around it is to remove the data. (flock and LMDB's own fcntl locks do not interact.)"""
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(f"the store at {os.path.dirname(path)} is in use by another pzq process") from None
    return fd


def _private_directory(path: str) -> None:
    """Create the store's directory owner-only (0700, whatever the umask); warn if an existing one is
    open to others, since it is the operator's directory to change."""
    import stat

    os.makedirs(path, mode=0o700, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        log.warning("the store directory %s is mode %o: other users may read it (chmod 700 %s)", path, mode, path)


UNREADABLE = (ValueError, TypeError, KeyError, IndexError, struct.error, UnicodeDecodeError, msgpack.UnpackException)


def read_schedule(key: bytes, value: bytes) -> tuple[str, dict]:
    record = msgpack.unpackb(value)
    for name, kind in (
        ("queue", str),
        ("headers", str),
        ("interval", int),
        ("payload", str),
        ("remaining", int),
        ("next_us", int),
    ):
        if not isinstance(record[name], kind):
            raise TypeError(f"schedule field {name} is not {kind.__name__}")
    cron = record.get("cron")
    if cron is not None and not isinstance(cron, str):
        raise TypeError("schedule field cron is not str")
    if record["interval"] <= 0 and not cron:  # (a cron schedule keeps interval 0)
        raise ValueError("schedule interval is not positive")
    return key.decode(), record


def _pages(stat: Any) -> int:  # (py-lmdb types it as a TypedDict)
    """Pages one B-tree uses, from LMDB's statistics of it."""
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


def _raise(exc: Exception):
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
        self.disk_reserve = disk_reserve
        self.low_disk = False  # free space is under min_disk_free: producers are refused
        self._reserve_retry_at = 0.0  # monotonic time before which the reserve is not made again
        self._reserve_path = os.path.join(self.path, "reserve")
        # The map may hold more than the accounted limit: B-tree pages, free pages kept for readers
        # and copy-on-write during a commit all need room, and deletes must succeed when "full" --
        # also after a restart with a limit below what is stored, so the data file counts too.
        data_file = os.path.join(self.path, "data.mdb")
        try:
            stored = os.path.getsize(data_file)
        except OSError:
            stored = 0
        if stored < _MIN_DATA_FILE and os.path.exists(data_file):
            # LMDB would take an empty file for a new store: everything that was in it would be gone
            # without a word. (It writes its two meta pages the moment it creates the file.)
            raise StoreDamaged(
                f"{data_file} is empty or truncated ({stored} bytes): restore it from a backup, "
                "or move the directory aside to start with an empty store"
            )
        self.map_cap = max(2 * max_size, max_size + (256 << 20), stored + max(stored // 2, 256 << 20))
        self.syncs = 0
        self._sync = sync
        self._readonly = readonly
        self._lock_fd: int | None = None
        try:
            if readonly:
                os.makedirs(self.path, exist_ok=True)
            else:
                _private_directory(self.path)
        except OSError as exc:
            raise StoreError(f"cannot open the store at {self.path}: {exc.strerror or exc}") from None
        try:
            # The whole cap is reserved as address space only: LMDB's data file still grows page by page
            # as data is written, and no single turn, however large, can run out of map mid-way.
            # mode 0600: the data and lock files are the owner's alone, whatever the umask.
            self._env = lmdb.open(
                self.path,
                map_size=self.map_cap,
                max_dbs=16,
                sync=sync,
                readonly=readonly,
                lock=True,
                meminit=False,
                mode=0o600,
            )
        except lmdb.Error as exc:
            raise StoreError(f"cannot open the store at {self.path}: {exc}") from exc
        needed = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        # The size is read again after the meta page: a live writer (pzq check beside a running server)
        # only ever grows the file, and writes pages before the meta page that names them.
        stored = os.path.getsize(data_file) if stored else 0
        if stored and stored < needed:  # reading a page past the end would kill the process (SIGBUS)
            self._env.close()
            raise StoreDamaged(
                f"{data_file} is truncated: {stored} bytes, but its pages need {needed}. Restore it "
                "from a backup, or move the directory aside to start with an empty store"
            )
        try:
            if not readonly:
                self._lock_fd = _lock_exclusively(os.path.join(self.path, "data.mdb"))
                for name in ("data.mdb", "lock.mdb"):  # made 0644 by an earlier pzq: make them private
                    os.chmod(os.path.join(self.path, name), 0o600)
                if verify and stored:
                    from pzq.check import verify_pages  # (check reads stores: it imports this module)

                    started = time.monotonic()
                    records = verify_pages(self.path)
                    log.info("%s verified: %d records in %.2f s", data_file, records, time.monotonic() - started)
            self._queues_db = self._env.open_db(b"queues", create=not readonly)
            self._meta_db = self._env.open_db(b"meta", create=not readonly)
            self._messages_db = self._env.open_db(b"messages", create=not readonly)
            self._deliveries_db = self._env.open_db(b"deliveries", create=not readonly)
            self._dead_db = self._env.open_db(b"dead", create=not readonly)
            # Side tables: small records a feature keeps next to the queues (see put_record).
            self._tables = {name: self._env.open_db(name.encode(), create=not readonly) for name in TABLES}
        except (lmdb.Error, OSError) as exc:
            self._env.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            raise StoreError(f"cannot open the store at {self.path}: {exc}") from exc
        except StoreError:
            self._env.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            raise
        self._txn: lmdb.Transaction | None = None
        self._unreadable: list[tuple[QueueInfo, bytes, str]] = []  # found by _decode, for _set_aside
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
            self._env.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
            raise

    # -- lifecycle --------------------------------------------------------------------------------

    def _load(self) -> None:
        self._queues.clear()
        self._by_id.clear()
        with self._env.begin() as txn:
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
            self._side_bytes = self._table_bytes(txn)
            self._side_stale = False
        self._dirty_queues.clear()
        self._total_bytes = sum(q.bytes + q.dead_bytes for q in self._queues.values())

    def _side(self) -> int:
        """Bytes of the side tables, read again only after they changed (a lease call writes thousands)."""
        if self._side_stale:
            self._side_bytes = self._table_bytes(self._txn_for_read())
            self._side_stale = False
        return self._side_bytes

    def _table_bytes(self, txn) -> int:
        """Bytes of the pages the side tables fill (a B-tree statistic: no records are read)."""
        return sum(_pages(txn.stat(db)) for db in self._tables.values()) * self._env.stat()["psize"]

    def close(self) -> None:
        """Commit what is pending and close the environment."""
        if self._env is None:
            return
        try:
            self.commit()
        finally:
            self._env.close()
            self._env = None  # type: ignore[assignment]  # (closed: every later call fails, close does nothing)
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

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
            if self._txn is not None:
                self._txn.abort()
                self._txn = None
            return False
        txn = self._write()
        self._txn = None
        try:
            for key, count in due:
                txn.put(key, _U32.pack(count), db=self._deliveries_db)
            # Only what changed: every extra record written is another B-tree path copied and synced.
            for name in self._dirty_queues:
                info = self._queues[name]
                txn.put(name.encode(), info.pack(), db=self._queues_db)
            if self._meta_dirty:
                txn.put(b"next_qid", _U64.pack(self._next_qid), db=self._meta_db)
                txn.put(b"format", _U64.pack(_FORMAT), db=self._meta_db)
            txn.commit()
        except lmdb.Error as exc:
            txn.abort()
            self._dirty = False
            self._pending_counts.clear()
            self._load()
            if self._release_reserve():  # most likely the disk is full: give the next commit room
                self.low_disk = True
            raise StoreError(f"commit failed, this transaction was rolled back: {exc}") from exc
        self._dirty = False
        self._dirty_queues.clear()
        for key, _ in due:
            del self._pending_counts[key]
        self._meta_dirty = False
        self.syncs += 1
        return True

    def abort(self) -> None:
        """Drop every write since the last commit, counters included."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        self._dirty = False
        self._pending_counts.clear()
        self._load()

    def _write(self) -> lmdb.Transaction:
        if self._readonly:
            raise StoreError("the store is open read-only")
        if self._txn is None:
            self._txn = self._env.begin(write=True)
        return self._txn

    def _do(self, op, *args, **kwargs):
        """Run one LMDB write; a failure rolls the whole open transaction back (LMDB demands it)."""
        try:
            return op(*args, **kwargs)
        except lmdb.MapFullError as exc:
            self.abort()
            raise StoreError("the LMDB map is full; the open transaction was rolled back") from exc
        except lmdb.Error as exc:
            self.abort()
            raise StoreError(f"write failed, the open transaction was rolled back: {exc}") from exc

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
            self._write()
            self._dirty = self._meta_dirty = True
            self._dirty_queues.add(name)
        return info

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
        txn = self._txn or self._write()
        try:  # inline rather than through _do(): this is the hottest write
            fresh = txn.put(_KEY.pack(info.qid, seq), value, db=self._messages_db, overwrite=False)
        except lmdb.Error as exc:
            self._do(_raise, exc)
        if not fresh:  # another writer used this seq: storing over it would lose a message someone was acked for
            self._do(_raise, lmdb.KeyExistsError(f"message {message_id(info.qid, seq)} is already stored"))
        info.next_seq = seq + 1
        self._account(info, 1, size)
        return Message(queue, info.qid, seq, list(frames), enqueued_us, expires_us, 0, meta)

    def _txn_for_read(self):
        return self._txn if self._txn is not None else self._env.begin()

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
        txn = self._txn_for_read()
        key = _KEY.pack(info.qid, seq)
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

    def _set_aside(self) -> None:
        """Move unreadable message records (a damaged page, a bug) out of their queue into the
        ``damaged`` table, raw, and count them: one bad record must not fail every turn that meets it
        (a crash loop), and its bytes stay for ``pzq dump``. Written with the turn's commit."""
        while self._unreadable:
            info, key, reason = self._unreadable.pop()
            txn = self._write()
            value = txn.get(key, db=self._messages_db)
            if value is None or info.name not in self._queues:
                continue
            self._do(txn.put, key, value, db=self._tables["damaged"])
            self._do(txn.delete, key, db=self._messages_db)
            self._pending_counts.pop(key, None)
            self._account(info, -1, -_accounted(key, value))
            self.damaged_total += 1
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
        txn = self._txn_for_read()
        cursor = txn.cursor(db=db)
        prefix = _U64.pack(info.qid)
        if not cursor.set_range(_KEY.pack(info.qid, from_seq)):
            return
        n = 0
        for key, value in cursor:
            if not key.startswith(prefix) or n >= limit:
                return
            n += 1
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
        key = _KEY.pack(self._queues[queue].qid, seq)
        if current is None:
            current = self._deliveries(key, self._txn_for_read())
        count = max(0, current + step)
        self._pending_counts[key] = (count, time.monotonic())
        return count

    def delete(self, queue: str, seq: int) -> bool:
        """Remove a message for good (it was acknowledged). False if it was not stored."""
        info = self._queues.get(queue)
        if info is None:
            return False
        txn = self._write()
        key = _KEY.pack(info.qid, seq)
        value = txn.get(key, db=self._messages_db)
        if value is None:
            return False
        self._do(txn.delete, key, db=self._messages_db)
        self._pending_counts.pop(key, None)
        self._do(txn.delete, key, db=self._deliveries_db)  # a lookup only, when it was never written
        self._account(info, -1, -_accounted(key, value))
        return True

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
            self._do(
                self._write().put,
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
        txn, prefix = self._write(), _U64.pack(info.qid)
        for db in (self._messages_db, self._deliveries_db, self._dead_db):
            cursor = txn.cursor(db=db)
            if cursor.set_range(prefix):
                while cursor.key()[:8] == prefix and self._do(cursor.delete):
                    pass
        for key in [k for k in self._pending_counts if k[:8] == prefix]:
            del self._pending_counts[key]
        self._do(txn.delete, name.encode(), db=self._queues_db)
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
        if not self._do(self._write().put, key, value, db=self._dead_db, overwrite=False):
            self._do(_raise, lmdb.KeyExistsError(f"dead letter {message.id} is already stored"))
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
            key = _KEY.pack(info.qid, letter.message.seq)
            value = self._write().get(key, db=self._dead_db) or b""
            self._do(self._write().delete, key, db=self._dead_db)
            self._account(info, dead_count=-1, dead_size=-_accounted(key, value))
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

    # -- side records ---------------------------------------------------------------------------

    def check_room(self, size: int) -> None:
        """Raise StoreFull unless ``size`` more bytes fit under the store limit and the disk has room."""
        if self.low_disk:
            raise StoreFull(f"queue full: the disk of {self.path} has less than {self.min_disk_free} bytes free")
        if self._total_bytes + self._side() + size > self.max_size:
            raise StoreFull(f"queue full: the store holds {self.stored_bytes} of {self.max_size} bytes")

    def put_record(self, table: str, key: bytes, value: bytes, *, counted: bool = True) -> None:
        """Store (or replace) one record of a side table, durable with the next commit.

        Side records count toward the store limit like messages do. A new record past that limit, or
        while the disk is short (``low_disk``), raises StoreFull, writing nothing; a replacement is
        always written (so a schedule's next run never fails for room). ``counted=False`` is for records
        that let consumers drain a full store (groups, leases): they count, but are never refused."""
        txn = self._write()
        db = self._tables[table]
        if counted and txn.get(key, db=db) is None:
            self.check_room(_accounted(key, value))
        self._do(txn.put, key, value, db=db)
        self._side_stale = True
        self._dirty = True

    def get_record(self, table: str, key: bytes) -> bytes | None:
        return self._txn_for_read().get(key, db=self._tables[table])

    def delete_record(self, table: str, key: bytes) -> bool:
        txn = self._write()
        found = bool(self._do(txn.delete, key, db=self._tables[table]))
        self._side_stale = self._side_stale or found
        self._dirty = self._dirty or found
        return found

    def records(self, table: str, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        """Every record of ``table`` whose key starts with ``prefix``, in key order."""
        cursor = self._txn_for_read().cursor(db=self._tables[table])
        out: list[tuple[bytes, bytes]] = []
        if cursor.set_range(prefix):
            for key, value in cursor:
                if not key.startswith(prefix):
                    break
                out.append((key, value))
        return out

    def save_schedule(self, key: str, record: dict) -> None:
        """Store (or replace) a recurring job, durable with the next commit."""
        self.put_record("schedules", key.encode(), msgpack.packb(record))

    def delete_schedule(self, key: str) -> bool:
        return self.delete_record("schedules", key.encode())

    def schedules(self) -> dict[str, dict]:
        """Every stored recurring job (they are few: read whole at start-up)."""
        return dict(self.read_records("schedules", read_schedule))

    def schedule(self, key: str) -> dict | None:
        """One stored recurring job, or None if it is gone or cannot be read."""
        raw = self.get_record("schedules", key.encode())
        if raw is None:
            return None
        try:
            return read_schedule(key.encode(), raw)[1]
        except UNREADABLE:
            return None

    def read_records(self, table: str, decode, prefix: bytes = b"") -> list:
        """``decode(key, value)`` of every record of ``table`` under ``prefix``. A record it cannot read
        (it raises ValueError, TypeError, KeyError, IndexError, struct.error or a msgpack error) is
        skipped, logged and counted in ``unreadable_records``: one damaged record must not stop the
        server from starting, nor fail every turn that reads the table."""
        out = []
        for key, value in self.records(table, prefix):
            try:
                out.append(decode(key, value))
            except UNREADABLE as exc:
                self.unreadable_records += 1
                log.error(
                    "a record of the store's %s table cannot be read and is skipped (key %r): %s: %s",
                    table,
                    key[:60],
                    type(exc).__name__,
                    exc,
                )
        return out

    # -- checking -----------------------------------------------------------------------------------

    def audit(self, queue: str) -> Iterator[tuple[str, Message | DeadLetter | None]]:
        """Every record of ``queue``, in order: ("message", Message), ("dead", DeadLetter), or (kind,
        None) for one that cannot be read. Read-only: nothing is set aside (``pzq check``, ``pzq dump``)."""
        info = self._queues[queue]
        txn = self._txn_for_read()
        prefix = _U64.pack(info.qid)
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

    # -- disk space ---------------------------------------------------------------------------------

    def watch_disk(self) -> int | None:
        """Check the free space of the store's filesystem (one statvfs); returns it.

        Under ``min_disk_free`` producers are refused ("queue full"). The reserve file is given back
        when a commit fails (``commit``), so that acks, nacks and deletes, which need new pages too
        (copy-on-write), still commit when something else took the rest of the disk. Once there is room
        for it again it is made anew."""
        if not self.min_disk_free and not self.disk_reserve:
            return None
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        if free < self.min_disk_free + self.disk_reserve:
            # LMDB's data file never shrinks: pages freed by acks are reused from inside it, so they
            # count as room too (only looked at when the filesystem itself is short).
            free += self._reusable_bytes()
        if free < self.min_disk_free:
            if not self.low_disk:
                log.warning(
                    "the disk of %s has %d bytes free, under --min-disk-free %d: producers are refused "
                    "until there is room; consumers go on",
                    self.path,
                    free,
                    self.min_disk_free,
                )
            self.low_disk = True
        else:
            if self.low_disk:
                log.warning("the disk of %s has %d bytes free again: producers are served", self.path, free)
            self.low_disk = False
            if (
                st.f_bavail * st.f_frsize >= self.min_disk_free + 2 * self.disk_reserve
                and time.monotonic() >= self._reserve_retry_at
            ):
                self._make_reserve()
        return free

    def _reusable_bytes(self) -> int:
        """Bytes of the data file's pages that no table uses (free for LMDB to reuse)."""
        txn = self._txn_for_read()
        tables = (self._queues_db, self._meta_db, self._messages_db, self._deliveries_db, self._dead_db)
        used = 2 + _pages(self._env.stat()) + sum(_pages(txn.stat(db)) for db in tables)  # 2: the meta pages
        used += self._table_bytes(txn) // self._env.stat()["psize"]
        info = self._env.info()
        return max(0, info["last_pgno"] + 1 - used) * self._env.stat()["psize"]

    def _make_reserve(self) -> bool:
        """The reserve file holds ``disk_reserve`` bytes of the filesystem for the server to give back."""
        if not self.disk_reserve or self._readonly:
            return True
        try:
            if os.path.getsize(self._reserve_path) >= self.disk_reserve:
                return True
        except OSError:
            pass
        try:
            fd = os.open(self._reserve_path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.disk_reserve)
            finally:
                os.close(fd)
        except OSError as exc:
            self._reserve_retry_at = time.monotonic() + RESERVE_RETRY_S
            log.warning(
                "cannot reserve %d bytes in %s (trying again in %d s): %s",
                self.disk_reserve,
                self._reserve_path,
                RESERVE_RETRY_S,
                exc,
            )
            try:
                os.unlink(self._reserve_path)  # no half reserve
            except OSError:
                pass
            return False
        return True

    def _release_reserve(self) -> bool:
        try:
            os.unlink(self._reserve_path)
        except OSError:
            return False
        # Not made again at once: the failed turn's acks come back next turn and need that room.
        self._reserve_retry_at = time.monotonic() + RESERVE_RETRY_S
        log.warning(
            "a commit failed (the disk of %s is full?): its %d-byte reserve was given back, so that "
            "consumers' acks commit next time",
            self.path,
            self.disk_reserve,
        )
        return True

    # -- figures ----------------------------------------------------------------------------------

    def disk_bytes(self) -> int:
        """Bytes of the store's pages in use on disk (the high-water mark of the data file)."""
        return (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
