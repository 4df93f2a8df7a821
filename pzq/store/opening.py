"""Opening a store's files: the checks before LMDB maps them, and why an open failed, in one line.

A data file that is empty, truncated, a link or not a file is refused before LMDB sees it (LMDB would
take an empty file for a new store, follow a planted link, or read a page past the end: SIGBUS); the
directory is made owner-only; a reader without a lock file holds servers off with a shared flock; and
``open_failed`` names the error class whose exit status tells the operator what to do (a permission,
damage, a full disk). ``environment.Environment`` calls these while it opens.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

import lmdb

from pzq.errors import StoreDamaged, StoreDenied, StoreError, StoreLocked
from pzq.store.disk import LOCK_FILE, disk_full, no_room
from pzq.store.locks import lock_exclusively

log = logging.getLogger("pzq.store")

MIN_DATA_FILE = 2 * 4096  # LMDB's two meta pages (4 KiB pages on every platform pzq runs on)


def stored_size(path: str, data_file: str, *, readonly: bool) -> int:
    """The data file's size (0: none yet), refusing a link, a directory in its place, or a file too
    short to be a store."""
    refuse_links(path)
    try:
        stored = os.path.getsize(data_file)
    except OSError as exc:
        if exc.errno in DENIED:  # (the directory cannot be searched: data.mdb may well be there)
            raise open_failed(path, exc, readonly=readonly, existed=False) from None
        stored = 0
    if os.path.exists(data_file) and not os.path.isfile(data_file):
        raise StoreDenied(f"{data_file} is not a file: --database must name a pzq store's directory")
    if stored < MIN_DATA_FILE and os.path.exists(data_file):
        # LMDB would take an empty file for a new store: everything that was in it would be gone
        # without a word. (It writes its two meta pages the moment it creates the file.)
        raise StoreDamaged(
            f"{data_file} is empty or truncated ({stored} bytes): restore it from a backup, "
            "or move the directory aside to start with an empty store"
        )
    return stored


def map_cap(max_size: int, stored: int) -> int:
    """The map's size: more than the accounted limit, since B-tree pages, free pages kept for readers
    and copy-on-write during a commit all need room, and deletes must succeed when "full" -- also after
    a restart with a limit below what is stored, so the data file counts too."""
    return max(2 * max_size, max_size + (256 << 20), stored + max(stored // 2, 256 << 20))


def make_directory(path: str, *, readonly: bool, existed: bool) -> None:
    """The store's directory, made if absent (owner-only for a server)."""
    try:
        if readonly:
            os.makedirs(path, exist_ok=True)
        else:
            private_directory(path)
    except OSError as exc:
        raise open_failed(path, exc, readonly=readonly, existed=existed) from None


def refuse_links(path: str) -> None:
    """Refuse a store whose data or lock file is a symbolic link: LMDB opens both for writing and
    follows links, so a link planted in a directory others can write would have the server (often
    root) write, truncate or chmod the file it names."""
    for name in ("data.mdb", "lock.mdb"):
        file = os.path.join(path, name)
        if os.path.islink(file):
            raise StoreError(
                f"{file} is a symbolic link (to {os.readlink(file)!r}): pzq opens only files of its own "
                "in the store directory; move the file it names into its place"
            )


def hold_off_servers(path: str, data_file: str) -> int | None:
    """A shared flock on the data file, which a server's exclusive one cannot pass (None: no data file,
    nothing to read); a server running already is the one case left, in one line."""
    if not os.path.isfile(data_file):
        return None
    try:
        return lock_exclusively(data_file, shared=True)
    except StoreLocked:
        raise disk_full(path, f"a server runs on this store and there is no room for a reader's {LOCK_FILE}") from None


def remove_new(path: str) -> None:
    """Remove the data and lock files an open that failed has just made (empty: nothing is lost)."""
    for name in ("data.mdb", LOCK_FILE):
        try:
            os.unlink(os.path.join(path, name))
        except OSError:
            pass


def private_directory(path: str) -> None:
    """Create the store's directory owner-only (0700, whatever the umask); warn if an existing one is
    open to others, since it is the operator's directory to change."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        log.warning("the store directory %s is mode %o: other users may read it (chmod 700 %s)", path, mode, path)


DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
# What LMDB says of a data file whose meta pages (its header) it cannot read: not an LMDB file, another
# format version, or values no store has (EINVAL: pzq's own parameters never change).
HEADER_ERRORS = (
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidParameterError,
)


def open_failed(path: str, exc: Exception, *, readonly: bool, existed: bool) -> StoreError:
    """Why the store at ``path`` did not open, as the error whose class names the exit status: a
    permission to give (StoreDenied, 2), a data file that is not a readable LMDB store (StoreDamaged, 3:
    a restart would not help), or anything else (StoreError, 1). One line, without LMDB's repeat of the
    path."""
    text = str(exc).removeprefix(f"{path}: ")
    if no_room(exc):  # (a full disk is not damage, whatever was being written)
        return disk_full(path, f"the store could not be opened ({text})")
    if isinstance(exc, lmdb.ReadonlyError) or (isinstance(exc, OSError) and exc.errno in DENIED):
        import pwd

        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = f"uid {os.geteuid()}"
        need = "read" if readonly else "read and write"
        return StoreDenied(
            f"cannot open the store at {path}: {getattr(exc, 'strerror', None) or text}: user {user} must be "
            f"able to {need} the directory and every file in it (chown or chmod it, or run pzq as its owner)"
        )
    # (A meta page's version field that is not LMDB's: py-lmdb raises its base class, with this text.)
    header = isinstance(exc, HEADER_ERRORS) or (type(exc) is lmdb.Error and "data format" in text)
    if existed and header:
        return StoreDamaged(
            f"{os.path.join(path, 'data.mdb')} is damaged: LMDB cannot read its header ({text}); restore it "
            "from a backup, or move the directory aside to start with an empty store"
        )
    return StoreError(f"cannot open the store at {path}: {text}")
