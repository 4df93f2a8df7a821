"""The legacy send socket's pool of delivery bytes, and when its stale copies are known to have left.
No sockets, no clock: the broker's account is handed in, the connections' streams and the time too.

The native send socket is a DEALER: it hands each delivery to one of its consumers' connections and never
says which. So its deliveries draw on one pool in the broker's byte account (pzq/broker/accounts.py):
``Limits.native_send_pool`` (64 MiB) of bodies in flight or stale, past which nothing more is taken (one
message while the pool holds nothing). A delivery that timed out or was taken back may still sit in the
pipe of a consumer that stopped reading: its copy stays charged (stale) until a late answer, or until every
pipe it may be in is known to have moved past it.

That is told by epochs. Deliveries are charged to the payer of the epoch they were handed out in,
``(POOL, n)``. While the current epoch holds stale copies it is closed at a checkpoint (at most once per
``Limits.native_send_check_s``, between turns, when every delivery it took has been handed to libzmq):
for each open connection of the socket the checkpoint records how far the connection's stream must get
for what was queued for it then to have left pzq: the bytes its peer's TCP acknowledged, plus what waited
in its socket, plus what its pipe may hold (SNDHWM and libzmq's encoder one more, of the largest delivery
since the oldest epoch not passed). A closed epoch has passed once each of those connections has closed,
got that far, or been seen with nothing waiting in its socket after the checkpoint (an idle stream has
an empty pipe: libzmq's I/O thread writes what a pipe holds as soon as the socket takes it). Once none
of its deliveries is in flight either, its payer ends (``BrokerSurface.gone``): its stale copies are
released. A consumer that reads and never acks thus frees its copies as it reads them; one that reads
nothing holds at most its pipe, and is cut once its stream has not moved for ``Limits.native_send_stall_s``
(pzq/endpoints/native_send.py), which passes its epochs too.

Where connections cannot be watched (an ipc:// socket has no socket monitor; a kernel without TCP_INFO's
byte counts), a closed epoch passes ``unwatched_s`` after its checkpoint: its copies are released by time.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import NamedTuple

from pzq.gateways.contract import BrokerSurface

POOL = "native-pool"  # an epoch's payer is (POOL, its number)
IDLE_AFTER_S = 0.1  # a stream seen idle this long after a checkpoint had nothing of before it left in its pipe
OVERHEAD = 1024  # bytes of a delivery besides its body (its frames, ZeroMQ's framing, CURVE's), at most
MOST_CLOSED = 16  # closed epochs waiting to pass: past them the current epoch stays open


class Sample(NamedTuple):
    """One connection's stream as its socket tells it."""

    acked: int  # bytes of the stream its peer acknowledged since the connection began
    waiting: int  # bytes written to the socket and not yet acknowledged (at most)
    at: float  # when it was read


class Epoch:
    """A closed epoch: its payer, its checkpoint's time, the biggest delivery it handed out, and the
    connections that may still hold its copies, each with (bytes acked at the checkpoint, bytes it must
    get to); None when the connections were not watched."""

    __slots__ = ("payer", "checked_at", "largest", "left")

    def __init__(self, payer: Hashable, checked_at: float, largest: int, left: dict[int, tuple[int, int]] | None):
        self.payer = payer
        self.checked_at = checked_at
        self.largest = largest
        self.left = left


