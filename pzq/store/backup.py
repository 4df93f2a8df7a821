"""`pzq backup` and `pzq restore`: a consistent, compacted copy of a store that a server is writing, and
putting one back.

The copy is LMDB's own (``mdb_env_copyfd2`` with compaction), taken by the backup command's process,
which opens the store read-only beside the server as `pzq check` does: the copy is one read transaction,
so it holds exactly what was committed when it began, and the server's loop never waits for it. LMDB
writes it into a pipe that this module drains into the file, so the bytes copied so far are counted
(progress) and a full disk stops the copy instead of leaving a torn file.

A backup is a directory holding one ``data.mdb`` (so `pzq check BACKUP` reads it like any store). It is
written under a hidden temporary name beside its destination, fsync'd, and renamed into place only when
whole: a backup that is there is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

from pzq.errors import DiskFull, StoreError, StoreLocked
from pzq.store.disk import no_room
from pzq.store.environment import Environment
from pzq.store.layout import QUEUE_TABLES, SIDE_TABLES
from pzq.store.locks import lock_exclusively

DATA = "data.mdb"
HEADROOM = 64 << 20  # room left on the backup's filesystem beyond the copy itself (bytes)
_CHUNK = 1 << 20
# The copy is written to disk as it goes, in steps of this many bytes, and dropped from the page cache:
# gigabytes left dirty for one fsync at the end would stall the server's own fsyncs behind them, and
# a copy read once would push the server's pages out of memory.
SYNC_EVERY = 8 << 20

Progress = Callable[[int, int, float], None]  # (bytes copied, bytes expected, seconds since the copy began)


@dataclasses.dataclass(frozen=True)
class Copied:
    """What a backup or restore wrote."""

    path: str
    bytes: int  # of the copy
    store_bytes: int  # of the source's data file
    seconds: float


def _plain_errors(func):
    """An OSError the work meets (a directory this user may not write, a link where a file should be)
    becomes one StoreError line naming the file."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTDIR) and (file := _file_on_the_way(exc.filename)):
                raise StoreError(f"{file} is not a directory") from None
            error = DiskFull if no_room(exc) else StoreError  # (a full disk has its own exit status)
            raise error(f"{exc.filename or args[0]}: {exc.strerror or exc}") from None

    return wrapper


def _file_on_the_way(path: object) -> str | None:
    """The nearest existing ancestor of ``path`` (or itself) when it is not a directory ("File exists"
    and "Not a directory" alone do not say which)."""
    name = os.fspath(path) if isinstance(path, str | os.PathLike) else ""
    while name and name != os.path.dirname(name):
        if os.path.lexists(name):
            return None if os.path.isdir(name) else name
        name = os.path.dirname(name)
    return None


@_plain_errors
def backup(
    source: str,
    dest: str,
    *,
    replace: bool = False,
    progress: Progress | None = None,
    every_s: float = 2.0,
    server_keeps: int = 0,
) -> Copied:
    """Copy the store at ``source`` (a server may be running on it) into the new directory ``dest``.

    Refuses an existing ``dest`` unless ``replace`` (and then only a store or backup no server runs on),
    and a filesystem without room for the copy plus ``HEADROOM`` (plus ``server_keeps``, the free room
    the server keeps, its min_disk_free and disk_reserve, when that is the store's own filesystem).
    ``progress`` is called about every ``every_s`` seconds while the copy runs."""
    source, dest = os.path.abspath(source), os.path.abspath(dest)
    if not os.path.isfile(os.path.join(source, DATA)):
        raise StoreError(f"{source}: no store there (no {DATA}): --database names the server's store directory")
    real_source = os.path.realpath(source)
    if os.path.realpath(dest) == real_source or os.path.realpath(dest).startswith(real_source + os.sep):
        raise StoreError(f"{dest}: a backup cannot go into the store it copies ({source})")
    if os.path.lexists(dest) and not replace:
        raise StoreError(f"{dest} exists: give a new name, or --force to replace that backup")
    parent = os.path.dirname(dest)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    lock_existed = os.path.exists(os.path.join(source, "lock.mdb"))
    held = hold_off_writers(source)
    env = Environment(source, QUEUE_TABLES + SIDE_TABLES, max_size=0, readonly=True)
    try:
        expected, store_bytes = env.used_bytes(), os.path.getsize(os.path.join(source, DATA))
        st = os.statvfs(parent)
        spare = HEADROOM
        if os.stat(parent).st_dev == os.stat(source).st_dev:  # (what the copy takes, the server no longer has)
            spare = max(spare, server_keeps)
        if st.f_bavail * st.f_frsize < expected + spare:
            why = " (the server's min_disk_free + disk_reserve: its own filesystem)" if spare > HEADROOM else ""
            raise DiskFull(
                f"{parent} has {st.f_bavail * st.f_frsize >> 20} MiB free; the copy needs about {expected >> 20} MiB "
                f"plus {spare >> 20} MiB to spare{why}: free room there or back up elsewhere"
            )
        work = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.partial-", dir=parent)
        try:
            started = time.monotonic()
            written = _copy(env, os.path.join(work, DATA), expected, progress, every_s)
            _settle(work, dest, replace)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    finally:
        env.close()
        if held is not None:
            os.close(held)
        if not lock_existed:
            _own_like(os.path.join(source, "lock.mdb"), source)
    return Copied(dest, written, store_bytes, time.monotonic() - started)


