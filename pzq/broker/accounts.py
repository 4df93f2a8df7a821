"""The byte account of deliveries: every body the broker hands out is charged to a payer until it is
known to be gone, and a payer is handed nothing more once its share is used.

A payer is whoever's memory the bytes stand for: a connection (PHPMQ, MQKS), a worker (eMQP), a
batched consumer, the native send socket's pool. ``take`` charges the run it hands out (one sum per
run, kept by the in-flight tracker, so the charge can never drift from what is in flight) and asks
``room`` first: bytes the payer may still be handed, within its share and within what the one memory
bound leaves to deliveries (``bank``, set by the server loop each turn from pzq/endpoints/memory.py).
A payer that holds nothing may always have one message, whatever its size, while the memory bound is
under its high-water mark (and ``Limits.delivery_alarm_slack`` more, so that consumers drain while the
alarm refuses producers): so a consumer that reads is never starved by those that do not.

Bytes are released when the delivery is known to be gone: acked, nacked, moved, dead-lettered by its
holder (who had read it), never sent (``undeliver``), or its payer's connection closed (``gone``). A
delivery that only timed out or was taken back may still sit unread in the payer's pipe: the copy stays
charged (``Stale``) while the message goes to someone else, until a late answer settles it or the
payer is gone. So a peer that stops reading holds at most its share (and one message), whatever its
door, however often its deliveries time out.

A raw-TCP door that can see what its peer's TCP acknowledged (MQKS: TCP_INFO's bytes_acked) charges its
other bytes too, from the moment it hands them to libzmq until the peer's TCP has them (``hold``,
``let_go``): replies, notices and auto-ack deliveries (whose message is gone from the store when it is
sent, so ``take``'s charge ends at once). They count in the payer's share and the memory bound as the
deliveries do; a manual-ack delivery's body is charged once, by ``take``. eMQP's zero-copy frames (a
PUBLISH's fan-out, a REPLY passed on) are charged the same way, from the send until libzmq frees their
buffer (pzq/endpoints/handed.py). A gateway charges and releases them as one signed ``charge`` of its
``Account`` (pzq/broker/questions.py).
"""

from __future__ import annotations

from collections.abc import Hashable

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.inflight import InFlight

UNBOUNDED = 1 << 62


class Stale:
    """The bytes of one payer's deliveries that timed out (or were taken back) and may still be in its
    pipe: one record per payer, not per message; a late answer takes its message's bytes off, the
    payer's end (``open`` False) all of them."""

    __slots__ = ("bytes", "open")

    def __init__(self) -> None:
        self.bytes = 0
        self.open = True


