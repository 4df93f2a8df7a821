"""Lean multipart send/recv for the hot paths.

pyzmq's ``send_multipart``/``recv_multipart`` spend about half their time in Python-level flag enums
and argument checks (measured: 9.6 µs vs 4.8 µs for a 4-frame message). These call the Cython backend
directly with plain int flags; behaviour is the same for bytes frames.

Faster still, when it is built, is the compiled module ``pzq._zmqfast`` (a loop over libzmq's C calls:
measured by ``scripts/zmqio_costs.py``): the public functions here are its when it imports, else the
pure-Python ones, with the same contract. ``PZQ_PURE_PYTHON=1`` in the environment forces the pure ones;
``IMPLEMENTATION`` says which run; ``PURE`` and ``COMPILED`` (None without it) hold each set, for tests.
"""

from __future__ import annotations

import glob
import logging
import os
import types
import weakref
from collections.abc import Sequence

import zmq
from zmq.backend import Socket as _Backend

from pzq.logs import warn_bad

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

# Frames of one message a server reads. Past it the message is dropped and logged: its frames are
# drained a share at a time (DRAIN_PER_CALL, then zmq.Again: "nothing more this turn"), so a message of
# a million empty frames (zero bytes against --max-message-size) cannot hold the loop.
MAX_FRAMES = 1024
DRAIN_PER_CALL = 10_000
_draining: weakref.WeakSet[zmq.Socket] = weakref.WeakSet()
# See keep_big_frames: by id(socket), dropped when the socket goes (a plain dict: a WeakKeyDictionary's
# lookup is Python code, a microsecond of every message received)
_big_frames: dict[int, int] = {}


def draining() -> bool:
    """True while an oversized message is being drained: the loop's next turn should come at once
    (libzmq signals no new input for the rest of a message already begun)."""
    return bool(_draining)


def _too_many(sock: zmq.Socket, flags: int) -> None:
    """Drain the rest of an oversized message, DRAIN_PER_CALL frames a call; always raises Again."""
    more = True
    for _ in range(DRAIN_PER_CALL):
        if not more:
            _draining.discard(sock)
            warn_bad("zeromq", "too-many-frames", f"a message of more than {MAX_FRAMES} frames: dropped unread")
            raise Again()
        more = _recv(sock, flags, False).more
    _draining.add(sock)
    raise Again()


def _pure_send_frames(sock: zmq.Socket, frames: Sequence[bytes], flags: int = 0) -> None:
    """Send ``frames`` as one multipart message (raises zmq.Again with NOBLOCK when it cannot)."""
    more = flags | SNDMORE
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], more)
    _send(sock, frames[last], flags)


def keep_big_frames(sock: zmq.Socket, size: int) -> None:
    """Frames of ``size`` bytes or more received on ``sock`` stay in libzmq's buffer (a memoryview of
    it, not a bytes copy): a 16 MiB body costs the loop ~9 ms to copy, and one that is refused or
    written in chunks never needs the copy (what reads them must take any buffer)."""
    if id(sock) not in _big_frames:
        weakref.finalize(sock, _big_frames.pop, id(sock), None)
    _big_frames[id(sock)] = size


def _pure_recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
    """Receive one multipart message as bytes frames (raises zmq.Again with NOBLOCK when none waits)."""
    return _recv_message(sock, flags)[0]


def _recv_message(sock: zmq.Socket, flags: int) -> tuple[list[bytes], zmq.Frame]:
    """One message's bytes frames and its last frame, whose properties name the connection it came
    over. Frame objects tell ``more`` without a getsockopt(RCVMORE), whose option enum lookup costs
    more than the copy to bytes (measured: 2.9 µs vs 3.8 µs for four frames)."""
    if _draining.data and sock in _draining:  # type: ignore[attr-defined]  # (its weak refs: len() is Python code)
        _too_many(sock, flags)
    frames: list = []
    big = _big_frames.get(id(sock), 1 << 62)
    while True:
        frame = _recv(sock, flags, False)
        frames.append(frame.bytes if len(frame) < big else frame.buffer)
        if not frame.more:
            return frames, frame
        if len(frames) >= MAX_FRAMES:
            _too_many(sock, flags)


def _pure_recv_frames_from(sock: zmq.Socket, flags: int = 0) -> tuple[list[bytes], str]:
    """``recv_frames`` plus the peer's IP address (libzmq's Peer-Address property, TCP only)."""
    frames, last = _recv_message(sock, flags)
    return frames, str(last.get("Peer-Address") or "")


def _pure_recv_frames_fd(
    sock: zmq.Socket, flags: int = 0, *, user: bool = False
) -> tuple[list[bytes], str | None, int]:
    """``recv_frames``, the CURVE key as ``recv_frames_user`` has it (if ``user``: only on a CURVE server
    socket) and the descriptor of the connection it came over (libzmq's SRCFD; -1 when unknown): a
    socket monitor's DISCONNECTED event names the same descriptor."""
    frames, last = _recv_message(sock, flags)
    key = last.get("User-Id") if user else None
    try:
        fd = int(last.get(zmq.SRCFD))
    except zmq.ZMQError:  # (a libzmq without the property)
        fd = -1
    return frames, key if isinstance(key, str) else None, fd


def _pure_recv_frames_user(sock: zmq.Socket, flags: int = 0) -> tuple[list[bytes], str | None]:
    """``recv_frames`` plus the CURVE key (z85) its connection authenticated with: libzmq's ZAP User-Id
    property, only on a CURVE server socket."""
    frames, last = _recv_message(sock, flags)
    user = last.get("User-Id")
    return frames, user if isinstance(user, str) else None


