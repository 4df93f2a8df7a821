"""The LMDB boundary: the one environment, its named databases, and the write transaction.

Nothing outside this package imports lmdb (the page walk, ``pages.py``, is its other user). The loop
owns the write transaction: every write of a turn joins the one open transaction (``write()``), and
``commit()`` ends it with one synchronous write (unless ``sync=False``): LMDB syncs the data pages
and writes the meta page that names them without waiting for it (MDB_NOMETASYNC), so a commit is on
disk once a later commit's data sync (or ``sync()``) has carried its meta page too. ``committed`` and
``durable`` name the last commit and the last one known on disk; the loop releases what a commit's
output depends on only when ``durable`` reaches it (docs/semantics.md, "one sync a commit"). A failed
write or commit rolls all of it back and tells the listeners (``on_abort``) so that their in-memory
state follows. Reads go through ``reading()``, a ``with`` block that sees the turn's own uncommitted
writes, or a read-only snapshot outside a turn.

Also here, because they are about the file and not about queues: taking the exclusive lock that keeps a
second server off the store (``locks.py``), the start-up checks of a damaged or truncated file
(``opening.py``), the disk watch (free space, and a reserve file given back when a commit fails for
room: ``disk.py``, with the lock file's blocks allocated before LMDB maps it) and the reader slots of
dead processes cleared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import lmdb

from pzq.errors import DiskFull, StoreDamaged, StoreError, SyncLost
from pzq.store import opening, readers
from pzq.store.disk import LOCK_FILE, LOCK_FILE_BYTES, Reserve, allocate_lock_file, disk_full, no_room
from pzq.store.locks import lock_exclusively
from pzq.store.pages import verify_pages

log = logging.getLogger("pzq.store")

STALE_READERS_S = 10  # how often the server clears the reader slots of processes that died

# Python errors a write may raise from inside LMDB, every one of which leaves the transaction unusable.
LmdbError = lmdb.Error
KeyExists = lmdb.KeyExistsError


def raise_(exc: Exception) -> NoReturn:
    """For ``env.do(raise_, exc)``: roll the open transaction back and raise StoreError for an LMDB
    error met outside ``env.do`` (the hot paths call LMDB inline)."""
    raise exc


def pages(stat: Any) -> int:  # (py-lmdb types it as a TypedDict)
    """Pages one B-tree uses, from LMDB's statistics of it."""
    return stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]