class DeliveryAccounts:
    """Shares of the bytes of deliveries, per payer, and the room the memory bound leaves them."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        self.share = limits.delivery_share  # a payer's share, unless it has one of its own (``set_share``)
        self.slack = limits.delivery_alarm_slack
        self._shares: dict[Hashable, int] = {}
        self._stale: dict[Hashable, Stale] = {}
        self.stale_total = 0
        self._piped: dict[Hashable, int] = {}  # bytes other than bodies in a payer's pipe (``hold``)
        self.piped_total = 0
        # Set by the server loop once a turn (``bank``): what the memory bound counted besides deliveries,
        # the ceiling under which deliveries may grow, and the high-water mark past which not even a
        # payer that holds nothing is handed one more
        self._others = 0
        self._ceiling = UNBOUNDED
        self._high_water = UNBOUNDED
        # Payers refused for want of room in their share, and whether one was refused for want of room
        # under the ceiling: a release that gives them room raises the broker's readiness (``released``)
        self.waiting: set[Hashable] = set()
        self.bank_waiting = False
        self.refused_total = 0  # takes that found no room

    def set_share(self, payer: Hashable, share: int) -> None:
        """Give ``payer`` a share of its own (the native send socket's pool)."""
        self._shares[payer] = share

    def bank(self, *, others: int, ceiling: int, high_water: int) -> None:
        """The memory bound's figures for this turn (pzq/endpoints/memory.py): ``others`` bytes counted
        besides deliveries, ``ceiling`` (deliveries grow only under it) and ``high_water``."""
        self._others, self._ceiling, self._high_water = others, ceiling, high_water

    def total(self, inflight: InFlight) -> int:
        """Bytes charged to every payer: in flight, stale and piped."""
        return inflight.bytes_total + self.stale_total + self.piped_total

    def held(self, payer: Hashable, inflight: InFlight) -> int:
        """Bytes charged to ``payer``: its deliveries in flight, its stale copies and its piped bytes."""
        stale = self._stale.get(payer)
        return inflight.bytes_of(payer) + (stale.bytes if stale is not None else 0) + self._piped.get(payer, 0)

    def share_of(self, payer: Hashable) -> int:
        """``payer``'s share: its own (``set_share``) or every payer's."""
        return self._shares.get(payer, self.share)

    def hold(self, payer: Hashable, size: int) -> None:
        """``size`` bytes other than a delivery's body were handed to libzmq for ``payer``: charged until
        its peer's TCP acknowledged them, or libzmq freed them (``let_go``), or it is gone. A payer left
        holding none is forgotten (eMQP's payers are clients' identities, whose end nobody reports)."""
        if size > 0:
            self._piped[payer] = self._piped.get(payer, 0) + size
            self.piped_total += size

    def let_go(self, payer: Hashable, size: int, inflight: InFlight) -> bool:
        """``payer``'s peer has ``size`` of its piped bytes; whether someone refused room may have some
        now (see ``released``)."""
        piped = self._piped.get(payer, 0)
        size = min(size, piped)
        if size <= 0:
            return False
        if piped > size:
            self._piped[payer] = piped - size
        else:
            del self._piped[payer]
        self.piped_total -= size
        return self.released(payer, inflight)

    def room(self, payer: Hashable, inflight: InFlight) -> int:
        """Bytes ``payer`` may still be handed (``take`` hands out its first message whatever its size,
        so 1 means "one message"); 0 when none, and the payer is remembered (see ``released``)."""
        held = self.held(payer, inflight)
        everyone = self._others + self.total(inflight)
        share = self._shares.get(payer, self.share)
        if not held:  # (one message at least, whatever its size, unless memory is past its high-water mark)
            if everyone < self._high_water + self.slack:
                return max(1, min(share, self._ceiling - everyone))
            self.bank_waiting = True
        else:
            mine = share - held
            if mine <= 0:
                self.waiting.add(payer)
            elif everyone >= self._ceiling:
                self.bank_waiting = True
            else:
                return min(mine, self._ceiling - everyone)
        self.refused_total += 1
        return 0

    def may_hand(self, payer: Hashable, size: int, inflight: InFlight, unsent: int = 0) -> bool:
        """Whether ``size`` more bytes (a notice, a published frame: not a delivery) may be handed to
        ``payer`` now, ``unsent`` bytes made for it this turn and not charged yet counted as charged:
        within its share and the ceiling, or the first whatever its size, as ``room`` allows a delivery.
        A payer refused for its share is not remembered (asked again each turn); one refused for want
        of memory is, and counted, as ``room`` does (a release raises readiness)."""
        held, everyone = self.held(payer, inflight) + unsent, self._others + self.total(inflight) + unsent
        if not held:
            if everyone < self._high_water + self.slack:
                return True
        elif held + size > self._shares.get(payer, self.share):
            return False
        elif everyone + size <= self._ceiling:
            return True
        self.bank_waiting = True
        self.refused_total += 1
        return False

    def may_pipe(self, payer: Hashable, unsent: int, inflight: InFlight) -> bool:
        """Whether ``payer`` may be handed another answer (a reply, not a delivery): its piped bytes, with
        ``unsent`` made for it and not charged yet, under its share and everyone's under the ceiling; the
        first whatever they hold, as ``room`` allows a delivery. Its deliveries are not counted: a reader
        holding its share of them must still be answered, since its acks are what gives that room back."""
        piped = self._piped.get(payer, 0) + unsent
        everyone = self._others + self.total(inflight) + unsent
        if not piped:
            return everyone < self._high_water + self.slack
        return piped < self._shares.get(payer, self.share) and everyone < self._ceiling

    def filled(self, payer: Hashable, inflight: InFlight) -> None:
        """A take stopped at ``payer``'s room: remember it, to be told when a release gives it more."""
        held = self.held(payer, inflight)
        if held >= self._shares.get(payer, self.share):
            self.waiting.add(payer)
        elif self._others + self.total(inflight) >= self._ceiling:
            self.bank_waiting = True

    def released(self, payer: Hashable, inflight: InFlight) -> bool:
        """Bytes of ``payer`` were released: whether someone refused for want of room may have some now
        (the broker then raises its readiness, so that gateways that wait for it look again). O(1)."""
        woke = False
        if payer in self.waiting and self.held(payer, inflight) < self._shares.get(payer, self.share):
            self.waiting.discard(payer)
            woke = True
        if self.bank_waiting and self._others + self.total(inflight) < self._ceiling:
            self.bank_waiting = False
            woke = True
        return woke

    def stale(self, payer: Hashable, size: int) -> Stale | None:
        """A delivery of ``size`` bytes to ``payer`` timed out or was taken back: its copy stays charged.
        Returns the record a late answer releases it from (None when there is nothing to keep)."""
        if not size:
            return None
        record = self._stale.get(payer)
        if record is None:
            record = self._stale[payer] = Stale()
        record.bytes += size
        self.stale_total += size
        return record

    def settled_late(self, record: Stale, size: int) -> None:
        """A late answer: the stale copy of ``size`` bytes was read after all."""
        if record.open:
            size = min(size, record.bytes)
            record.bytes -= size
            self.stale_total -= size

    def gone(self, payer: Hashable) -> None:
        """The payer's connection closed: its stale copies are gone with it, and its own share."""
        record = self._stale.pop(payer, None)
        if record is not None:
            record.open = False
            self.stale_total -= record.bytes
            record.bytes = 0
        self.piped_total -= self._piped.pop(payer, 0)
        self._shares.pop(payer, None)
        self.waiting.discard(payer)

    def reset(self) -> None:
        """Every delivery was forgotten (the broker started over): so were the stale copies' records.
        (What sat in pipes then is still bounded by the shares it was handed under.)"""
        for record in self._stale.values():
            record.open = False
        self._stale.clear()
        self.stale_total = 0

    def stats(self, inflight: InFlight) -> dict:
        """The monitor's figures."""
        return {
            "delivery_bytes": inflight.bytes_total,
            "delivery_stale_bytes": self.stale_total,
            "delivery_piped_bytes": self.piped_total,
            "delivery_share_bytes": self.share,
            "delivery_room_refused_total": self.refused_total,
        }
