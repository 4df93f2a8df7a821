"""One memory bound: the bytes pzq holds for its clients, counted in one place, and an alarm past a
high-water mark (as RabbitMQ's memory alarm).

Each endpoint says what it holds (``Endpoint.memory``: reply backlogs, unfinished raw-TCP input, unsent
raw-TCP replies, and an estimate of what the pipes of its big replies may hold); the loop adds them up
once a turn (``MemoryAlarm.measure``). Past ``--memory-high-water`` the alarm is raised: the broker
refuses every producer ("queue full" in each protocol) while consumers and acks go on, until the total
is back under ``--memory-low-water``. A request whose reply is big (an API SNAPSHOT or FETCH) is served
only if its peer does not already hold its share of unread replies and the total stays under the
low-water mark (``admit``): refused rather than grown, so that readers of big replies, however slow, are
refused before they could close the server to every producer.

libzmq gives no sign of what a peer has read, so the pipes are estimated (``PipeEstimate``): a peer's
pipe holds at most the last SNDHWM messages sent to it, and libzmq's encoder one more.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Hashable

from pzq.config import DEFAULT_LIMITS, Limits

log = logging.getLogger("pzq.server")

# A part named so is not held (not in the total, never the alarm's): what peers were credited for on their
# word, which may still wait in their pipes (see PipeEstimate). Room is kept for it before a big reply.
UNCONFIRMED = "_unconfirmed"


class PipeEstimate:
    """The bytes the pipes of one ROUTER socket may hold: for each peer, the sizes of the last ``depth``
    messages sent to it (its SNDHWM, and the one libzmq's encoder may be writing), minus those it has
    shown it read.

    The API's clients are lock-step: each sends its next request after reading the reply to its last. A
    request from a peer with no request unanswered is taken to show that what was sent to it before has
    been read. A peer that pipelines (a request read while another is unanswered) earns no credit, and
    one whose pipe turns out full (``full``: a send failed for want of room) was not reading what it was
    credited for: from then on all of its last ``depth`` messages count. So a client that sends requests
    without reading keeps its replies counted; one that fakes the lock-step can hide fewer than
    ``depth`` replies before its pipe fills.

    What a peer was credited for on its word may still wait in its pipe: a peer that fakes the lock-step
    (asks again when its answer was sent, reads nothing) shows it only when its pipe fills, and then its
    last ``depth`` replies count at once (seen: eight such monitor clients past an 8 MiB high-water mark).
    So those bytes are kept apart (``unconfirmed``): not held, so an honest reader never raises the
    alarm, but room is kept for them before a big reply is admitted (``MemoryAlarm``): whatever the
    credited turn out to be, the counted total stays under the ceiling and one reply.

    A message sent to many peers from one buffer (``sent(..., key=...)``: the monitor's STATS, one
    answer for every client that asked while it was built, sent without a copy) counts in full against
    each peer that may hold it (``of``: its share), and once in ``total``, which is what the process
    holds: the buffer lives until the last pipe that holds it lets it go.

    A ROUTER does not say when a peer leaves; a send to it does (``gone``), and so does the socket's
    monitor, by the descriptor its requests came over (``disconnected``; tcp:// only). A peer whose
    connection is not known (ipc://, whose files only pzq's own user can reach) is forgotten after
    ``idle_s`` without a request or a reply (``sweep``). At most ``peers`` peers are remembered (the
    least recently active forgotten first)."""

    __slots__ = (
        "depth",
        "peers",
        "idle_s",
        "total",
        "unconfirmed",
        "_peers",
        "_fds",
        "_unmapped",
        "_shared",
        "_credited",
    )

    def __init__(self, depth: int, peers: int = 10_000, idle_s: float = 60.0):
        self.depth = max(1, depth)
        self.peers = peers
        self.idle_s = idle_s
        self.total = 0  # bytes of every remembered peer, a shared buffer once
        self.unconfirmed = 0  # bytes peers were credited for on their word, a shared buffer once
        self._peers: dict[bytes, _Pipe] = {}
        self._fds: dict[int, bytes] = {}  # connection descriptor -> the peer whose requests came over it
        self._unmapped: dict[bytes, None] = {}  # peers of no known connection, the least recently active first
        self._shared: dict[Hashable, list[int]] = {}  # key of a shared buffer -> [pipes counting it, its size]
        self._credited: dict[Hashable, list[int]] = {}  # the same, of the pipes credited for it

    def sent(self, peer: bytes, size: int, key: Hashable | None = None) -> None:
        """A message of ``size`` bytes went into ``peer``'s pipe (a reply to its oldest request); ``key``
        names the buffer when other peers were sent the same one."""
        pipe = self._take(peer)
        pipe.sizes.append((pipe.serial, size, key))
        pipe.serial += 1
        pipe.unanswered = max(0, pipe.unanswered - 1)
        if len(pipe.sizes) > self.depth:  # (older ones have left the pipe: it holds at most depth)
            pipe.sizes.popleft()
        self._count(pipe)

    def read(self, peer: bytes, fd: int = -1) -> None:
        """A request came from ``peer`` (over the connection of descriptor ``fd``, -1 if unknown)."""
        if fd >= 0:
            before = self._fds.get(fd)
            if before is not None and before != peer:
                self.gone(before)  # (one connection on a descriptor at a time: the one before it went)
            self._fds[fd] = peer
        pipe = self._take(peer)
        if fd >= 0:
            pipe.mapped = True
            self._unmapped.pop(peer, None)
        if pipe.unanswered:
            pipe.pipelines = True  # (a request before the answer to the last: no credit from now on)
        elif not pipe.pipelines:
            pipe.credited = pipe.serial
        self._count(pipe)
        pipe.unanswered += 1

    def full(self, peer: bytes) -> None:
        """A send to ``peer`` found its pipe full: it has not read what it was credited for."""
        pipe = self._take(peer)
        pipe.pipelines = True
        self._count(pipe)

    def gone(self, peer: bytes) -> None:
        """``peer`` disconnected (a send to it found nobody): its pipe is gone with it."""
        pipe = self._peers.pop(peer, None)
        self._unmapped.pop(peer, None)
        if pipe is not None:
            pipe.sizes.clear()
            self._count(pipe)

    def sweep(self, now: float) -> None:
        """Forget the peers of no known connection that have been idle for ``idle_s``."""
        while self._unmapped:
            peer = next(iter(self._unmapped))
            pipe = self._peers.get(peer)
            if pipe is not None and now - pipe.last < self.idle_s:
                return
            self.gone(peer)

    def disconnected(self, fd: int) -> None:
        """The connection of descriptor ``fd`` went: so did the pipe of the peer whose requests came over it.

        Unless that peer waits for an answer: the socket monitor reports a connection's end late, and the
        kernel gives its descriptor to the next connection at once, so the end of the one before may come
        after the next one's request was read over the same descriptor. Taking that for the waiting peer's
        end counted the answer it then got against a peer no longer known, for ``idle_s`` (seen under
        load: one-request clients' pages held the memory bound for a minute). A peer that really went
        with a request unanswered is found gone when its answer is sent (``gone``)."""
        peer = self._fds.get(fd)
        if peer is None:
            return
        pipe = self._peers.get(peer)
        if pipe is not None and pipe.unanswered:
            return
        del self._fds[fd]
        self.gone(peer)

    def of(self, peer: bytes) -> int:
        """Bytes ``peer``'s pipe may hold (a shared buffer in full)."""
        pipe = self._peers.get(peer)
        return 0 if pipe is None else pipe.held

    def _take(self, peer: bytes) -> _Pipe:
        pipe = self._peers.pop(peer, None)  # (put back last: the dict's order is the recency)
        if pipe is None:
            pipe = _Pipe()
            while len(self._peers) >= self.peers:
                self.gone(next(iter(self._peers)))
        self._peers[peer] = pipe
        pipe.last = time.monotonic()
        if not pipe.mapped:
            self._unmapped.pop(peer, None)
            self._unmapped[peer] = None
        return pipe

    def _count(self, pipe: _Pipe) -> None:
        """Count what ``pipe`` may hold now: its last messages, but those it was credited for (a pipe
        holds at most ``depth``: a few entries to add up, whatever happened), and those apart."""
        held = own = credited_own = 0
        keys: list[tuple[Hashable, int]] = []
        credited: list[tuple[Hashable, int]] = []
        for serial, size, key in pipe.sizes:
            counted = pipe.pipelines or serial >= pipe.credited
            if counted:
                held += size
            if key is None:
                if counted:
                    own += size
                else:
                    credited_own += size
            else:
                (keys if counted else credited).append((key, size))
        self.total += own - pipe.own
        self.unconfirmed += credited_own - pipe.credited_own
        pipe.held, pipe.own, pipe.credited_own = held, own, credited_own
        if keys or pipe.keys:
            self._shares(self._shared, keys, pipe.keys)
            pipe.keys = keys
        if credited or pipe.credited_keys:
            self._shares(self._credited, credited, pipe.credited_keys)
            pipe.credited_keys = credited

    def _shares(self, shared: dict[Hashable, list[int]], now: list[tuple[Hashable, int]], before: list) -> None:
        for key, size in now:  # (the new ones first: a buffer counted before and after stays counted)
            self._share(shared, key, size, 1)
        for key, size in before:
            self._share(shared, key, size, -1)

    def _share(self, shared: dict[Hashable, list[int]], key: Hashable, size: int, delta: int) -> None:
        counted = shared.get(key)
        if counted is None:
            counted = shared[key] = [0, size]
            self._add(shared, size)
        counted[0] += delta
        if counted[0] <= 0:
            del shared[key]
            self._add(shared, -counted[1])

    def _add(self, shared: dict[Hashable, list[int]], size: int) -> None:
        if shared is self._shared:
            self.total += size
        else:
            self.unconfirmed += size


class _Pipe:
    """One peer's part of a PipeEstimate."""

    __slots__ = (
        "serial",
        "credited",
        "unanswered",
        "pipelines",
        "held",
        "own",
        "keys",
        "credited_own",
        "credited_keys",
        "sizes",
        "mapped",
        "last",
    )

    def __init__(self) -> None:
        self.mapped = False  # its connection is known (the socket monitor will say when it goes)
        self.last = 0.0  # when it last asked or was answered (time.monotonic())
        self.serial = 0  # of the next message sent
        self.credited = 0  # messages before this serial have been read
        self.unanswered = 0  # requests read, not yet answered
        self.pipelines = False  # it sent a request before reading the last answer, or its pipe filled
        self.held = 0  # bytes its pipe may hold
        self.own = 0  # of which in buffers of its own (the rest: shared, ``keys``)
        self.keys: list[tuple[Hashable, int]] = []  # (key, size) of the shared buffers it may hold
        self.credited_own = 0  # bytes of its own buffers it was credited for, still among its last depth
        self.credited_keys: list[tuple[Hashable, int]] = []  # (key, size) of shared ones it was credited for
        # (serial, size, key) of the last depth sent; key None: a buffer of its own
        self.sizes: collections.deque[tuple[int, int, Hashable | None]] = collections.deque()


class MemoryAlarm:
    """The total of what every endpoint holds, and the alarm with its hysteresis.

    ``measure`` once a turn; ``raised`` while producers are refused; ``admit`` before a big reply is
    made. The alarm is logged once when raised and once when cleared."""

    def __init__(self, high_water: int, low_water: int, limits: Limits = DEFAULT_LIMITS):
        self.high_water = high_water
        self.low_water = min(low_water, high_water)
        self.limits = limits  # memory_peer_share, memory_reply_reserve
        self.raised = False
        self.parts: dict[str, int] = {}
        self.total = 0
        self.unconfirmed = 0  # the parts named ..._unconfirmed
        self.peak = 0
        self._granted = 0  # bytes of big replies admitted since the last measure
        self.raised_total = 0
        self.refused_replies_total = 0

    @property
    def ceiling(self) -> int:
        """Past this total no big reply is made: the low-water mark (and ``limits.memory_reply_reserve``,
        0 by default). A big reply is the one thing pzq may refuse instead of holding (``ERR busy``), so
        slow readers of big replies are refused before they could raise the alarm, which would close the
        server to every producer: the alarm is left to what cannot be refused (unfinished input, backlogs
        of small replies)."""
        return self.low_water + self.limits.memory_reply_reserve

    def measure(self, parts: dict[str, int]) -> bool:
        """Take the turn's count (name -> bytes); raise or clear the alarm; True while it is raised."""
        self.parts = parts
        self.unconfirmed = sum(size for name, size in parts.items() if name.endswith(UNCONFIRMED))
        self.total = sum(parts.values()) - self.unconfirmed
        self.peak = max(self.peak, self.total)
        self._granted = 0
        if not self.raised and self.total >= self.high_water:
            self.raised = True
            self.raised_total += 1
            biggest = sorted(parts.items(), key=lambda item: -item[1])[:3]
            log.warning(
                "memory alarm raised: pzq holds %d bytes for its clients (--memory-high-water %d; most in %s): "
                "producers are refused until it is under %d",
                self.total,
                self.high_water,
                ", ".join(f"{name} {size}" for name, size in biggest),
                self.low_water,
            )
        elif self.raised and self.total <= self.low_water:
            self.raised = False
            log.info(
                "memory alarm cleared: pzq holds %d bytes (--memory-low-water %d): producers are served again",
                self.total,
                self.low_water,
            )
        return self.raised

    @property
    def reason(self) -> str:
        """Why producers are refused (the text of their 'queue full')."""
        return (
            f"queue full: memory alarm, pzq holds {self.total} bytes for clients that read slowly "
            f"(--memory-high-water {self.high_water}), try again later"
        )

    def admit(self, peer_holds: int, size: int, *, over: int = 0) -> bool:
        """May a reply of up to ``size`` bytes be made for a peer whose replies ``peer_holds`` bytes
        wait unread? Not past the peer's share (``limits.memory_peer_share``), nor past the ceiling (and
        ``over`` bytes more) in all, with room kept for what was credited unconfirmed. Refusals are counted."""
        share = self.limits.memory_peer_share
        # (a peer that holds nothing may always have one: a lock-step client's next request, whatever its size)
        if peer_holds and peer_holds + size > share or self.room_taken() + size > self.ceiling + over:
            self.refused_replies_total += 1
            return False
        self._granted += size
        return True

    def room_taken(self) -> int:
        """What the ceiling has no room for: the total, what was credited unconfirmed (it may turn out
        held), and the big replies admitted since the last measure."""
        return self.total + self.unconfirmed + self._granted

    def stats(self) -> dict:
        """The monitor's ``memory`` figures."""
        return {
            "alarm": int(self.raised),
            "counted_bytes": self.total,
            "counted_peak_bytes": self.peak,
            "high_water_bytes": self.high_water,
            "low_water_bytes": self.low_water,
            "alarms_total": self.raised_total,
            "big_replies_refused_total": self.refused_replies_total,
            **{f"{name}_bytes": size for name, size in sorted(self.parts.items())},
        }


# An endpoint's alarm outside a server (tests): never raised, never refuses.
UNWATCHED = MemoryAlarm(1 << 62, 1 << 62, Limits(memory_peer_share=1 << 62))