def hold_off_writers(source: str) -> int | None:
    """On a filesystem this process sees read-only, LMDB opens without its lock file: a reader's snapshot
    has no reader slot, so a server would reuse the pages being read (a backup torn, a sound store
    reported damaged by `pzq check`). There a store is read only while no server runs, holding one off (a
    shared lock on the returned descriptor, to close when done); None where there is no such danger."""
    try:
        if not os.statvfs(source).f_flag & os.ST_RDONLY or not os.path.isfile(os.path.join(source, DATA)):
            return None
    except OSError:
        return None  # (the caller says what is wrong with the path)
    try:
        return lock_exclusively(os.path.join(source, DATA), shared=True)
    except StoreLocked:
        raise StoreError(
            f"{source} is read-only to this process (a read-only mount, or a systemd unit's ProtectSystem= "
            f"without ReadWritePaths={source}) and a server runs on it: a read there holds no snapshot the "
            "server sees, and could be torn. Give this process write access there (a reader slot in lock.mdb)"
        ) from None


def _copy(env: Environment, target: str, expected: int, progress: Progress | None, every_s: float) -> int:
    """LMDB writes into a pipe from a thread (it lets go of the GIL while it copies); this thread writes
    the file, counts, reports and fsyncs. A write that fails closes the pipe, which ends LMDB's copy."""
    read_end, write_end = os.pipe()
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            env.copy_compacted(write_end)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, which raises it
            failed.append(exc)
        finally:
            os.close(write_end)

    copier = threading.Thread(target=produce, name="pzq-backup-copy", daemon=True)
    copier.start()
    written, synced, started = 0, 0, time.monotonic()
    next_report = started + every_s
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(read_end, _CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                written += len(chunk)
                if written - synced >= SYNC_EVERY:
                    _flush(fd, written)
                    synced = written
                if progress is not None and time.monotonic() >= next_report:
                    progress(written, expected, time.monotonic() - started)
                    next_report = time.monotonic() + every_s
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        where = os.path.dirname(os.path.dirname(target))  # (the backup's directory, not its temporary one)
        if no_room(exc):
            raise DiskFull(f"{where}: the disk filled during the copy; no backup was kept") from None
        raise StoreError(f"{where}: writing the copy failed: {exc.strerror or exc}; no backup was kept") from None
    finally:
        os.close(read_end)  # (if the copy is still writing, it now fails: it ends either way)
        copier.join()
    if failed:
        raise failed[0]
    return written


def _flush(fd: int, written: int) -> None:
    os.fdatasync(fd)
    if hasattr(os, "posix_fadvise"):  # (not on macOS)
        os.posix_fadvise(fd, 0, written, os.POSIX_FADV_DONTNEED)


def _settle(work: str, dest: str, replace: bool) -> None:
    """Move the finished copy into place; an existing backup that is replaced goes only once the new one
    is there."""
    _fsync_dir(work)
    old = None
    if os.path.lexists(dest):  # (replace: checked by the caller)
        if not os.path.isdir(dest) or os.path.islink(dest) or not _store_like(dest):
            raise StoreError(f"{dest} is not a pzq backup (no {DATA}, or other files): it is not replaced")
        lock = _lock(os.path.join(dest, DATA), dest)
        try:
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.old-", dir=os.path.dirname(dest))
            os.rename(dest, os.path.join(old, "backup"))
        finally:
            os.close(lock)
    os.rename(work, dest)
    _fsync_dir(os.path.dirname(dest))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@_plain_errors
def restore(backup_path: str, database: str, *, force: bool = False) -> Copied:
    """Put the backup at ``backup_path`` (a backup's directory, or its data.mdb) in place as the store of
    ``database``, which must be empty or new unless ``force``; no server may run on it. The copy is read
    back (LMDB's header and size checks) before it replaces anything."""
    source = os.path.join(backup_path, DATA) if os.path.isdir(backup_path) else backup_path
    if not os.path.isfile(source):
        raise StoreError(f"{backup_path}: no backup there (no {DATA})")
    database = os.path.abspath(database)
    if os.path.realpath(source) == os.path.realpath(os.path.join(database, DATA)):
        raise StoreError(f"{backup_path} is the store of {database} itself")
    if os.path.isdir(database) and os.listdir(database) and not force:
        raise StoreError(
            f"{database} is not empty: restore into a new directory, or --force to replace its store "
            "(stop the server on it first)"
        )
    os.makedirs(database, mode=0o700, exist_ok=True)
    current = os.path.join(database, DATA)
    started = time.monotonic()
    lock = _lock(current, database)
    try:
        for name in os.listdir(database):  # a restore killed here before (a live one would hold the lock)
            if name.startswith(".restore-"):
                shutil.rmtree(os.path.join(database, name), ignore_errors=True)
        work = tempfile.mkdtemp(prefix=".restore-", dir=database)
        try:
            copy = os.path.join(work, DATA)
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)  # (the store's mode)
            with open(source, "rb") as src, open(fd, "wb") as dst:
                _refuse_served(src.fileno(), backup_path)
                shutil.copyfileobj(src, dst, _CHUNK)
                dst.flush()
                os.fsync(dst.fileno())
            _read_back(work, copy, source)
            with contextlib.suppress(FileNotFoundError):  # (the readers' table of the store it replaces)
                os.unlink(os.path.join(database, "lock.mdb"))
            os.replace(copy, current)
            _own_like(current, database)
            _fsync_dir(database)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        if os.path.exists(current) and os.path.getsize(current) == 0:
            os.unlink(current)  # (our placeholder: the directory is as it was)
        raise
    finally:
        os.close(lock)
    size = os.path.getsize(current)
    return Copied(database, size, size, time.monotonic() - started)


