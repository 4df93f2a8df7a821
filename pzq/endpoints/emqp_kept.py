"""What the eMQP endpoint keeps for a peer whose pipe is full: jobs for workers, REPLYs for clients.

Both are sent past the endpoint's Replies (pzq/endpoints/replies.py), which keep the small answers
(ACKs, heartbeats, error REPLYs), so that their bytes are counted once, whoever holds them:

- A job is charged to its worker as a delivery (the broker's byte account) from the moment it is handed
  out, in pzq's memory or in libzmq's. One its worker's pipe cannot take (SNDHWM unread messages) is kept
  for that worker, in order, and the worker is handed no new job meanwhile (``blocked``: the rest stay in
  their queues, on disk). A worker that takes none of them for ``reply_stale_s``, or that is gone, never
  got them: they go back to their queues for other workers (``give_back``).
- A worker's REPLY passed on to a client is charged to that client's share (pzq/endpoints/handed.py)
  while libzmq holds it, until the client's connection has taken it. One that does not fit its share,
  or whose client's pipe is full, waits here, counted as a backlog (``backlog_bytes``), behind the
  client's waiting answers; past ``backlog_messages``/``backlog_bytes``, or ``reply_stale_s`` without
  one leaving, they are dropped and logged, as the Replies' backlogs are.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Hashable

import zmq

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.endpoints.handed import Handed
from pzq.endpoints.replies import Replies
from pzq.gateways.contract import Send
from pzq.gateways.emqp import EmqpGateway
from pzq.zmqio import NOBLOCK, Again, send_frames

log = logging.getLogger("pzq.server")


class KeptJobs:
    """Jobs kept for workers whose pipes are full (see the module's docstring)."""

    def __init__(self, sock: zmq.Socket, gateway: EmqpGateway, limits: Limits = DEFAULT_LIMITS):
        self.sock = sock
        self.gateway = gateway
        self.limits = limits
        self._kept: dict[bytes, collections.deque[Send]] = {}
        self._moved: dict[bytes, float] = {}  # when a job for each last left (or was first kept)
        self.kept_total = 0

    def send(self, send: Send, now: float) -> None:
        """Hand a job to its worker's pipe, or keep it behind those kept for that worker already."""
        peer = send.frames[0]
        waiting = self._kept.get(peer)
        if waiting is None:
            try:
                send_frames(self.sock, send.frames, NOBLOCK)
                return
            except Again:  # its pipe is full: it reads slower than it asks
                if not self.gateway.unsent(send):
                    return
                waiting = self._kept[peer] = collections.deque()
                self._moved[peer] = now
            except zmq.ZMQError:  # EHOSTUNREACH: no connection of that identity any more
                self.gateway.give_back(send)
                return
        waiting.append(send)
        self.kept_total += 1

    def flush(self, now: float) -> None:
        """Send what is kept, in order, as far as each worker's pipe takes it."""
        for peer, waiting in list(self._kept.items()):
            while waiting:
                send = waiting[0]
                if not self.gateway.holds(send):  # (requeued meanwhile: its worker was dropped)
                    waiting.popleft()
                    continue
                try:
                    send_frames(self.sock, send.frames, NOBLOCK)
                except Again:
                    break
                except zmq.ZMQError:  # its worker's connection went: none of them reached it
                    self._give_back(peer, "its connection is gone")
                    break
                waiting.popleft()
                self._moved[peer] = now
            if waiting and now - self._moved[peer] > self.limits.reply_stale_s:
                self._give_back(peer, f"it took none for {now - self._moved[peer]:.0f} s")
            if not self._kept[peer]:
                del self._kept[peer], self._moved[peer]

    def _give_back(self, peer: bytes, why: str) -> None:
        waiting = self._kept[peer]
        log.warning("eMQP worker %r: %d job(s) kept for it go back to their queues (%s)", peer[:40], len(waiting), why)
        while waiting:
            self.gateway.give_back(waiting.popleft())

    def blocked(self) -> frozenset[bytes]:
        """The workers jobs are kept for: handed no new one until their pipes took those."""
        return frozenset(self._kept) if self._kept else frozenset()

    def waiting(self) -> bool:
        return bool(self._kept)


class KeptReplies:
    """Workers' REPLYs passed on to clients, charged to each client while libzmq holds them, kept when they
    cannot go yet (see the module's docstring)."""

    def __init__(self, sock: zmq.Socket, handed: Handed, answers: Replies, limits: Limits = DEFAULT_LIMITS):
        """``answers`` are the Replies of the same socket: a REPLY never overtakes an answer waiting there."""
        self.sock = sock
        self.handed = handed
        self.answers = answers
        self.limits = limits
        self._kept: dict[bytes, collections.deque[tuple[list[bytes], Hashable]]] = {}
        self._bytes: dict[bytes, int] = {}
        self._moved: dict[bytes, float] = {}
        self.backlog_bytes = 0
        self.dropped_total = 0  # REPLYs to clients that read none of them (logged)
        self.gone_total = 0  # REPLYs to clients that had disconnected

    def send(self, frames: list[bytes], payer: Hashable, now: float) -> None:
        """Hand a REPLY (routing frame first) to its client's pipe, charged to ``payer``, or keep it."""
        peer = frames[0]
        if peer not in self._kept and self._try(frames, payer) is not False:
            return
        waiting = self._kept.get(peer)
        if waiting is None:
            waiting = self._kept[peer] = collections.deque()
            self._bytes[peer] = 0
            self._moved[peer] = now
        size = sum(map(len, frames))
        waiting.append((frames, payer))
        self._bytes[peer] += size
        self.backlog_bytes += size
        if len(waiting) > self.limits.backlog_messages or self._bytes[peer] > self.limits.backlog_bytes:
            self._drop(peer, "reads none of its REPLYs")

    def _try(self, frames: list[bytes], payer: Hashable) -> bool | None:
        """True: handed to libzmq; False: it must wait (answers wait before it, no room in its client's
        share, or a full pipe); None: its client is gone."""
        if self.answers.blocked(frames[0]) or not self.handed.room(payer, sum(map(len, frames))):
            return False
        try:
            send_frames(self.sock, self.handed.frames(payer, frames), NOBLOCK)
        except Again:
            return False
        except zmq.ZMQError:  # EHOSTUNREACH: it disconnected; nobody is there to tell
            self.gone_total += 1
            return None
        return True

    def flush(self, now: float) -> None:
        """Send what is kept, in order, as far as each client's pipe and share take it."""
        for peer, waiting in list(self._kept.items()):
            while waiting:
                frames, payer = waiting[0]
                sent = self._try(frames, payer)
                if sent is False:
                    break
                waiting.popleft()
                size = sum(map(len, frames))
                self._bytes[peer] -= size
                self.backlog_bytes -= size
                self._moved[peer] = now
            if waiting and now - self._moved[peer] > self.limits.reply_stale_s:
                self._drop(peer, f"has read none of its REPLYs for {now - self._moved[peer]:.0f} s")
            elif not waiting:
                self._forget(peer)

    def _drop(self, peer: bytes, why: str) -> None:
        waiting = self._kept[peer]
        self.dropped_total += len(waiting)
        log.warning(
            "eMQP client %r %s: %d waiting REPLYs (%d bytes) dropped", peer[:40], why, len(waiting), self._bytes[peer]
        )
        self._forget(peer)

    def _forget(self, peer: bytes) -> None:
        del self._kept[peer], self._moved[peer]
        self.backlog_bytes -= self._bytes.pop(peer)

    def waiting(self) -> bool:
        return bool(self._kept)
