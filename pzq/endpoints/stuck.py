"""Peers that read nothing while pzq has bytes for them: found on their TCP connections, and cut off.

A ZeroMQ socket tells nothing of a peer that stopped reading: libzmq keeps writing into its pipe until
the pipe is full, then drops (PUB) or refuses (ROUTER) what comes after, and what the pipe holds stays in
pzq's memory for as long as the peer stays connected. The kernel knows better: a connection whose peer
reads nothing has bytes waiting in its send queue that the peer never acknowledges (its receive window
is closed). Each connection the socket monitor reported open (``Sockets.open_fds``, tcp:// only) is
looked at once every ``Limits.stuck_check_s``, at most ``stuck_checks_per_turn`` a turn: the bytes in
its send queue (TIOCOUTQ) and the bytes its peer has acknowledged so far (TCP_INFO's bytes_acked). One
whose queue held bytes while nothing more was acknowledged for ``stuck_reader_s`` is cut off (a shutdown
of its descriptor, as the connection limit does: pzq/endpoints/connwatch.py), counted and logged; libzmq
then drops its pipe, and the socket monitor's DISCONNECTED tells the endpoint its peer is gone. A peer
that reads, however slowly, acknowledges something between two looks and is never cut off.
"""

from __future__ import annotations

import collections
import fcntl
import struct
import termios
from collections.abc import Callable

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.endpoints.connwatch import shut
from pzq.endpoints.unread import bytes_acked
from pzq.logs import warn_bad

_QUEUED = struct.Struct("i")


def progress(fd: int) -> tuple[int, int] | None:
    """(bytes in the send queue, bytes the peer acknowledged so far) of the TCP connection on descriptor
    ``fd`` (libzmq's, borrowed: never closed here); None when it is not one (closed, reused, not TCP)."""
    acked = bytes_acked(fd)
    if acked is None:
        return None
    try:
        queued = _QUEUED.unpack(fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * _QUEUED.size))[0]
    except OSError:
        return None
    return queued, acked


class StuckReaders:
    """Cuts off the connections of one socket whose peers read nothing (see the module's docstring)."""

    def __init__(
        self,
        role: str,
        endpoint: str,
        open_fds: Callable[[], set[int]],
        limits: Limits = DEFAULT_LIMITS,
        *,
        look: Callable[[int], tuple[int, int] | None] = progress,
        cut: Callable[[int, str], None] = shut,
        spare: Callable[[int], bool] = lambda fd: False,
    ):
        """``open_fds`` gives the descriptors of the socket's open connections (the socket monitor's);
        ``look`` and ``cut`` are the kernel's (tests pass their own); a stuck connection ``spare`` says to
        leave alone (it holds deliveries whose ack timeout has not come) is cut once it no longer does."""
        self.role = role
        self.endpoint = endpoint
        self.open_fds = open_fds
        self.limits = limits
        self.look = look
        self.cut = cut
        self.spare = spare
        self._since: dict[int, tuple[int, float]] = {}  # fd -> (bytes acknowledged, since when no more)
        self._round: collections.deque[int] = collections.deque()  # this round's descriptors not looked at
        self._next_round = 0.0
        self.cut_total = 0

    def check(self, now: float, most: int | None = None) -> int:
        """Look at the next connections due (``most`` at most, else ``stuck_checks_per_turn``) and cut off
        the stuck ones; returns how many were looked at."""
        if not self._round:
            if now < self._next_round:
                return 0
            fds = self.open_fds()
            for fd in [fd for fd in self._since if fd not in fds]:  # (closed since the last round)
                del self._since[fd]
            self._round.extend(sorted(fds))
            self._next_round = now + self.limits.stuck_check_s
        looked = 0
        limit = self.limits.stuck_checks_per_turn if most is None else most
        while self._round and looked < limit:
            fd = self._round.popleft()
            looked += 1
            seen = self.look(fd)
            if seen is None:
                self._since.pop(fd, None)
                continue
            queued, acked = seen
            before = self._since.get(fd)
            if not queued or before is None or before[0] != acked:
                self._since[fd] = (acked, now)  # (it reads, or has nothing waiting: a fresh start)
                continue
            if now - before[1] >= self.limits.stuck_reader_s and not self.spare(fd):
                del self._since[fd]
                self.cut_total += 1
                warn_bad(
                    self.role,
                    "stuck-reader",
                    f"a peer on {self.endpoint} read none of {queued} bytes waiting for it for "
                    f"{now - before[1]:.0f} s: cut off (what its pipe held is dropped)",
                )
                self.cut(fd, self.endpoint)
        return looked
