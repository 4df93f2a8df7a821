"""The queue records: the LMDB environment of a store, its write transaction, and each queue's counters.

``Queues`` is the base of the queue model (``pzq.store.Store``): it opens the environment (checking
the store's format version), owns the commit and its rollback, names and counts the queues, and keeps
the room accounting (store limit, disk). The parts drawn on top of it add one role each:
``messages.py`` (put, scan, take bookkeeping), ``dead_letters.py``, ``previews.py`` (the console's
previews, the audit ``pzq check`` reads). The key layout is drawn in ``layout.py``.

The per-queue counters (count, bytes) live in the ``queues`` record and are written once per commit,
so start-up reads one small record per queue and never scans the messages.
"""

from __future__ import annotations

import collections
import itertools
import logging
import operator
import os
from collections.abc import Callable, Iterable
from typing import Literal, NoReturn, overload

from pzq.errors import StoreDamaged, StoreError, StoreFull, StoreTooNew
from pzq.store.environment import Environment
from pzq.store.layout import FORMAT, QUEUE_TABLES, SIDE_TABLES, U32, U64, UNREADABLE, QueueInfo, parse_message_id
from pzq.store.pages import ADVICE

log = logging.getLogger("pzq.store")


def raise_(exc: Exception) -> NoReturn:
    """For ``env.do(raise_, exc)``: roll the open transaction back and raise StoreError for an LMDB
    error met outside ``env.do`` (the hot paths call LMDB inline)."""
    raise exc


_MISSING = (-1, 0.0)  # (in the journal: the key had no pending count)


_key = operator.itemgetter(0)


def run_all(calls: Iterable) -> None:
    """Run an iterator of calls made for their effect to its end, in C."""
    collections.deque(calls, 0)