def _refuse_served(fd: int, backup_path: str) -> None:
    """A store a server runs on (its exclusive flock) copied byte by byte is torn: refused. The shared lock
    held while copying keeps a server from starting on it meanwhile."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StoreLocked(
            f"a server runs on {backup_path}: a copy of its file would be torn; take one with "
            f"`pzq backup DEST --database {backup_path}` and restore that"
        ) from None


def _read_back(work: str, copy: str, source: str) -> None:
    """Open the copy as a store: a torn or foreign file is refused here, named by the path the operator
    gave (the copy's temporary name is gone by the time the error is shown, and the store's own advice,
    "restore it from a backup", is not for someone restoring one)."""
    try:
        Environment(work, (), max_size=0, readonly=True).close()
    except StoreError as exc:
        what = str(exc).replace(copy, source)
        what = re.split(r"[.;:] [Rr]estore it from a backup", what)[0]
        raise type(exc)(f"{what}: not a backup pzq can restore; nothing was replaced") from None


def _lock(data_file: str, database: str) -> int:
    """The exclusive lock a server takes on its data file, on ``data_file`` (an empty one is made if
    there is none: a server starting meanwhile refuses an empty data file). StoreLocked while a server
    runs on it."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(data_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    try:
        return lock_exclusively(data_file)
    except StoreLocked:
        raise StoreLocked(f"a server runs on {database}: stop it first") from None


def _store_like(path: str) -> bool:
    """A directory that holds a store or a backup and nothing else pzq would not have put there."""
    names = set(os.listdir(path))
    return DATA in names and names <= {DATA, "lock.mdb", "reserve"}


def _own_like(path: str, directory: str) -> None:
    """Give ``path`` the owner of ``directory`` when root made it, so that the service user (who owns the
    store) can still open it: LMDB refuses a lock file it cannot write."""
    if os.geteuid() != 0 or not os.path.exists(path):
        return
    st = os.stat(directory)
    os.chown(path, st.st_uid, st.st_gid)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