class SendPool:
    """The epochs of the send socket's pool: whose payer a run is charged to, how much room is left,
    when to close the current epoch and which closed ones have passed (their payers ended here)."""

    def __init__(self, broker: BrokerSurface, share: int, pipe_messages: int, *, check_s: float, unwatched_s: float):
        """``pipe_messages``: deliveries one connection may hold in pzq (SNDHWM, and the encoder's one)."""
        self.broker = broker
        self.share = share
        self.pipe_messages = pipe_messages
        self.check_s = check_s
        self.unwatched_s = unwatched_s
        self._number = 1
        self.payer: Hashable = (POOL, 1)  # the current epoch's
        self._largest = 0  # the biggest delivery of the current epoch
        self.closed: list[Epoch] = []  # oldest first
        self._checked_at = float("-inf")
        self.passed_total = 0
        broker.account(self.payer).share = share  # (an epoch's own share: the pool's, of which it is a part)

    def charged(self) -> int:
        """Bytes charged to the pool: in flight and stale, of every epoch not yet passed."""
        account = self.broker.account
        total = account(self.payer).held()
        for epoch in self.closed:
            total += account(epoch.payer).held()
        return total

    def room(self) -> int:
        """Bytes the pool may still hand out: the whole share while it holds nothing (a take always hands
        out one message), none once it is used."""
        return self.share - self.charged()

    def handed(self, largest: int) -> None:
        """A run of the current epoch went out, its biggest body ``largest`` bytes."""
        if largest > self._largest:
            self._largest = largest

    def look_due(self, now: float) -> bool:
        """Whether the pool wants the send socket's streams now: closed epochs wait to pass, or the current
        one holds stale copies (a delivery timed out or was taken back) and may be closed."""
        due = self.next_check()
        return due is not None and now >= due or self._closable(now)

    def look(self, now: float, streams: Mapping[int, Sample] | None, *, closable: bool) -> None:
        """The send socket's streams now (None: not watched). The closed epochs that passed, none of
        whose deliveries is in flight any more, end: their stale copies are released. Then the current
        epoch is closed if it holds stale copies and ``closable`` (every delivery it took has been handed
        to libzmq)."""
        for epoch in list(self.closed):
            left = epoch.left
            if left is None or streams is None:
                if now < epoch.checked_at + self.unwatched_s:
                    continue
            else:
                for fd in [fd for fd, (base, target) in left.items() if _moved(streams.get(fd), base, target, epoch)]:
                    del left[fd]
                if left:
                    continue
            if self.broker.account(epoch.payer).in_flight():
                continue
            self.closed.remove(epoch)
            self.passed_total += 1
            self.broker.gone(epoch.payer)
        if closable and self._closable(now):
            self._checkpoint(now, streams)

    def _closable(self, now: float) -> bool:
        if now < self._checked_at + self.check_s or len(self.closed) >= MOST_CLOSED:
            return False
        account = self.broker.account(self.payer)
        return account.held() > account.in_flight()  # (stale copies)

    def _checkpoint(self, now: float, streams: Mapping[int, Sample] | None) -> None:
        """Close the current epoch: ``streams`` holds each open connection's stream now."""
        largest = max([self._largest, *(epoch.largest for epoch in self.closed)])
        pipe = self.pipe_messages * (largest + OVERHEAD)
        left = None if streams is None else {fd: (s.acked, s.acked + s.waiting + pipe) for fd, s in streams.items()}
        self.closed.append(Epoch(self.payer, now, self._largest, left))
        self._number += 1
        self.payer, self._largest, self._checked_at = (POOL, self._number), 0, now
        self.broker.account(self.payer).share = self.share

    def next_check(self) -> float | None:
        """When closed epochs are next worth a look (None: none waits)."""
        return self._checked_at + self.check_s if self.closed else None

    def stats(self) -> dict:
        """The monitor's figures of the pool."""
        return {
            "send_pool_bytes": self.charged(),
            "send_pool_share_bytes": self.share,
            "send_pool_epochs_closed": len(self.closed),
            "send_pool_epochs_passed_total": self.passed_total,
        }


def _moved(sample: Sample | None, base: int, target: int, epoch: Epoch) -> bool:
    """Whether a connection no longer holds anything queued for it at ``epoch``'s checkpoint."""
    if sample is None or sample.acked < base:  # (closed; or another connection has its descriptor now)
        return True
    return sample.acked >= target or not sample.waiting and sample.at >= epoch.checked_at + IDLE_AFTER_S
