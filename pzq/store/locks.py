"""The exclusive lock that keeps a second pzq process off a store (the server's, and `pzq restore`'s
while it replaces one)."""

from __future__ import annotations

import os

from pzq.errors import StoreLocked


def lock_exclusively(path: str, *, shared: bool = False) -> int:
    """Hold an exclusive flock on the store's data file for as long as the returned descriptor is open.

    LMDB lets several processes open one environment; pzq's in-memory state (in-flight deliveries,
    cursors, queue counters) assumes it is the only writer, so a second server on the same store must be
    refused. The lock is on ``data.mdb`` itself, not on a file of its own that anyone could delete: the
    only way around it is to remove the data. (flock and LMDB's own fcntl locks do not interact.)
    ``shared``: a lock that only keeps a server off (`pzq backup` through a read-only view)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(f"the store at {os.path.dirname(path)} is in use by another pzq process") from None
    return fd
