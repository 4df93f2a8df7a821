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
RCVMORE = int(zmq.RCVMORE)
_send = _Backend.send
_recv = _Backend.recv
_get = _Backend.get

Again = zmq.Again


def send_frames(sock: zmq.Socket, frames: Sequence[bytes], flags: int = 0) -> None:
    """Send ``frames`` as one multipart message (raises zmq.Again with NOBLOCK when it cannot)."""
    more = flags | SNDMORE
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], more)
    _send(sock, frames[last], flags)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """Receive one multipart message as bytes frames (raises zmq.Again with NOBLOCK when none waits)."""
    frames = [_recv(sock, flags)]
    while _get(sock, RCVMORE):
        frames.append(_recv(sock, flags))
    return frames
