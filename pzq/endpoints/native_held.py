"""Native producers' messages read but held for later turns, bounded in bytes: each big one (more than a
turn may let in) waits for turns of its own, with the messages its producer sent after it (they keep its
order); a producer past its part of what may be held is answered "busy".

The native endpoint (pzq/endpoints/native.py) reads into it and lets its messages in; this part keeps the
order, the bytes held per producer and the refusals.
"""

from __future__ import annotations

import collections
import logging
import time

from pzq.config import Limits
from pzq.protocols import native as wire
from pzq.protocols.native_batch import is_batch, refuse_batch

log = logging.getLogger("pzq.server")

# Messages held (big ones, past what a turn may still let in, each for turns of its own, and those their
# producers sent after them) are bounded in bytes: past Limits.held_in_bytes in all, reading stops; past
# this part of it for one producer (when it holds one already), its messages are answered "busy", so that
# one producer's pipeline of big messages cannot stop the reading for every other producer
HELD_PEER_PART = 4
BUSY_LOG_S = 10.0  # at most one line this often about producers answered busy


class HeldIn:
    """The held messages in the order they were read, each with whether it is big; ``by_peer`` (bytes
    held per producer: its next messages wait behind them), ``bytes`` (all held) and ``behind`` (held
    that are not big: waiting for the next turn, or behind their producer's big message) are read by the
    endpoint's reading loop at each message, so they are plain attributes."""

    def __init__(self, limits: Limits):
        self.messages: collections.deque[tuple[list[bytes], bool]] = collections.deque()
        self.by_peer: dict[bytes, int] = {}
        self.bytes = 0
        self.behind = 0
        self.busy_refused_total = 0
        self._busy_logged = float("-inf")
        self._peer_most = limits.held_in_bytes // HELD_PEER_PART

    def hold(self, frames: list[bytes], big: bool, length: int) -> None:
        self.messages.append((frames, big))
        self.by_peer[frames[0]] = self.by_peer.get(frames[0], 0) + length
        self.bytes += length
        self.behind += 0 if big else length

    def drop_first(self) -> None:
        """The oldest held message is let in (or gone with a rolled-back turn)."""
        self.messages.popleft()
        self._count()

    def take_run(self) -> list[list[bytes]]:
        """The held messages before the next big one (they were sent after a big one now stored)."""
        run: list[list[bytes]] = []
        while self.messages and not self.messages[0][1]:
            run.append(self.messages.popleft()[0])
        if run:
            self._count()
        return run

    def waits_a_turn(self, most: int) -> bool:
        """Whether reading stops until the next turn: what waits for it is a turn's bytes, and no big
        message is held. A deep pipe (127 messages of 1 MiB) would otherwise be read into what is held, which
        the memory bound counts, all at once; next turn lets it in. (While a big message is written over
        turns, reading goes on for the other producers, and its own past its part are answered busy.)"""
        return self.behind >= most and self.behind == self.bytes

    def busy(self, frames: list[bytes], length: int) -> list[list[bytes]] | None:
        """The answers refusing a message that would take what its producer has held past its part of
        what may be held (it may always hold one), or None when it may be held. Answered "busy" at once
        (its body dropped), so that reading goes on for the other producers. Its acks then come out of
        order (clients match them by id)."""
        held = self.by_peer.get(frames[0], 0)
        if not held or held + length <= self._peer_most:
            return None
        answers = []
        event = wire.parse_produce(frames, 1 << 62)
        if is_batch(frames):  # (a batch: answered as one, nothing of it stored)
            answers.append(refuse_batch(frames, wire.BUSY))
        elif isinstance(event, wire.Produce):
            answers.append(wire.produce_ack(event.routing, event.message_id, wire.BUSY))
        elif event is not None:  # (refused whatever waits, e.g. too many frames: it hears why, not "busy")
            answers.append(wire.refusal(event))
        self.busy_refused_total += 1
        now = time.monotonic()
        if now >= self._busy_logged + BUSY_LOG_S:  # (flow control, not bad input: a line now and then)
            self._busy_logged = now
            log.warning(
                "a native producer sent more big messages than may wait to be stored for it: answered busy "
                "(%d so far; it sends them again once its earlier ones are acked)",
                self.busy_refused_total,
            )
        return answers

    def _count(self) -> None:
        self.by_peer, self.behind = {}, 0
        for frames, big in self.messages:
            length = sum(map(len, frames))
            self.by_peer[frames[0]] = self.by_peer.get(frames[0], 0) + length
            self.behind += 0 if big else length
        self.bytes = sum(self.by_peer.values())
