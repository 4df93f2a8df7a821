"""The native send socket's connections, watched through their TCP streams: how far each has got (for the
pool's epochs, pzq/gateways/native_pool.py), and cutting those that stopped reading; and the short wait
for room in its pipes (``drained``).

libzmq says nothing of what a DEALER's peers read; their TCP streams do. The socket monitor names each
connection's descriptor (pzq/endpoints/connwatch.py), and a duplicate of it reads TCP_INFO (Linux): the
bytes the peer acknowledged (``tcpi_bytes_acked``) and those waiting (unsent, and sent but not yet
acknowledged). A connection whose stream has had bytes waiting and none acknowledged for
``Limits.native_send_stall_s`` belongs to a consumer that reads nothing: it is shut down, as connwatch
cuts a connection past the limit, and its pipe goes with it (a libzmq consumer that is still there
connects again by itself). The streams are read only while the pool has stale copies to release, about
once a second: a few microseconds a connection. Over ipc:// (no socket monitor) and without TCP_INFO's
byte counts, nothing is read (``streams`` answers None) and nothing is cut.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket
import struct
import sys
import time

import zmq

from pzq.endpoints.base import Sockets
from pzq.endpoints.unread import ACKED_AT
from pzq.gateways.native_pool import Sample
from pzq.logs import warn_bad
from pzq.zmqio import POLLOUT, events, peer_of_fd

log = logging.getLogger("pzq.server")

# struct tcp_info (linux/tcp.h): the fields read, at their offsets; tcpi_notsent_bytes (Linux 4.6) ends at 148
_INFO_BYTES = 148
_STATE, _MSS, _UNACKED, _ACKED, _NOTSENT = 0, 16, 24, ACKED_AT, 144
_ESTABLISHED = 1
_u32 = struct.Struct("=I").unpack_from
_u64 = struct.Struct("=Q").unpack_from
# A full send socket is waited for a moment before the turn's deliveries wait for the next turn: its pipes
# are short (Limits.send_pipe_messages: 16 deep with a 16M --max-message-size) and libzmq's I/O thread
# empties them in microseconds for consumers that read (without the wait a turn carried 12 deliveries, 40
# with it: ~15 % more server CPU a delivery than 1,000-deep pipes, not ~30 %; scripts/hotpath_profile.py);
# a pipe nobody reads costs one wait of SEND_WAIT_S a turn
SEND_WAIT_S = 200e-6


class SendWatch:
    """Reads the streams of one socket's TCP connections; cuts those that stopped reading."""

    def __init__(self, binder: Sockets, stall_s: float):
        self.binder = binder
        self.stall_s = stall_s
        self.supported = sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO")
        self._still: dict[int, tuple[int, float]] = {}  # descriptor -> (bytes acked, since when) while bytes wait
        self.cut_total = 0

    def streams(self, sock: zmq.Socket, now: float) -> dict[int, Sample] | None:
        """Each open connection's stream now, by descriptor (those that stalled are cut, and left out);
        None when ``sock``'s connections cannot be watched."""
        if not self.supported or not any(watched is sock for _, watched in self.binder.monitors.values()):
            return None
        self.binder.drain_events(sock)  # (connections that closed are known gone first)
        port = sock.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2]
        out: dict[int, Sample] = {}
        still, self._still = self._still, {}
        for fd in list(self.binder.open_fds.get(sock, ())):
            try:
                copy = os.dup(fd)
            except OSError:  # (closed by libzmq since: its DISCONNECTED is on its way)
                continue
            try:
                dup = socket.socket(fileno=copy)
            except OSError:  # (the number went to something that is no socket)
                os.close(copy)
                continue
            with dup:
                sample = self._sample(dup, port, now)
                if sample is None:
                    if not self.supported:
                        return None
                    continue
                before = still.get(fd)
                if not sample.waiting or before is None or before[0] != sample.acked:
                    if sample.waiting:
                        self._still[fd] = (sample.acked, now)
                    out[fd] = sample
                elif now - before[1] < self.stall_s:
                    self._still[fd] = before
                    out[fd] = sample
                else:
                    self._cut(dup, sample, now - before[1])
        return out

    def _sample(self, dup: socket.socket, port: str, now: float) -> Sample | None:
        """The stream of one of the socket's connections (None: the descriptor is no longer one of them)."""
        try:
            if dup.type != socket.SOCK_STREAM or str(dup.getsockname()[1]) != port:
                return None
            info = dup.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_BYTES)
        except OSError:
            return None
        if len(info) < _INFO_BYTES:  # (a kernel older than 4.6: no byte counts to go by)
            self.supported = False
            log.warning("TCP_INFO has no byte counts here: the native send pool's stale copies are released by time")
            return None
        if info[_STATE] != _ESTABLISHED:
            return None
        waiting = _u32(info, _NOTSENT)[0] + _u32(info, _UNACKED)[0] * _u32(info, _MSS)[0]
        return Sample(_u64(info, _ACKED)[0], waiting, now)

    def _cut(self, dup: socket.socket, sample: Sample, still_s: float) -> None:
        self.cut_total += 1
        warn_bad(
            "consumer",
            "stalled",
            f"a send-socket connection read nothing for {still_s:.0f} s with {sample.waiting} bytes waiting for it: "
            f"cut ({self.cut_total} so far; what it held returns at its ack timeout)",
        )
        try:
            dup.shutdown(socket.SHUT_RDWR)  # (libzmq sees its stream end and drops the connection's pipe)
        except OSError:
            pass  # (it ended meanwhile)


def consumers(peers: dict[int, int], limit: int) -> tuple[list[dict], int]:
    """The send socket's connections (``peers``: the socket monitor's, by descriptor), each a consumer of
    the native queue: its peer's address and when it connected (TCP; ipc:// names no peer). What each
    holds is not known apart (a DEALER's deliveries do not say which connection took them): ``held`` is
    None. At most ``limit`` rows, and how many there are."""
    rows = [
        {"protocol": "native", "client": "send socket", "address": peer_of_fd(fd), "connected_us": since, "held": None}
        for fd, since in itertools.islice(peers.items(), limit)
    ]
    return rows, len(peers)


def drained(sock: zmq.Socket, until: float) -> bool:
    """Wait up to SEND_WAIT_S (and no later than ``until``) for libzmq's I/O thread to make room in the
    send socket's pipes (its descriptor turns readable when one tells it so); whether it did."""
    fd = int(sock.getsockopt(zmq.FD))
    deadline = min(time.monotonic() + SEND_WAIT_S, until)
    while True:
        left = deadline - time.monotonic()
        if events(sock) & POLLOUT:
            return True
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return bool(events(sock) & POLLOUT)
