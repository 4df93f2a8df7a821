"""Lean multipart send/recv for the hot paths.

pyzmq's ``send_multipart``/``recv_multipart`` spend about half their time in Python-level flag enums
and argument checks (measured: 9.6 µs vs 4.8 µs for a 4-frame message). These call the Cython backend
directly with plain int flags; behaviour is the same for bytes frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq
from zmq.backend import Socket as _Backend

NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
_send = _Backend.send
_recv = _Backend.recv
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)


def events(sock: zmq.Socket) -> int:
    """The socket's ZMQ_EVENTS bits (POLLIN | POLLOUT) without the sugar layer's enum conversions."""
    return int(_Backend.get(sock, EVENTS))


Again = zmq.Again


def send_frames(sock: zmq.Socket, frames: Sequence[bytes], flags: int = 0) -> None:
    """Send ``frames`` as one multipart message (raises zmq.Again with NOBLOCK when it cannot)."""
    more = flags | SNDMORE
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], more)
    _send(sock, frames[last], flags)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """Receive one multipart message as bytes frames (raises zmq.Again with NOBLOCK when none waits).

    Frame objects tell ``more`` without a getsockopt(RCVMORE), whose option enum lookup costs more
    than the copy to bytes (measured: 2.9 µs vs 3.8 µs for four frames).
    """
    frames = []
    while True:
        frame = _recv(sock, flags, False)
        frames.append(frame.bytes)
        if not frame.more:
            return frames


def recv_frames_from(sock: zmq.Socket, flags: int = 0) -> tuple[list[bytes], str]:
    """``recv_frames`` plus the peer's IP address (libzmq's Peer-Address property, TCP only)."""
    frames = []
    while True:
        frame = _recv(sock, flags, False)
        frames.append(frame.bytes)
        if not frame.more:
            return frames, str(frame.get("Peer-Address") or "")


def recv_frames_user(sock: zmq.Socket, flags: int = 0) -> tuple[list[bytes], str | None]:
    """``recv_frames`` plus the CURVE key (z85) its connection authenticated with: libzmq's ZAP User-Id
    property, only on a CURVE server socket."""
    frames = []
    while True:
        frame = _recv(sock, flags, False)
        frames.append(frame.bytes)
        if not frame.more:
            user = frame.get("User-Id")
            return frames, user if isinstance(user, str) else None