def _pure_send_many(sock: zmq.Socket, messages: Sequence[Sequence[bytes]], flags: int = 0) -> int:
    """Send each of ``messages`` as one multipart message, in order; how many were sent (fewer than all
    when the socket took no more: zmq.Again on a message's first frame ends the call, not raised)."""
    sent = 0
    for frames in messages:
        try:
            _send(sock, frames[0], flags | SNDMORE if len(frames) > 1 else flags)
        except Again:
            return sent
        more = flags | SNDMORE
        last = len(frames) - 1
        for i in range(1, last):
            _send(sock, frames[i], more)
        if last > 0:
            _send(sock, frames[last], flags)
        sent += 1
    return sent


def _pure_recv_many(sock: zmq.Socket, most: int, most_bytes: int = 1 << 62, flags: int = NOBLOCK) -> list[list[bytes]]:
    """Up to ``most`` whole messages waiting on ``sock`` (frames as ``recv_frames`` has them), ending
    once ``most_bytes`` are read; zmq.Again when none waits (with NOBLOCK). A message of more than
    MAX_FRAMES frames ends the run and is drained by the next calls, as ``recv_frames`` does."""
    out: list[list[bytes]] = []
    size = 0
    while len(out) < most and size < most_bytes:
        try:
            frames = _recv_message(sock, flags)[0]
        except Again:
            if out:
                return out
            raise
        size += sum(map(len, frames))
        out.append(frames)
    return out


def _load_compiled() -> types.ModuleType | None:
    """pzq._zmqfast, or None: not built, PZQ_PURE_PYTHON=1, or built for another Python, pyzmq or libzmq."""
    if os.environ.get("PZQ_PURE_PYTHON") == "1":
        return None
    try:
        from pzq import _zmqfast  # type: ignore[attr-defined]  # (compiled, optional: no stubs)
    except Exception as exc:  # (ImportError when not built; any error from a build that no longer fits)
        if isinstance(exc, ImportError) and not glob.glob(os.path.join(os.path.dirname(__file__), "_zmqfast*.so")):
            return None  # (not built: the pure path is the one there is)
        logging.getLogger("pzq.server").warning("pzq._zmqfast does not load (%s): pure-Python send/receive", exc)
        return None
    return _zmqfast


def _compiled_set(fast: types.ModuleType) -> types.SimpleNamespace:
    """The public functions over the compiled module: the same contract as the pure ones (frames over
    MAX_FRAMES come back as None from it, and are drained here, DRAIN_PER_CALL at a time)."""
    recv, recv_props, recv_run = fast.recv, fast.recv_props, fast.recv_many
    never = 1 << 62

    def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[bytes]:
        if _draining.data and sock in _draining:  # type: ignore[attr-defined]  # (see _recv_message)
            _too_many(sock, flags)
        frames = recv(sock, flags, _big_frames.get(id(sock), never), MAX_FRAMES)
        if frames is None:
            _too_many(sock, flags)
        return frames

    def _props(sock: zmq.Socket, flags: int, peer: bool, user: bool, fd: bool) -> tuple:
        if _draining.data and sock in _draining:  # type: ignore[attr-defined]
            _too_many(sock, flags)
        got = recv_props(sock, flags, _big_frames.get(id(sock), never), MAX_FRAMES, peer, user, fd)
        if got is None:
            _too_many(sock, flags)
        return got

    def recv_frames_from(sock: zmq.Socket, flags: int = 0) -> tuple[list[bytes], str]:
        frames, peer, _, _ = _props(sock, flags, True, False, False)
        return frames, peer or ""

    def recv_frames_fd(sock: zmq.Socket, flags: int = 0, *, user: bool = False) -> tuple[list[bytes], str | None, int]:
        frames, _, key, fd = _props(sock, flags, False, user, True)
        return frames, key, fd

    def recv_frames_user(sock: zmq.Socket, flags: int = 0) -> tuple[list[bytes], str | None]:
        frames, _, key, _ = _props(sock, flags, False, True, False)
        return frames, key

    def recv_many(sock: zmq.Socket, most: int, most_bytes: int = 1 << 62, flags: int = NOBLOCK) -> list[list[bytes]]:
        if _draining.data and sock in _draining:  # type: ignore[attr-defined]
            _too_many(sock, flags)
        run, over = recv_run(sock, flags, _big_frames.get(id(sock), never), MAX_FRAMES, most, most_bytes)
        if over:
            if not run:
                _too_many(sock, flags)
            _draining.add(sock)  # (the next call drains it)
        return run

    return types.SimpleNamespace(
        name="compiled",
        send_frames=fast.send,
        send_many=fast.send_many,
        recv_frames=recv_frames,
        recv_many=recv_many,
        recv_frames_from=recv_frames_from,
        recv_frames_fd=recv_frames_fd,
        recv_frames_user=recv_frames_user,
    )


PURE = types.SimpleNamespace(
    name="pure",
    send_frames=_pure_send_frames,
    send_many=_pure_send_many,
    recv_frames=_pure_recv_frames,
    recv_many=_pure_recv_many,
    recv_frames_from=_pure_recv_frames_from,
    recv_frames_fd=_pure_recv_frames_fd,
    recv_frames_user=_pure_recv_frames_user,
)
COMPILED = _compiled_set(_fast) if (_fast := _load_compiled()) is not None else None
_chosen = COMPILED or PURE
IMPLEMENTATION: str = _chosen.name
send_frames = _chosen.send_frames
send_many = _chosen.send_many
recv_frames = _chosen.recv_frames
recv_many = _chosen.recv_many
recv_frames_from = _chosen.recv_frames_from
recv_frames_fd = _chosen.recv_frames_fd
recv_frames_user = _chosen.recv_frames_user
