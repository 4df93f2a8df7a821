"""Credit for the native send socket, whose consumers pzq cannot tell apart. Pure: no sockets, no clock.

The PZQ send socket is a DEALER: it hands deliveries to the connected consumers in turn and never says
which one got what (a ROUTER could, but a server ROUTER cannot reach a consumer that has not spoken,
and PZQ consumers never speak first). A consumer that reads without acking would, with one plain
credit pool, soon hold all of it, and honest consumers would get nothing until its ack timeouts.

So while acks keep coming (some consumer answers promptly), deliveries count against
``--max-inflight`` only while they are young: within a window of WINDOW_FACTOR times the prompt ack
latency (at least MIN_WINDOW, at most the ack timeout). A delivery older than that is held by a consumer
that does not answer promptly; it stays in flight (its ack still counts, and its ack timeout still
applies) but stops blocking new deliveries, so honest consumers keep their round-robin share.

The prompt latency is a low quantile (QUANTILE) of the acks' latencies, not their mean: a consumer that
acks every delivery late answers as often as an honest one (the DEALER hands them the same number), and
a mean of both would stretch the window to its lateness, its deliveries would fill the credit, and the
honest consumer would be held to the late one's pace (9 % of its rate alone, measured). A quantile
does not move while at least QUANTILE of the answers are prompt: late answers cannot widen the window.

And a delivery stops counting as soon as one sent after it is answered (it is passed): a consumer that
answers in order answers its own deliveries first, so only another consumer's answer passes one. So by
construction a late consumer's deliveries count for one round trip of the prompt one, not for its own
lateness: of what counts, the prompt one's deliveries are about half (the DEALER hands them out in
turn), whatever the other does. A lone consumer that answers in order is never passed.

When no ack came within the window, every delivery counts, as one plain pool: a lone slow consumer gets
at most ``--max-inflight``. What all consumers hold together is capped at HOARD x ``--max-inflight``;
past it the oldest deliveries go back to the queue early (a late ack of one still counts). The cap is
wide (HOARD 64): a consumer that acks every delivery 4 s late at its round-robin half of 20,000 a second
holds 40,000, and taking them back at 16 x (it was) cost the server ~40 % more CPU a delivery (each went
back to the queue, out again, and its late ack was refused) and the prompt consumer a fifth of its share
(``scripts/send_fairness.py --no-sockets``); their bodies are bounded in bytes by the send pool
(pzq/gateways/native_pool.py), and a delivery's bookkeeping is a few hundred bytes. A lone slow
but honest consumer raises the latency, hence the window, and is credited as before; beside a prompt
one, its deliveries are passed and it is handed its round-robin share, as much as its pipe takes.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable, Iterable

MIN_WINDOW_S = 0.05
HOARD = 64  # what all native consumers may hold together, in --max-inflight units
QUANTILE = 0.25  # the prompt latency: this quantile of the acks' latencies (late acks beyond 3 in 4 move it)
WINDOW_FACTOR = 4  # the window, in prompt latencies
STEP = 0.05  # how far one ack moves the estimate (a ratio: e^(STEP x (1 - QUANTILE)) down, e^(STEP x QUANTILE) up)
_DOWN, _UP = math.exp(-STEP * (1 - QUANTILE)), math.exp(STEP * QUANTILE)


class NativeCredit:
    """How many deliveries may go out now; told of each send and each answer."""

    def __init__(self, max_inflight: int, ack_timeout_s: float):
        self.max_inflight = max_inflight
        self.ack_timeout_s = ack_timeout_s
        self.cap = HOARD * max_inflight
        self.latency_s = MIN_WINDOW_S / WINDOW_FACTOR  # the prompt latency (the QUANTILE of ack latencies)
        # (kept within these bounds: below the lower one the window is MIN_WINDOW whatever it is, so a
        # slower consumer that comes later raises it within a few dozen acks)
        self._latency_bounds = (MIN_WINDOW_S / WINDOW_FACTOR / 2, max(ack_timeout_s, MIN_WINDOW_S))
        self._young: dict[Hashable, tuple[int, float]] = {}  # counting, in send order -> (send number, when)
        self._sends = 0  # deliveries sent so far: each one's send number
        self._passed = 0  # the send number after the newest answered delivery: those before it are passed
        self._order: collections.deque = collections.deque()  # every send, oldest first (may be stale)
        self._answered_at = float("-inf")

    @property
    def window_s(self) -> float:
        return min(self.ack_timeout_s, max(MIN_WINDOW_S, WINDOW_FACTOR * self.latency_s))

    @property
    def young(self) -> int:
        return len(self._young)

    def reset(self) -> None:
        """Every delivery was forgotten (the server started over from the disk)."""
        self._young.clear()
        self._order.clear()

    def retain(self, holds) -> None:
        """Forget the deliveries no longer in flight (``holds(ref)`` says which are): a rolled-back turn
        took back its own, or the server started over from the disk."""
        self._young = {ref: young for ref, young in self._young.items() if holds(ref)}
        self._order = collections.deque(ref for ref in self._order if holds(ref))

    def sent(self, ref: Hashable, now: float) -> None:
        self._young.pop(ref, None)
        self._sends += 1
        self._young[ref] = (self._sends, now)
        self._order.append(ref)

    def sent_many(self, refs: Iterable[Hashable], now: float) -> None:
        """``sent`` of each of ``refs``, in order (a dispatch's run: one call)."""
        young, order, sends = self._young, self._order, self._sends
        for ref in refs:
            young.pop(ref, None)
            sends += 1
            young[ref] = (sends, now)
            order.append(ref)
        self._sends = sends

    def answered_many(self, answers: Iterable[tuple[Hashable, float | None]], now: float) -> None:
        """``answered`` of each (ref, sent_at) of ``answers``, in order (a run of acks: one call)."""
        young, passed, latency = self._young, self._passed, self.latency_s
        low, high = self._latency_bounds
        timed = False
        for ref, sent_at in answers:
            entry = young.pop(ref, None)
            if entry is not None and entry[0] > passed:
                passed = entry[0]
            if sent_at is not None:
                timed = True
                latency = min(high, max(low, latency * (_DOWN if now - sent_at < latency else _UP)))
        self._passed, self.latency_s = passed, latency
        if timed:
            self._answered_at = now

    def answered(self, ref: Hashable, sent_at: float | None, now: float) -> None:
        """An ack or nack of ``ref`` (``sent_at``: when its delivery left, if it was in flight)."""
        young = self._young.pop(ref, None)
        if young is not None and young[0] > self._passed:  # every delivery sent before it is passed
            self._passed = young[0]
        if sent_at is not None:  # (an answer for nothing in flight proves nobody answers promptly)
            self._answered_at = now
            # A streaming quantile: a faster ack lowers the estimate, a slower one raises it, by steps
            # whose balance (1 - QUANTILE against QUANTILE) holds it where QUANTILE of the acks are faster.
            latency = self.latency_s * (_DOWN if now - sent_at < self.latency_s else _UP)
            low, high = self._latency_bounds
            self.latency_s = min(high, max(low, latency))

    def forget(self, ref: Hashable) -> None:
        """A delivery taken back before it left."""
        self._young.pop(ref, None)

    def available(self, now: float, held: int) -> int:
        """Deliveries that may go out now, ``held`` being how many native deliveries are in flight."""
        horizon, passed = now - self.window_s, self._passed
        young = self._young
        while young:  # (in send order: the old and the passed are at the front)
            ref, (number, at) = next(iter(young.items()))
            if at >= horizon and number >= passed:
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
        return next(iter(self._young.values()))[1] + self.window_s

    def overdue(self, held: int, holds, most: int | None = None) -> list:
        """The oldest deliveries to take back early when all consumers together hold more than the cap
        (``holds(ref)``: whether ``ref`` is still in flight through the send socket); at most ``most``
        of them (the rest the next time)."""
        out: list = []
        order = self._order
        while order and held - len(out) > self.cap - self.max_inflight and (most is None or len(out) < most):
            ref = order.popleft()
            if holds(ref):
                out.append(ref)
                self._young.pop(ref, None)
        while order and not holds(order[0]):  # settled long ago: keep the record of sends short
            order.popleft()
        if len(order) > 2 * held + self.cap:  # one old delivery pins the front: rebuild, amortised O(1)
            self._order = collections.deque(dict.fromkeys(ref for ref in order if holds(ref)))
        return out
