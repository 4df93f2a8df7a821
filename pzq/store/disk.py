"""The store's filesystem: room for LMDB's lock file before LMDB maps it, the reserve file given back
when a commit fails for room, and a full disk told apart from damage.

LMDB sizes its lock file with ``ftruncate``, which allocates no block, and writes its reader table
through a shared mapping of it. On a full filesystem the first write into a page without a block
kills the process with SIGBUS: a `pzq check` of a sound backup said "restore it from a backup", and a
`pzq serve` died without a line. So the lock file's blocks are allocated (``posix_fallocate``) before
LMDB opens it; where there is no room, a reader goes on without the lock file (while no server can
start on the store) and a server is refused in one line, ``DiskFull``: exit status 6, not 3.
(The data file is written with ``pwrite``, which fails with ENOSPC instead: a failed commit.)
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time

from pzq.errors import DiskFull

log = logging.getLogger("pzq.store")

LOCK_FILE = "lock.mdb"
# LMDB's lock file for its default 126 reader slots (py-lmdb's max_readers): a header of 192 bytes and
# 125 slots of 64 (tests/test_full_disk.py checks it against a lock file LMDB makes)
LOCK_FILE_BYTES = 8192
RESERVE_RETRY_S = 60  # after the reserve was given back, or could not be made
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def no_room(exc: BaseException) -> bool:
    """Whether ``exc`` says the filesystem (or the user's quota) is full: an OSError's errno, or the text
    of LMDB's (py-lmdb raises ``lmdb.DiskError`` without one)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in NO_ROOM
    text = str(exc)
    return any(os.strerror(code) in text for code in NO_ROOM)


def disk_full(path: str, what: str) -> DiskFull:
    """The one line for a store that could not be written for want of room: what failed, the free room
    seen, and that the store is not damaged."""
    try:
        st = os.statvfs(path if os.path.isdir(path) else os.path.dirname(path) or ".")
        free = f"{st.f_bavail * st.f_frsize >> 10} KiB free"
    except OSError:
        free = "free room unknown"
    return DiskFull(
        f"the filesystem of {path} is full ({free}): {what}. A full disk is not damage: free room there "
        "(or raise the quota) and run the command again"
    )


def allocate_lock_file(path: str) -> bool:
    """Give the lock file of the store directory ``path`` its blocks (made if missing, at least
    LOCK_FILE_BYTES) so that LMDB never writes into a page without one. False if the filesystem has no
    room for it (a lock file made here is removed again); True otherwise, also where it cannot be opened
    at all (a read-only mount, a permission): LMDB meets that itself and says so, as before."""
    file = os.path.join(path, LOCK_FILE)
    existed = os.path.lexists(file)
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return not no_room(exc)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True  # (not a file: LMDB refuses it in its own words)
        os.posix_fallocate(fd, 0, max(os.fstat(fd).st_size, LOCK_FILE_BYTES))
    except OSError as exc:
        if not no_room(exc):
            return True  # (no fallocate here and no emulation: as before this check)
        if not existed:
            os.unlink(file)  # (empty: LMDB would size it with holes again)
        return False
    finally:
        os.close(fd)
    return True


class Reserve:
    """A file of ``size`` bytes in the store's directory that the server gives back when a commit fails
    (most likely the disk is full), so that acks, nacks and deletes, which need new pages too
    (copy-on-write), still commit when something else took the rest of the disk."""

    def __init__(self, path: str, size: int, readonly: bool):
        self.path = os.path.join(path, "reserve")
        self.size = size
        self.readonly = readonly
        self.retry_at = 0.0  # monotonic time before which the reserve is not made again
        self.whole = False  # the file is known to be whole

    def make(self) -> bool:
        """Make the reserve file (or find it whole); False, logged, if there is no room for it."""
        if not self.size or self.readonly or self.whole:
            return True
        try:
            found = os.lstat(self.path)  # (lstat: a link planted in its place is not followed)
        except OSError:
            found = None
        if found is not None and stat.S_ISREG(found.st_mode) and found.st_size >= self.size:
            self.whole = True  # (not looked at again each turn until it is given back)
            return True
        try:
            if found is not None and not stat.S_ISREG(found.st_mode):
                # Someone else's link (or whatever it is) in the server's place: the reserve is the
                # server's own file, so the link goes and the file is made; its target is not touched.
                log.warning("%s is not a regular file (a symlink?): it is replaced by the reserve", self.path)
                os.unlink(self.path)
            # O_NOFOLLOW: a link planted between the unlink and here fails the open, it is never written through.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
        except OSError as exc:
            self.retry_at = time.monotonic() + RESERVE_RETRY_S
            log.warning(
                "cannot reserve %d bytes in %s (trying again in %d s): %s", self.size, self.path, RESERVE_RETRY_S, exc
            )
            try:
                os.unlink(self.path)  # no half reserve
            except OSError:
                pass
            return False
        self.whole = True
        return True

    def release(self) -> bool:
        """Give the reserve back (a commit failed); whether there was one to give."""
        self.whole = False
        try:
            os.unlink(self.path)
        except OSError:
            return False
        # Not made again at once: the failed turn's acks come back next turn and need that room.
        self.retry_at = time.monotonic() + RESERVE_RETRY_S
        log.warning(
            "a commit failed (the disk of %s is full?): its %d-byte reserve was given back, so that "
            "consumers' acks commit next time",
            os.path.dirname(self.path),
            self.size,
        )
        return True