class Environment:
    """One LMDB environment with the named databases ``names``. Single-threaded: one owner."""

    def __init__(
        self,
        path: str,
        names: tuple[str, ...],
        *,
        max_size: int,
        sync: bool = True,
        readonly: bool = False,
        min_disk_free: int = 0,
        disk_reserve: int = 0,
        verify: bool = False,
    ):
        self.path = path
        self.readonly = readonly
        self.min_disk_free = min_disk_free
        self.disk_reserve = disk_reserve
        self.low_disk = False  # free space is under min_disk_free: producers are refused
        self.syncs = 0  # commits that wrote pages (each one data sync)
        self.meta_syncs = 0  # syncs of a meta page alone (sync(): no later commit came to carry it)
        self.hard_sync = sync and not readonly
        self.committed = self.durable = 0  # (read from the file once it is open: close() may come first)
        self.on_abort: list[Callable[[], None]] = []  # told when the open transaction was rolled back
        self.reserve = Reserve(path, disk_reserve, readonly)
        self._readers_checked_at = 0.0  # monotonic time of the last reader_check
        self._readers_seen: dict[tuple[str, str], float | None] = {}  # (pid, txnid): first seen (readers.py)
        self.verified = ""  # what the page walk found, when it ran
        self._lock_fd: int | None = None
        self._txn: lmdb.Transaction | None = None
        data_file = os.path.join(path, "data.mdb")
        stored = opening.stored_size(path, data_file, readonly=readonly)
        self.map_cap = opening.map_cap(max_size, stored)
        opening.make_directory(path, readonly=readonly, existed=bool(stored))
        self._open(data_file, stored, sync)
        stored = self._check_size(data_file, stored)
        try:
            self._lock_and_tables(data_file, stored, names, verify)
        except (lmdb.Error, OSError) as exc:
            self.close()
            raise opening.open_failed(path, exc, readonly=readonly, existed=bool(stored)) from None
        except StoreError:
            self.close()
            raise
        self.page_size: int = self._env.stat()["psize"]
        flags = self._env.flags()
        if flags["writemap"] or flags["map_async"]:  # (not input: a build of LMDB or py-lmdb that ignored us)
            self.close()
            raise StoreError(f"{path}: LMDB opened with writemap or map_async, which the durability argument excludes")
        # The last commit (LMDB's transaction id) and the last known on disk: at open, what the file holds
        self.committed = self.durable = int(self._env.info()["last_txnid"])

    def _open(self, data_file: str, stored: int, sync: bool) -> None:
        """LMDB's environment, its lock file's blocks allocated first."""
        path, readonly = self.path, self.readonly
        locked = allocate_lock_file(path)  # (else LMDB's first write into it on a full disk: SIGBUS)
        if not locked:
            if not readonly:
                raise disk_full(path, f"no room for the {LOCK_FILE} of its readers (8 KiB)")
            # A reader without the lock file has no reader slot: a server would reuse the pages it
            # reads, so it reads only while no server can start on the store (a shared flock)
            self._lock_fd = opening.hold_off_servers(path, data_file)
        made = not os.path.lexists(data_file)
        try:
            # The whole cap is reserved as address space only: LMDB's data file still grows page by page
            # as data is written, and no single turn, however large, can run out of map mid-way.
            # mode 0600: the data and lock files are the owner's alone, whatever the umask.
            self._env = lmdb.open(
                path,
                map_size=self.map_cap,
                max_dbs=16,
                sync=sync,
                metasync=False,  # (one synchronous write a commit: the next one carries the meta page)
                writemap=False,  # (a write through the map reaches the disk whenever the kernel likes)
                map_async=False,
                readonly=readonly,
                lock=locked,
                meminit=False,
                mode=0o600,
            )
        except lmdb.Error as exc:
            self._unlock()
            if made and not readonly:  # (an empty data file left would read as a truncated store next time)
                opening.remove_new(path)
            raise opening.open_failed(path, exc, readonly=readonly, existed=bool(stored)) from None
        if locked and os.path.getsize(os.path.join(path, LOCK_FILE)) > LOCK_FILE_BYTES and not allocate_lock_file(path):
            self.close()  # (an LMDB that sizes its lock file bigger: its slots past ours need blocks too)
            raise disk_full(path, f"no room for the {LOCK_FILE} of its readers")

    def _check_size(self, data_file: str, stored: int) -> int:
        """The data file's size read again after the meta page, refused if its pages run past its end."""
        needed = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        # The size is read again after the meta page: a live writer (pzq check beside a running server)
        # only ever grows the file, and writes pages before the meta page that names them.
        stored = os.path.getsize(data_file) if stored else 0
        if stored and stored < needed:  # reading a page past the end would kill the process (SIGBUS)
            self.close()
            raise StoreDamaged(
                f"{data_file} is truncated: {stored} bytes, but its pages need {needed}. Restore it "
                "from a backup, or move the directory aside to start with an empty store"
            )
        return stored

    def _lock_and_tables(self, data_file: str, stored: int, names: tuple[str, ...], verify: bool) -> None:
        """A server's exclusive lock, private files and the page walk; then the named databases."""
        if not self.readonly:
            self._lock_fd = lock_exclusively(data_file)
            for name in ("data.mdb", "lock.mdb"):  # made 0644 by an earlier pzq: make them private
                os.chmod(os.path.join(self.path, name), 0o600)
            if verify and stored:
                started = time.monotonic()
                records = verify_pages(self.path)
                # (logged by the store once it read the rest: a store it refuses says one line only)
                self.verified = f"{data_file} verified: {records} records in {time.monotonic() - started:.2f} s"
        if self.readonly:  # (a store older than a table has none: reading it finds nothing)
            self.dbs = {name: db for name in names if (db := self._open_table(name)) is not None}
        else:  # (one transaction: a new store's tables in one commit and one sync, not one each)
            with self._env.begin(write=True) as txn:
                self.dbs = {name: self._env.open_db(name.encode(), txn=txn, create=True) for name in names}

    def _open_table(self, name: str) -> Any:
        try:
            return self._env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            return None

    def close(self) -> None:
        """Close the environment (what is not committed is lost; what is, is synced) and release the lock."""
        if self._env is not None:
            if self.durable != self.committed:  # (LMDB's close does not sync the last meta page)
                try:
                    self._env.sync(True)
                except lmdb.Error as exc:  # (closing anyway: the process ends; its last commit may not survive a cut)
                    log.error("%s: the last commit's sync failed at close: %s", self.path, exc)
            self._env.close()
            self._env = None  # type: ignore[assignment]  # (closed: every later call fails, close does nothing)
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    @property
    def closed(self) -> bool:
        return self._env is None

    # -- the write transaction --------------------------------------------------------------------

    @property
    def writing(self) -> bool:
        """True while a write transaction is open."""
        return self._txn is not None

    def write(self) -> lmdb.Transaction:
        """The open write transaction (begun on first use)."""
        if self._txn is None:
            if self.readonly:
                raise StoreError("the store is open read-only")
            self._txn = self._env.begin(write=True)
        return self._txn

    def do(self, op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one LMDB write; a failure rolls the whole open transaction back (LMDB demands it)."""
        try:
            return op(*args, **kwargs)
        except lmdb.MapFullError as exc:
            self.abort()
            raise StoreError("the LMDB map is full; the open transaction was rolled back") from exc
        except lmdb.Error as exc:
            self.abort()
            raise StoreError(f"write failed, the open transaction was rolled back: {exc}") from exc

    def commit(self) -> None:
        """End the open write transaction durably (nothing to do without one)."""
        txn, self._txn = self._txn, None
        if txn is None:
            return
        try:
            txn.commit()
        except lmdb.Error as exc:
            txn.abort()
            self._aborted()
            if self.reserve.release():  # most likely the disk is full: give the next commit room
                self.low_disk = True
            # (a DiskFull is a StoreError: a serving loop goes on; a start that cannot commit exits 6.
            # With a meta page not known on disk, the failed sync may have dropped its write: SyncLost)
            error = SyncLost if self.durable != self.committed else DiskFull if no_room(exc) else StoreError
            raise error(f"commit failed, this transaction was rolled back: {exc}") from exc
        last = int(self._env.info()["last_txnid"])
        if last != self.committed:  # (LMDB writes nothing, and syncs nothing, for a transaction that wrote nothing)
            # Its data sync carried the previous commit's meta page to the disk; its own waits for the next
            self.durable = self.committed if self.hard_sync else last
            self.committed = last
            self.syncs += 1

    def sync(self) -> None:
        """Put the last commit's meta page on disk (one fdatasync), when no later commit will. Raises
        SyncLost when the sync fails: the kernel may have dropped that page's write, and what waits for
        it must never be sent (the server stops and starts again from the disk)."""
        if self.durable == self.committed:
            return
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise SyncLost(f"the sync of commit {self.committed} failed: {exc}") from exc
        self.durable = self.committed
        self.meta_syncs += 1

    def end_clean(self) -> None:
        """End an open transaction that wrote nothing (no listener needs telling)."""
        txn, self._txn = self._txn, None
        if txn is not None:
            txn.abort()

    def abort(self) -> None:
        """Drop every write since the last commit."""
        txn, self._txn = self._txn, None
        if txn is not None:
            txn.abort()
        self._aborted()

    def _aborted(self) -> None:
        for listener in self.on_abort:
            listener()

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        """A transaction to read in: the open write transaction (its writes are seen), or a read-only
        snapshot that ends with the block. (Typed Any: py-lmdb types every value bytes | memoryview,
        but pzq never asks for buffers, so they are bytes.)"""
        if self._txn is not None:
            yield self._txn
            return
        with self._env.begin() as txn:
            yield txn

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Any]:
        """A read-only transaction of what is committed, whose values are memoryviews into the map
        (nothing is copied until sliced): for looking at the start of big records. py-lmdb opens every
        environment with MDB_NOTLS, so it may be open beside the loop's write transaction."""
        with self._env.begin(buffers=True) as txn:
            yield txn

    # -- figures ----------------------------------------------------------------------------------

    def pages_of(self, names: tuple[str, ...], txn: lmdb.Transaction) -> int:
        """Pages the B-trees of ``names`` fill (statistics only: no record is read)."""
        return sum(pages(txn.stat(self.dbs[name])) for name in names)

    def disk_bytes(self) -> int:
        """Bytes of the store's pages in use on disk (the high-water mark of the data file)."""
        return (self._env.info()["last_pgno"] + 1) * self.page_size

    # -- disk space ---------------------------------------------------------------------------------

    def watch_disk(self) -> int | None:
        """Check the free space of the store's filesystem (one statvfs); returns it.

        Under ``min_disk_free`` producers are refused ("queue full"). The reserve file is given back
        when a commit fails (``commit``), so that acks, nacks and deletes, which need new pages too
        (copy-on-write), still commit when something else took the rest of the disk. Once there is room
        for it again it is made anew."""
        self._clear_dead_readers()
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
                and time.monotonic() >= self.reserve.retry_at
            ):
                self.reserve.make()
        return free

    def _clear_dead_readers(self) -> None:
        """A reader killed in a transaction (`kill -9` of a `pzq backup`) keeps its slot, and LMDB keeps
        every page it could see: the store would grow without end. Cleared (and one alive but stopped
        named) every STALE_READERS_S: readers.py."""
        if self.readonly or time.monotonic() < self._readers_checked_at + STALE_READERS_S:
            return
        self._readers_checked_at = time.monotonic()
        readers.sweep(self._env, self.path, self._readers_seen, self._readers_checked_at)

    def _reusable_bytes(self) -> int:
        """Bytes of the data file's pages that no database uses (free for LMDB to reuse)."""
        return max(0, self.disk_bytes() - self.used_bytes())

    def used_bytes(self) -> int:
        """Bytes of the pages the open tables fill (about what a compacted copy of them holds)."""
        with self.reading() as txn:
            used = 2 + pages(self._env.stat()) + self.pages_of(tuple(self.dbs), txn)  # 2: the meta pages
        return used * self.page_size

    def copy_compacted(self, fd: int) -> None:
        """Write a compacted copy of what is committed to ``fd`` (`pzq backup`). LMDB copies in a read
        transaction of its own: a writer goes on, but cannot reuse the pages it frees until the copy ends."""
        try:
            self._env.copyfd(fd, compact=True)
        except lmdb.Error as exc:
            raise StoreError(f"copying the store at {self.path} failed: {exc}") from exc
