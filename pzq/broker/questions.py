"""The broker's part that answers what gateways ask about queues and deliveries, so that none reaches
into the store or the in-flight table: a queue's counters, its name, room for a side record, a
read-only look at its messages, who holds a delivery, and a payer's ``Account`` of the byte account
(asked with the in-flight table of now, which ``reset`` replaces: so no gateway keeps it)."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from pzq.broker.state import BrokerState, Ref
from pzq.store import Message, QueueInfo


class Questions:
    """Read-only questions (a gateway's queue creation is ``create_queue``, in implicit.py)."""

    def __init__(self, state: BrokerState):
        self._s = state
        self._store = state.store

    def queue_info(self, queue: str) -> QueueInfo | None:
        """The counters of ``queue``; None if there is no such queue (nothing is created)."""
        return self._store.queue(queue, create=False)

    def queue_name(self, qid: int) -> str | None:
        """The name of queue ``qid``; None once it is gone."""
        info = self._store.queue_by_id(qid)
        return None if info is None else info.name

    def check_room(self, size: int) -> None:
        """Raise StoreFull unless ``size`` more bytes fit (a gateway's side record, checked before
        anything changes)."""
        self._store.check_room(size)

    def peek(self, queue: str, from_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages of ``queue`` with seq >= ``from_seq``, in flight or not:
        a read-only look that changes nothing (the API's INFO and SNAPSHOT)."""
        return self._store.scan(queue, from_seq, limit)

    def ref_in(self, queue: str, message_id: str | bytes) -> Ref | None:
        """The ref a client's message id names in ``queue``; None if it names none of its messages."""
        return self._store.catalog.ref_in(queue, message_id)

    def in_flight_to(self, ref: Ref) -> Hashable | None:
        """The consumer ``ref`` is in flight to; None if it is not in flight (a range a group holds
        is not: see ``holder_of``)."""
        delivery = self._s.inflight.get(ref)
        return None if delivery is None else delivery.consumer

    def deadline_of(self, holder: Hashable) -> Callable[[Ref], float | None]:
        """A function of a ref: its deadline if ``holder`` holds it in flight, else None (``deadline``'s
        question for each delivery of a run, with no call through the broker each). It reads the
        deliveries of now: ask again after a ``reset``."""
        return self._s.inflight.deadline_of(holder)

    def held_by(self, holder: Hashable) -> Callable[[Ref], bool]:
        """A function of a ref: whether ``holder`` holds it in flight (``deadline_of``'s as a bool)."""
        return self._s.inflight.held_by(holder)


class Account:
    """One payer's part of the byte account (pzq/broker/accounts.py), as a gateway asks it: what it
    holds, its share, whether a notice or an answer may be handed to it, and the charge of bytes other
    than deliveries' bodies. A view (the state and a payer), made on each ask (``Broker.account``): it reads the
    in-flight table of now, so one kept across a ``reset`` still answers right."""

    __slots__ = ("_payer", "_s")

    def __init__(self, state: BrokerState, payer: Hashable):
        self._s, self._payer = state, payer

    def held(self) -> int:
        """Bytes charged to the payer: its deliveries in flight, its stale copies and its piped bytes."""
        return self._s.accounts.held(self._payer, self._s.inflight)

    def in_flight(self) -> int:
        """Bytes of the payer's deliveries in flight (not its stale copies nor piped bytes)."""
        return self._s.inflight.bytes_of(self._payer)

    @property
    def share(self) -> int:
        """The payer's share: its own, set here (the native send socket's pool), or every payer's."""
        return self._s.accounts.share_of(self._payer)

    @share.setter
    def share(self, share: int) -> None:
        self._s.accounts.set_share(self._payer, share)

    def may_hand(self, size: int, unsent: int = 0) -> bool:
        """Whether ``size`` more bytes (a notice, a published frame: not a delivery) may be handed to the
        payer now, ``unsent`` bytes already made for it this turn counted (``DeliveryAccounts.may_hand``)."""
        return self._s.accounts.may_hand(self._payer, size, self._s.inflight, unsent)

    def may_pipe(self, unsent: int) -> bool:
        """Whether the payer may be handed another answer, ``unsent`` bytes made for it not charged yet."""
        return self._s.accounts.may_pipe(self._payer, unsent, self._s.inflight)

    def charge(self, size: int) -> None:
        """``size`` bytes other than a delivery's body were handed to libzmq for the payer (> 0: charged
        until its peer has them, or libzmq freed them), or are no longer held (< 0: released, and
        whoever was refused room may have some now)."""
        state = self._s
        if size > 0:
            state.accounts.hold(self._payer, size)
        elif size < 0 and state.accounts.let_go(self._payer, -size, state.inflight):
            state.readiness += 1
