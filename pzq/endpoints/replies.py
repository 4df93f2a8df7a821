"""Replies on a ROUTER socket that never vanish silently.

A ROUTER drops a message for a peer whose pipe is full (at its SNDHWM) without a word: a producer
that pipelines past the high-water mark loses acks for messages that were stored. With
ROUTER_MANDATORY the send fails instead, and the reply waits here, in a per-peer backlog flushed in
order as the peer reads. A backlog has a bound: past it the peer is not reading at all, its backlog is
dropped and logged. An endpoint asks ``blocked(peer)`` before serving a peer more (a producer whose
acks cannot leave is not stored for: backpressure).

What a backlog holds is counted (``backlog_bytes``), and, for sockets whose replies are big, what the
peers' pipes may hold (``pipes``, a PipeEstimate): both go into the memory bound (pzq/endpoints/memory.py).
One answer for many peers (the monitor's STATS) is sent from one buffer without a copy (``send``'s
``key``), and counted once in what the pipes hold.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Hashable, Iterable

import zmq

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.endpoints.memory import PipeEstimate
from pzq.logs import warn_bad
from pzq.zmqio import NOBLOCK, SNDMORE, Again, send_frames

log = logging.getLogger("pzq.server")

RETRY_S = 0.01  # how soon a backlog is tried again
# ... and while its peer reads (the last flush sent some of it): libzmq tells the writer of a pipe that
# its reader took messages only every 8 messages of a 16-deep pipe, so a reader that pipelines many
# commands has their answers sent 16 per retry. At 10 ms, a batched consumer acking each message in an
# ACK of its own got 1,600 SETTLEDs a second, its next DELIVER waiting behind them (0.7 s); at 1 ms, with
# the pipe's news read before giving up (``_send``), 12,000-14,000 (issue 40)
MOVING_RETRY_S = 0.001


class Replies:
    """Sends on one ROUTER socket; every reply goes out, waits in a bounded backlog, or is logged."""

    def __init__(self, sock: zmq.Socket, role: str, limits: Limits = DEFAULT_LIMITS, *, pipes: bool = False):
        """``pipes``: estimate what the peers' pipes hold (for replies that may be big; needs lock-step
        peers, whose requests the endpoint reports with ``read``)."""
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.limits = limits  # backlog_messages, backlog_bytes, reply_stale_s
        self.sock = sock
        self.role = role
        # (frames, the key of a shared last frame or None) waiting for each peer
        self._backlog: dict[bytes, collections.deque[tuple[list[bytes], Hashable | None]]] = {}
        self._bytes: dict[bytes, int] = {}
        self._moved: dict[bytes, float] = {}  # when each backlog last moved (a peer connected but not reading)
        self.dropped_total = 0  # replies to a peer that never read them (logged)
        self.gone_total = 0  # replies to a peer that had disconnected
        self.backlog_bytes = 0  # of every backlog
        self.moving = False  # the last flush sent some of what waited (its peer reads): tried again soon
        # (each peer's pipe holds its SNDHWM messages at most, and libzmq's encoder one more)
        depth = int(sock.getsockopt(zmq.SNDHWM)) + 1
        self.pipes = PipeEstimate(depth, limits.memory_peers_tracked, limits.reply_stale_s) if pipes else None

    def read(self, peer: bytes, fd: int = -1) -> None:
        """A request came from ``peer`` over the connection of descriptor ``fd`` (for the pipe estimate)."""
        if self.pipes is not None:
            self.pipes.read(peer, fd)

    def disconnected(self, fd: int) -> None:
        """The connection of descriptor ``fd`` went (the socket monitor says so): its pipe with it."""
        if self.pipes is not None:
            self.pipes.disconnected(fd)

    def held(self, peer: bytes) -> int:
        """Bytes of replies to ``peer`` that may be unread: its backlog and its pipe's estimate."""
        return self._bytes.get(peer, 0) + (self.pipes.of(peer) if self.pipes is not None else 0)

    def pipe_bytes(self) -> int:
        """What every peer's pipe may hold (0 when not estimated)."""
        return self.pipes.total if self.pipes is not None else 0

    def unconfirmed_bytes(self) -> int:
        """What peers were credited for on their word, which may still wait in their pipes (0 when not
        estimated): the memory bound keeps room for it (PipeEstimate)."""
        return self.pipes.unconfirmed if self.pipes is not None else 0

    def send(self, frames: list[bytes], key: Hashable | None = None) -> None:
        """Send ``frames`` (routing id first) now, or after what already waits for that peer. ``key``:
        the last frame is a buffer sent to other peers too (named by ``key``), sent without a copy."""
        peer = frames[0]
        waiting = self._backlog.get(peer)
        if waiting is None:
            try:
                _send(self.sock, frames, key)
                if self.pipes is not None:
                    self.pipes.sent(peer, sum(map(len, frames)), key)
                return
            except Again:  # the peer's pipe is full: it reads slower than it asks
                waiting = self._backlog[peer] = collections.deque()
                self._bytes[peer] = 0
                self._moved[peer] = time.monotonic()
                if self.pipes is not None:
                    self.pipes.full(peer)
            except zmq.ZMQError:  # EHOSTUNREACH: it disconnected; nobody is there to tell
                self.gone_total += 1
                if self.pipes is not None:
                    self.pipes.gone(peer)
                return
        size = sum(map(len, frames))
        waiting.append((frames, key))
        self._bytes[peer] += size
        self.backlog_bytes += size
        if len(waiting) > self.limits.backlog_messages or self._bytes[peer] > self.limits.backlog_bytes:
            self.dropped_total += len(waiting)
            log.warning(
                "%s peer %r reads none of its replies: %d waiting replies (%d bytes) dropped",
                self.role,
                peer[:40],
                len(waiting),
                self._bytes[peer],
            )
            self._forget(peer)

    def send_many(self, messages: Iterable[list[bytes]]) -> None:
        """``send`` each of ``messages`` in order: while no backlog waits and no pipe is estimated, one
        call for them all (a turn's acks, each a method call less), else one ``send`` each."""
        if self._backlog or self.pipes is not None:
            for frames in messages:
                self.send(frames)
            return
        sock, rest = self.sock, iter(messages)
        for frames in rest:
            try:
                send_frames(sock, frames, NOBLOCK)
            except zmq.ZMQError:  # (Again or a peer gone: ``send`` tries it again and deals with it)
                self.send(frames)
                for frames in rest:
                    self.send(frames)
                return

    def flush(self) -> None:
        """Send what waits, in order, as far as each peer's pipe takes it. A backlog that has not moved
        for limits.reply_stale_s goes: its peer is connected but reads nothing, and must not hold memory forever."""
        now = time.monotonic()
        if self.pipes is not None:
            self.pipes.sweep(now)
        self.moving = False
        for peer, waiting in list(self._backlog.items()):
            sent = 0
            while waiting:
                try:
                    _send(self.sock, *waiting[0])
                except Again:
                    break
                except zmq.ZMQError:
                    self.gone_total += len(waiting)
                    if self.pipes is not None:
                        self.pipes.gone(peer)
                    waiting.clear()
                    break
                frames, key = waiting.popleft()
                size = sum(map(len, frames))
                self._bytes[peer] -= size
                self.backlog_bytes -= size
                if self.pipes is not None:
                    self.pipes.sent(peer, size, key)
                sent += 1
            if sent:
                self._moved[peer] = now
                self.moving = True
            elif waiting and now - self._moved[peer] > self.limits.reply_stale_s:
                self.dropped_total += len(waiting)
                log.warning(
                    "%s peer %r has read none of its replies for %.0f s: %d waiting replies dropped",
                    self.role,
                    peer[:40],
                    now - self._moved[peer],
                    len(waiting),
                )
                waiting.clear()
            if not waiting:
                self._forget(peer)

    def blocked(self, peer: bytes) -> bool:
        """True while replies wait for ``peer``: serve it nothing more until it reads them."""
        return peer in self._backlog

    def refuses(self, peer: bytes, what: str) -> bool:
        """``blocked``, logged (rate-limited): ``what`` says what becomes of the peer's request."""
        if peer not in self._backlog:
            return False
        warn_bad(self.role, "not-reading", f"{self.role} {peer[:40]!r} reads none of its replies: {what} until it does")
        return True

    def wake_at(self, now: float) -> float | None:
        if not self._backlog:
            return None
        return now + (MOVING_RETRY_S if self.moving else RETRY_S)

    def _forget(self, peer: bytes) -> None:
        del self._backlog[peer]
        self.backlog_bytes -= self._bytes.pop(peer)
        del self._moved[peer]


def _send(sock: zmq.Socket, frames: list[bytes], key: Hashable | None) -> None:
    """Send without waiting (zmq.Again when the peer's pipe is full); a shared last frame without a copy
    (libzmq holds the buffer itself until the peer has it: one buffer for every peer sent it). A pipe
    found full is tried once more after the socket's news is read (ZMQ_EVENTS): libzmq reads it on a
    send at most once a millisecond, so a pipe its I/O thread has emptied since often still looks full.
    (Again comes only for a message's first frame, before anything of it is queued: the retry is whole.)"""
    try:
        _send_once(sock, frames, key)
    except Again:
        sock.getsockopt(zmq.EVENTS)
        _send_once(sock, frames, key)


def _send_once(sock: zmq.Socket, frames: list[bytes], key: Hashable | None) -> None:
    if key is None:
        send_frames(sock, frames, NOBLOCK)
        return
    if len(frames) > 1:
        send_frames(sock, frames[:-1], NOBLOCK | SNDMORE)
    sock.send(frames[-1], NOBLOCK, copy=False)
