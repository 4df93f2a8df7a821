"""The store's core: the environment, the commit, and the counters every verb keeps (each queue's count
and bytes, the store's accounted total, the delivery counts pending, room).

``Core`` opens the environment and the queues' metadata (``catalog.py``), owns the commit and its
rollback, and keeps the room accounting (store limit, disk). The verbs drawn on it are ``records.py``
(a message at a time) and ``runs.py`` (runs of them, the hot paths); the parts the store holds
(bodies, drops, dead letters, previews, side tables) are handed the core and hook into it:
``before_commit``/``after_commit`` around each commit, ``on_load`` after the counters are read
(at open and after a rollback), ``env.on_abort`` when a turn is rolled back.
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
from collections.abc import Callable
from typing import Literal, overload

from pzq.errors import StoreFull
from pzq.store.catalog import Catalog
from pzq.store.environment import Environment
from pzq.store.layout import KEY, QUEUE_TABLES, SIDE_TABLES, U32, QueueInfo, accounted, message_id
from pzq.store.pending import PendingCounts, run_all

log = logging.getLogger("pzq.store")

_key = operator.itemgetter(0)


class Core:
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
        self.min_disk_free = min_disk_free
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
        self.catalog = Catalog(self.env, max_queues=max_queues, max_implicit=max_implicit)
        self.catalog.wrote = self.wrote  # (its shard and partition records: the next commit has work)
        # (the catalog's own dicts and set: a lookup on a hot path is one dict get, as it always was)
        self._queues, self._by_id, self._dirty_queues = self.catalog.by_name, self.catalog.by_id, self.catalog.dirty
        dbs = self.env.dbs
        self._messages_db, self._deliveries_db, self._damaged_db = dbs["messages"], dbs["deliveries"], dbs["damaged"]
        self.before_commit: list[Callable[[], None]] = []  # parts' writes that go with every commit
        self.after_commit: list[Callable[[], None]] = []  # told once a commit is made (or had nothing to do)
        self.on_load: list[Callable[[], None]] = []  # told once the counters were read again
        self._unreadable: list[tuple[QueueInfo, bytes, str]] = []  # found by decoding, for set_aside
        self.on_set_aside: list[Callable[[int, int], None]] = []  # told (qid, seq) of each message set aside
        self.damaged_total = 0
        self.unreadable_records = 0  # side records skipped by read_records
        self._dirty = False
        # Delivery counts not yet written: key -> (count, monotonic time of the delivery).
        self._pending_counts = PendingCounts()
        self._total_bytes = 0
        self._side_bytes = 0  # pages of the side tables: schedules, bindings, dedup keys, groups count too
        self._side_stale = False  # a side table changed since _side_bytes was read (which one: unknown)
        self._side_pages: dict[str, int] = {}  # pages of each side table, when they were read
        self._stale_tables: set[str] = set()  # side tables changed since (read again alone: one stat each)
        try:
            self._load()
        except BaseException:
            self.env.close()
            raise

    # -- lifecycle --------------------------------------------------------------------------------

    def _load(self) -> None:
        self.catalog.load()
        self._total_bytes = sum(q.bytes + q.dead_bytes for q in self._queues.values())
        with self.env.reading() as txn:
            self._read_side(txn, SIDE_TABLES)
        for listener in self.on_load:
            listener()

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
        return self._dirty or bool(self._pending_counts) or bool(self._dirty_queues)

    def commit(self, counts_older_than: float | None = None) -> bool:
        """End the open write transaction durably. Returns True if anything was written.

        Delivery counts are written too: all of them, or with ``counts_older_than`` (a monotonic time)
        only those of deliveries made before it. Younger ones stay pending, since most deliveries are
        acked within a millisecond and their counts then never need a write.
        """
        for hook in self.before_commit:
            hook()
        wrote = self._commit(counts_older_than)
        for hook in self.after_commit:
            hook()
        return wrote

    def _commit(self, counts_older_than: float | None) -> bool:
        pending = self._pending_counts
        due = [
            (key, count)
            for key, (count, since) in pending.items()
            if counts_older_than is None or since <= counts_older_than
        ]
        if not self._dirty and not due and not self._dirty_queues:
            # (a transaction only read in, or nothing at all; meta records alone wait for a write)
            self.env.end_clean()
            return False
        txn = self.env.write()
        if due:  # (one call for them all)
            counts = [(key, U32.pack(count)) for key, count in due]
            self.env.do(lambda: txn.cursor(db=self._deliveries_db).putmulti(counts))
        self.catalog.write(txn)
        self.env.commit()  # (a failure rolls back and calls _rolled_back, then raises StoreError)
        self._dirty = False
        self.catalog.committed()
        # (written: they leave the pending counts unjournaled, since mark() ends the journal here anyway)
        run_all(map(dict.pop, itertools.repeat(pending), map(_key, due)))
        pending.mark()
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
        together stay under ``catalog.max_implicit``. A queue made without it is explicit and never
        expires (``catalog.name_queue`` makes an implicit one explicit)."""
        info = self._queues.get(name)
        if info is None and create:
            info = self.catalog.create(name, implicit=implicit)
        return info

    def queue_by_id(self, qid: int) -> QueueInfo | None:
        return self._by_id.get(qid)

    def queues(self) -> list[QueueInfo]:
        return list(self._queues.values())

    # -- accounting -------------------------------------------------------------------------------

    @property
    def stored_bytes(self) -> int:
        """Accounted bytes of every message, dead letter and side record: what the store limit applies to."""
        return self._total_bytes + self._side()

    def account(self, info: QueueInfo, count: int = 0, size: int = 0, dead_count: int = 0, dead_size: int = 0) -> None:
        """Add to the counters of queue ``info`` (and the store's total): its record goes with the commit."""
        info.count += count
        info.bytes += size
        info.dead_count += dead_count
        info.dead_bytes += dead_size
        self._total_bytes += size + dead_size
        self._dirty_queues.add(info.name)
        self._dirty = True

    def charge(self, size: int) -> None:
        """Add ``size`` bytes (negative: take them off) to the store's total alone, written in the open
        transaction (a body's chunks before its record names them; a queue being deleted)."""
        self._total_bytes += size
        self._dirty = True

    def wrote(self) -> None:
        """A part wrote in the open transaction: the next commit has work."""
        self._dirty = True

    def forget_counts(self, prefix: bytes) -> None:
        """Drop the pending delivery counts of every key under ``prefix`` (a queue deleted)."""
        for key in [k for k in self._pending_counts if k[:8] == prefix]:
            del self._pending_counts[key]

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

    # -- records read --------------------------------------------------------------------------------

    def deliveries(self, key: bytes, txn) -> int:
        """How often the message of ``key`` was delivered: its pending count, else its written one."""
        pending = self._pending_counts.get(key)
        if pending is not None:
            return pending[0]
        raw = txn.get(key, db=self._deliveries_db)
        # (a damaged count reads as 0: the message is still delivered, its retry count starts over)
        return U32.unpack(raw)[0] if raw and len(raw) == 4 else 0

    def set_aside(self) -> None:
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
            self.account(info, -1, -accounted(key, value))
            self.damaged_total += 1
            for listener in self.on_set_aside:
                listener(info.qid, KEY.unpack(key)[1])
            log.error(
                "message %s of queue %r cannot be read (%s): set aside in the store's damaged table "
                "(`pzq dump` copies it out); the queue goes on",
                message_id(info.qid, KEY.unpack(key)[1]),
                info.name,
                reason,
            )