class PendingCounts(dict[bytes, tuple[int, float]]):
    """Delivery counts not yet written (key -> (count, monotonic time of the delivery)), with a journal
    of what changed since ``mark()``. A rolled-back turn undoes only its own changes (``undo()``): its
    deliveries never left, but those of earlier turns did, and their counts must not be lost with it."""

    def __init__(self) -> None:
        super().__init__()
        self._undo: dict[bytes, tuple[int, float]] = {}

    def mark(self) -> None:
        """What ``undo()`` goes back to: a turn begins, or a commit made the counts so far durable."""
        self._undo.clear()

    def _note(self, key: bytes) -> None:
        if key not in self._undo:
            self._undo[key] = dict.get(self, key, _MISSING)

    def __setitem__(self, key: bytes, value: tuple[int, float]) -> None:
        self._note(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self._note(key)
        super().__delitem__(key)

    def pop(self, key: bytes, *default):
        if key in self:
            self._note(key)
        return super().pop(key, *default)

    def set_many(self, keys: list[bytes], values: Iterable[tuple[int, float]]) -> None:
        """``self[key] = value`` for each key and value (a take's run of counts), in one call and in C."""
        if self._undo:
            run_all(map(self._undo.setdefault, keys, map(self.get, keys, itertools.repeat(_MISSING))))
        else:  # (the usual first change of a turn: a dict of them at once)
            self._undo = dict(zip(keys, map(self.get, keys, itertools.repeat(_MISSING)), strict=True))
        dict.update(self, zip(keys, values, strict=True))

    def set_new(self, keys: list[bytes], value: tuple[int, float]) -> None:
        """``self[key] = value`` for each of ``keys``, none of which has a pending count (a run of first
        deliveries): one shared value, with no object per key."""
        if self._undo:
            run_all(map(self._undo.setdefault, keys, itertools.repeat(_MISSING)))
        else:
            self._undo = dict.fromkeys(keys, _MISSING)
        dict.update(self, dict.fromkeys(keys, value))

    def pop_many(self, keys: list[bytes]) -> None:
        """``self.pop(key, None)`` for each key (an ack run's counts), in one call and in C."""
        olds = list(map(dict.pop, itertools.repeat(self), keys, itertools.repeat(_MISSING)))
        run_all(map(self._undo.setdefault, keys, olds))  # (the first change of a key is the one kept)

    def undo(self) -> None:
        """Put back every count as it was at ``mark()``."""
        for key, value in self._undo.items():
            if value is _MISSING:
                super().pop(key, None)
            else:
                super().__setitem__(key, value)
        self._undo.clear()


class Queues:
    """Named durable FIFO queues: their environment and counters. Single-threaded: one owner calls every
    method."""

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
        max_implicit: int | None = None,
        verify: bool = False,
    ):
        self.path = os.fspath(path)
        self.max_size = max_size
        self.max_queues = max_queues
        # Queues made by clients' requests at most (None: --max-queues); the rest is kept for named ones
        self.max_implicit = max_queues if max_implicit is None else max_implicit
        self.implicit_count = 0
        self.seq_floor = 1  # a new queue's first seq (meta b"seq_floor")
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
        self._pending_counts = PendingCounts()
        self._meta_dirty = False
        self._total_bytes = 0
        self._side_bytes = 0  # pages of the side tables: schedules, bindings, dedup keys, groups count too
        self._side_stale = False  # a side table changed since _side_bytes was read (which one: unknown)
        self._side_pages: dict[str, int] = {}  # pages of each side table, when they were read
        self._stale_tables: set[str] = set()  # side tables changed since (read again alone: one stat each)
        self._queues: dict[str, QueueInfo] = {}
        self._by_id: dict[int, QueueInfo] = {}
        self._next_qid = 1
        self.format = FORMAT  # the store's format version (read by _load)
        try:
            self._load()
        except BaseException:
            self.env.close()
            raise
        if self.env.verified:
            log.info("%s", self.env.verified)

    # -- lifecycle --------------------------------------------------------------------------------

    def _load(self) -> None:
        self._queues.clear()
        self._by_id.clear()
        with self.env.reading() as txn:
            raw = txn.get(b"format", db=self._meta_db)
            self.format = self._format(raw)
            # An older format (or none written) is marked as this one with the next write. (Format 1 is
            # the first: when a layout changes, the conversion of the older records goes here.)
            self._meta_dirty = (raw is None or self.format < FORMAT) and not self._readonly
            raw = txn.get(b"next_qid", db=self._meta_db)
            self._next_qid = U64.unpack(raw)[0] if raw else 1
            raw = txn.get(b"seq_floor", db=self._meta_db)
            if raw is not None and len(raw) != U64.size:  # (guessing low could hand out seqs again)
                raise StoreDamaged(f"{self.path}/data.mdb: its seq floor record {raw[:16]!r} cannot be read; " + ADVICE)
            self.seq_floor = U64.unpack(raw)[0] if raw else 1
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
            self._read_side(txn, SIDE_TABLES)
        self._dirty_queues.clear()
        self._total_bytes = sum(q.bytes + q.dead_bytes for q in self._queues.values())
        self.implicit_count = sum(q.implicit for q in self._queues.values())

    def _format(self, raw: bytes | None) -> int:
        """The store's format version from its meta record: 1 without one (pzq wrote none before it
        was needed), StoreTooNew past what this pzq reads."""
        if raw is None:
            return 1
        if len(raw) != U64.size or not 1 <= U64.unpack(raw)[0]:
            raise StoreDamaged(f"{self.path}/data.mdb: its format record {raw[:16]!r} cannot be read; " + ADVICE)
        stored = U64.unpack(raw)[0]
        if stored > FORMAT:
            raise StoreTooNew(
                f"{self.path} has store format {stored}, newer than format {FORMAT}, the newest this pzq reads: "
                f"run the newer pzq that wrote it (or restore a backup of format {FORMAT})"
            )
        return stored

    def _side(self) -> int:
        """Bytes of the side tables, read again only after they changed (a lease call writes thousands)."""
        if self._side_stale or self._stale_tables:
            with self.env.reading() as txn:
                self._read_side(txn, SIDE_TABLES if self._side_stale else tuple(self._stale_tables))
        return self._side_bytes

    def _read_side(self, txn, tables: tuple[str, ...]) -> None:
        for name in tables:
            self._side_pages[name] = self.env.pages_of((name,), txn)
        self._side_bytes = sum(self._side_pages.values()) * self.env.page_size
        self._side_stale = False
        self._stale_tables.clear()

    def side_changed(self, table: str | None = None) -> None:
        """A side table's owner wrote (``table``; None: any of them): its pages are counted again when
        next needed (a batch's dedup record each batch: one table's statistics, not every one's)."""
        if table is None:
            self._side_stale = True
        else:
            self._stale_tables.add(table)
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
        pending = self._pending_counts
        due = [
            (key, count)
            for key, (count, since) in pending.items()
            if counts_older_than is None or since <= counts_older_than
        ]
        if not self._dirty and not due:
            self.env.end_clean()  # (a transaction only read in, or nothing at all)
            return False
        txn = self.env.write()
        if due:  # (one call for them all)
            counts = [(key, U32.pack(count)) for key, count in due]
            self.env.do(lambda: txn.cursor(db=self._deliveries_db).putmulti(counts))
        # Only what changed: every extra record written is another B-tree path copied and synced.
        for name in self._dirty_queues:
            self.env.do(txn.put, name.encode(), self._queues[name].pack(), db=self._queues_db)
        if self._meta_dirty:
            self.env.do(txn.put, b"next_qid", U64.pack(self._next_qid), db=self._meta_db)
            self.env.do(txn.put, b"seq_floor", U64.pack(self.seq_floor), db=self._meta_db)
            self.env.do(txn.put, b"format", U64.pack(FORMAT), db=self._meta_db)
            self.format = FORMAT
        self.env.commit()  # (a failure rolls back and calls _rolled_back, then raises StoreError)
        self._dirty = False
        self._dirty_queues.clear()
        # (written: they leave the pending counts unjournaled, since mark() ends the journal here anyway)
        run_all(map(dict.pop, itertools.repeat(pending), map(_key, due)))
        pending.mark()
        self._meta_dirty = False
        return True

    def turn_begins(self) -> None:
        """A turn of the loop begins: a rollback from here on keeps the delivery counts of every earlier
        turn (its deliveries left), and drops only this turn's (they are never sent)."""
        self._pending_counts.mark()

    @property
    def syncs(self) -> int:
        """Commits that wrote pages so far (each one data sync)."""
        return self.env.syncs

    @property
    def meta_syncs(self) -> int:
        """Syncs of a commit's meta page alone (``sync()`` when no later commit carried it)."""
        return self.env.meta_syncs

    @property
    def committed(self) -> int:
        """The last commit that wrote pages (LMDB's transaction id)."""
        return self.env.committed

    @property
    def durable(self) -> int:
        """The last commit known on disk, meta page included (``committed`` once ``sync()`` ran)."""
        return self.env.durable

    def sync(self) -> None:
        """Put the last commit's meta page on disk (see Environment.sync; SyncLost when it fails)."""
        self.env.sync()

    def abort(self) -> None:
        """Drop every write since the last commit, counters included."""
        self.env.abort()

    def _rolled_back(self) -> None:
        """The environment dropped the open transaction: the counters are read again from the disk."""
        self._dirty = False
        self._pending_counts.undo()  # (the counts of deliveries that left in earlier turns stay)
        self._load()

    # -- queues -----------------------------------------------------------------------------------

    @overload
    def queue(self, name: str, create: Literal[True] = True, *, implicit: bool = False) -> QueueInfo: ...
    @overload
    def queue(self, name: str, create: bool, *, implicit: bool = False) -> QueueInfo | None: ...

    def queue(self, name: str, create: bool = True, *, implicit: bool = False) -> QueueInfo | None:
        """The counters of queue ``name`` (created empty on first use unless ``create`` is False).

        ``implicit``: made by a client's request (a produce, a consume, a group), not named by the
        operator: such a queue expires when empty and unused (the broker's sweep), and all of them
        together stay under ``max_implicit``. A queue made without it is explicit and never expires
        (``name_queue`` makes an implicit one explicit)."""
        info = self._queues.get(name)
        if info is None and create:
            if not name or len(name.encode()) > 255:
                raise StoreError(f"queue name must be 1 to 255 bytes: {name!r}")
            if len(self._queues) >= self.max_queues:  # every queue costs memory and a line of figures
                raise StoreFull(f"queue full: there are {len(self._queues)} queues, the most --max-queues allows")
            if implicit and self.implicit_count >= self.max_implicit:  # (the rest is kept for named queues)
                raise StoreFull(
                    f"queue full: {self.implicit_count} queues made by clients' requests, the most of "
                    "--max-queues they may take (the rest is kept for configured queues)"
                )
            info = QueueInfo(name, self._next_qid, self.seq_floor, implicit=implicit)
            self.implicit_count += implicit
            self._next_qid += 1
            self._queues[name] = info
            self._by_id[info.qid] = info
            self.env.write()
            self._dirty = self._meta_dirty = True
            self._dirty_queues.add(name)
        return info

    def name_queue(self, name: str) -> QueueInfo:
        """Queue ``name`` as the operator names it (``--queue``): made explicit, or made so if a
        client's request made it, so that it never expires."""
        info = self.queue(name)
        if info.implicit:
            self.implicit_count -= 1
            info.implicit = False
            self.env.write()
            self._dirty = True
            self._dirty_queues.add(info.name)
        return info

    def implicit_names(self) -> list[str]:
        """The names of every implicit queue (the broker's sweep walks them a share per turn)."""
        return [info.name for info in self._queues.values() if info.implicit]

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

    # -- accounting -------------------------------------------------------------------------------

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
