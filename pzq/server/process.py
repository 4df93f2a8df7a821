"""What the server asks of its process: descriptors enough for every connection, a wake-up pipe
drained, the privileges of --user dropped after binding, and no new store left by a failed start."""

from __future__ import annotations

import logging
import os
from typing import Any

from pzq.errors import ConfigError

log = logging.getLogger("pzq.server")


FD_RESERVE = 1024  # descriptors kept for the store, the sockets, libzmq's own and ZeroMQ clients


def connection_limit(configured: int) -> int:
    """Raise the soft limit of open files to the hard one, and keep connections (of every endpoint
    together) to half of what is left after FD_RESERVE, so that the process never runs out of
    descriptors: a burst of connections is accepted before pzq can close the ones past the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            soft = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except (ValueError, OSError):
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return min(configured, max(16, (soft - FD_RESERVE) // 2))


def drain_fd(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def drop_privileges(user: str, database: str) -> None:
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ConfigError(f"--user: no such user {user!r}") from None
    if os.getuid() != 0:
        if os.getuid() != entry.pw_uid:
            raise ConfigError(f"--user {user}: only root can switch users")
        return
    for root, _dirs, files in os.walk(database):
        for name in [root, *(os.path.join(root, f) for f in files)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    log.info("dropped privileges to %s", user)


STORE_FILES = ("data.mdb", "lock.mdb", "reserve", "monitor")  # what a start puts in a new store directory


class NewStore:
    """A store directory a start may make: if that start fails (a port in use), ``forget`` removes the
    directory it made, up to the outermost one that did not exist before, so that no store nobody meant
    is left behind. Only the files a start puts there go: anything else in it keeps the directory."""

    def __init__(self, database: str):
        self.path = path = os.path.abspath(database)
        self.made: str | None = None  # the outermost directory of the path that did not exist
        while not os.path.lexists(path) and os.path.dirname(path) != path:
            path, self.made = os.path.dirname(path), path

    def start(self, server: Any) -> None:
        """``server.start()``; if it raises, what it made of the store directory is removed first (open
        files may be unlinked: the caller closes the server after)."""
        try:
            server.start()
        except BaseException:
            self.forget()
            raise

    def forget(self) -> None:
        """Remove the files a start puts in the directory, and the directories this start made."""
        if self.made is None:
            return
        for name in STORE_FILES:
            try:
                os.unlink(os.path.join(self.path, name))
            except OSError:  # (not made: the start failed before it)
                pass
        path = self.path
        while True:
            try:
                os.rmdir(path)
            except OSError:  # not empty, or never made
                return
            if path == self.made:
                return
            path = os.path.dirname(path)


# Buffers from this size on are mapped on their own, and unmapped when freed. Above 256 KiB: msgpack's
# packb starts every call with a buffer of 256 KiB, which at 256 KiB was mapped and unmapped each call
# (12-27 us a packb, 1 us otherwise: every stored record paid it)
MMAP_THRESHOLD = 512 << 10
# Free memory at the heap's top kept before it is given back: setting the mmap threshold fixes this at
# 128 KiB, below the packb buffer, which then went back to the system (and came again) each call too
TRIM_THRESHOLD = 4 << 20


def return_freed_memory() -> None:
    """Have glibc map every big buffer (a reply, a message) on its own and unmap it when it is freed.

    By default glibc raises its mmap threshold to the size of the biggest buffer freed (up to 32 MiB),
    and from then on takes buffers of MiBs from the heap, which it gives back to the system only from
    its top: after a burst of big replies the process keeps the memory they had, freed or not, for as
    long as one buffer above them lives. The memory bound counts what is held; this makes the resident
    size follow it. Nothing happens on another C library."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # (glibc's malloc.h)
    if not mallopt(m_mmap_threshold, MMAP_THRESHOLD):
        log.debug("mallopt(M_MMAP_THRESHOLD) refused: freed big buffers may stay resident")
    if not mallopt(m_trim_threshold, TRIM_THRESHOLD):
        log.debug("mallopt(M_TRIM_THRESHOLD) refused")
