"""What a raw-TCP connection was handed and its peer's TCP has not acknowledged yet, read from the
kernel (TCP_INFO's ``tcpi_bytes_acked``, Linux 4.1 and later): the bytes libzmq and the kernel still
hold for it, known to the byte, however the peer reads.

A STREAM socket sends raw bytes, so what pzq handed libzmq for a connection and what that connection's
TCP acknowledged count the same bytes: their difference is what waits on pzq's side (libzmq's pipe and
the kernel's send buffer). Each send is remembered as the offset it ends at and the bytes of it the
gateway charged to the connection (pzq/broker/accounts.py ``hold``); once the acknowledged count passes
that offset, they are given back. The descriptor is libzmq's (STREAM names it with each connection's
first notice, ZMQ_SRCFD): it is only read with getsockopt, never closed. A connection whose descriptor
cannot be read (its connection closing, an ipc:// socket) is taken to have what it was sent: the bound
then falls back to libzmq's (SNDHWM).
"""

from __future__ import annotations

import collections
import socket
import struct

ACKED_AT = 120  # offset of tcpi_bytes_acked (u64) in struct tcp_info (linux/tcp.h, stable since 4.1)
_ACKED = struct.Struct("=Q")
CHECKS_PER_TURN = 256  # connections whose TCP_INFO one turn reads at most (a few µs each)


def bytes_acked(fd: int) -> int | None:
    """The bytes descriptor ``fd``'s peer acknowledged, or None when it is no TCP socket now."""
    try:
        sock = socket.socket(fileno=fd)  # (wraps libzmq's descriptor: detached below, never closed)
    except (OSError, ValueError):  # (ValueError: no descriptor at all)
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, ACKED_AT + _ACKED.size)
    except OSError:
        return None
    finally:
        sock.detach()
    return _ACKED.unpack_from(raw, ACKED_AT)[0] if len(raw) >= ACKED_AT + _ACKED.size else None


class Unread:
    """Each connection's bytes sent and not yet acknowledged by its peer, and the charges they carry."""

    def __init__(self) -> None:
        self._fd: dict[bytes, int] = {}
        self._sent: dict[bytes, int] = {}  # bytes handed to libzmq since the connection opened
        self._charges: dict[bytes, collections.deque[tuple[int, int]]] = {}  # (end offset, charged), in order
        self._charged: dict[bytes, int] = {}  # the charges not given back yet, per connection
        self._next: collections.deque[bytes] = collections.deque()  # connections with charges, in turn

    def opened(self, conn: bytes, fd: int) -> None:
        if fd >= 0:
            self._fd[conn] = fd
            self._sent[conn] = 0

    def tracks(self, conn: bytes) -> bool:
        """True if ``conn``'s acknowledgements can be read (what it is sent may be charged to it)."""
        return conn in self._fd

    def sent(self, conn: bytes, size: int, charged: int) -> None:
        """``size`` bytes were handed to libzmq for ``conn``, ``charged`` of them charged to it."""
        if conn not in self._fd:
            return
        end = self._sent[conn] = self._sent[conn] + size
        if charged > 0:
            if conn not in self._charges:
                self._charges[conn] = collections.deque()
                self._next.append(conn)
            self._charges[conn].append((end, charged))
            self._charged[conn] = self._charged.get(conn, 0) + charged

    def charged(self, conn: bytes) -> int:
        """What ``conn`` was charged for bytes its peer has not acknowledged yet."""
        return self._charged.get(conn, 0)

    @property
    def pending(self) -> bool:
        """True while some connection's charged bytes are not acknowledged yet."""
        return bool(self._charges)

    def read_back(self, limit: int, most: int = CHECKS_PER_TURN) -> tuple[list[tuple[bytes, int]], list[bytes]]:
        """Look at what up to ``most`` connections with charges acknowledged (in turn): the charges given
        back, per connection, and the connections looked at whose charges are still past ``limit``. A
        descriptor that is no TCP socket any more gives back everything."""
        back: list[tuple[bytes, int]] = []
        over: list[bytes] = []
        for _ in range(min(most, len(self._next))):
            conn = self._next.popleft()
            charges = self._charges.get(conn)
            if charges is None:
                continue
            acked = bytes_acked(self._fd[conn])
            freed = 0
            while charges and (acked is None or charges[0][0] <= acked):
                freed += charges.popleft()[1]
            if freed:
                self._charged[conn] -= freed
                back.append((conn, freed))
            if not charges:
                del self._charges[conn], self._charged[conn]
                continue
            self._next.append(conn)
            if self._charged[conn] > limit:
                over.append(conn)
        return back, over

    def gone(self, conn: bytes) -> None:
        """The connection closed (its charges end with its payer's: accounts.gone)."""
        self._fd.pop(conn, None)
        self._sent.pop(conn, None)
        self._charges.pop(conn, None)
        self._charged.pop(conn, None)
