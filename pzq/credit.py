"""Credit for the native send socket, whose consumers pzq cannot tell apart. Pure: no sockets, no clock.

The PZQ send socket is a DEALER: it hands deliveries to the connected consumers in turn and never says
which one got what (a ROUTER could, but a server ROUTER cannot reach a consumer that has not spoken,
and PZQ consumers never speak first). A consumer that reads without acking would, with one plain
credit pool, soon hold all of it, and honest consumers would get nothing until its ack timeouts.

So while acks keep coming (some consumer answers promptly), deliveries count against
``--max-inflight`` only while they are young: within a window of a few times the recent ack latency (at
least MIN_WINDOW, at most the ack timeout). A delivery older than that is held by a consumer that does
not answer promptly; it stays in flight (its ack still counts, and its ack timeout still applies) but
stops blocking new deliveries, so honest consumers keep their round-robin share. When no ack came
within the window, every delivery counts, as one plain pool: a lone slow consumer gets at most
``--max-inflight``. What all consumers hold together is capped at HOARD x ``--max-inflight``; past it
the oldest deliveries go back to the queue early (a late ack of one still counts). A slow but honest
consumer raises the latency, hence the window, and is credited as before.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable

MIN_WINDOW_S = 0.05
HOARD = 16  # what all native consumers may hold together, in --max-inflight units
EWMA = 0.05  # weight of one ack in the latency average


class NativeCredit:
    """How many deliveries may go out now; told of each send and each answer."""

    def __init__(self, max_inflight: int, ack_timeout_s: float):
        self.max_inflight = max_inflight
        self.ack_timeout_s = ack_timeout_s
        self.cap = HOARD * max_inflight
        self.latency_s = MIN_WINDOW_S / 4
        self._young: dict[Hashable, float] = {}  # sent within the window, in send order -> when
        self._order: collections.deque = collections.deque()  # every send, oldest first (may be stale)
        self._answered_at = float("-inf")

    @property
    def window_s(self) -> float:
        return min(self.ack_timeout_s, max(MIN_WINDOW_S, 4 * self.latency_s))

    @property
    def young(self) -> int:
        return len(self._young)

    def reset(self) -> None:
        """Every delivery was forgotten (the server started over from the disk)."""
        self._young.clear()
        self._order.clear()

    def sent(self, ref: Hashable, now: float) -> None:
        self._young.pop(ref, None)
        self._young[ref] = now
        self._order.append(ref)

    def answered(self, ref: Hashable, sent_at: float | None, now: float) -> None:
        """An ack or nack of ``ref`` (``sent_at``: when its delivery left, if it was in flight)."""
        self._young.pop(ref, None)
        if sent_at is not None:  # (an answer for nothing in flight proves nobody answers promptly)
            self._answered_at = now
            self.latency_s += (max(0.0, now - sent_at) - self.latency_s) * EWMA

    def forget(self, ref: Hashable) -> None:
        """A delivery taken back before it left."""
        self._young.pop(ref, None)

    def available(self, now: float, held: int) -> int:
        """Deliveries that may go out now, ``held`` being how many native deliveries are in flight."""
        horizon = now - self.window_s
        young = self._young
        while young:
            ref, at = next(iter(young.items()))
            if at >= horizon:
                break
            del young[ref]
        if self._answered_at < horizon:  # nobody answers promptly: one plain pool
            return max(0, self.max_inflight - held)
        return max(0, min(self.max_inflight - len(young), self.cap - held))

    def wake_at(self) -> float | None:
        """When the oldest young delivery stops counting (credit may come back then, with no message
        to wake the loop)."""
        if not self._young:
            return None
        return next(iter(self._young.values())) + self.window_s

    def overdue(self, held: int, holds) -> list:
        """The oldest deliveries to take back early when all consumers together hold more than the cap
        (``holds(ref)``: whether ``ref`` is still in flight through the send socket)."""
        out: list = []
        order = self._order
        while order and held - len(out) > self.cap - self.max_inflight:
            ref = order.popleft()
            if holds(ref):
                out.append(ref)
                self._young.pop(ref, None)
        while order and not holds(order[0]):  # settled long ago: keep the record of sends short
            order.popleft()
        if len(order) > 2 * held + self.cap:  # one old delivery pins the front: rebuild, amortised O(1)
            self._order = collections.deque(dict.fromkeys(ref for ref in order if holds(ref)))
        return out
