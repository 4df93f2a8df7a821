"""The broker's part that answers what gateways ask about queues and deliveries, so that none reaches
into the store or the in-flight table: a queue's counters, its name, room for a side record, a
read-only look at its messages, who holds a delivery, and what a payer holds of the byte account
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

    # -- the byte account as a gateway asks it (pzq/broker/accounts.py), without the in-flight table

    def bytes_held(self, payer: Hashable) -> int:
        """Bytes charged to ``payer``: its deliveries in flight, its stale copies and its piped bytes."""
        return self._s.accounts.held(payer, self._s.inflight)

    def bytes_in_flight(self, payer: Hashable) -> int:
        """Bytes of ``payer``'s deliveries in flight (not its stale copies nor piped bytes)."""
        return self._s.inflight.bytes_of(payer)

    def room_of(self, payer: Hashable) -> int:
        """Bytes ``payer`` may still be handed, as ``take`` asks (0: none, and the payer is remembered,
        to be woken when a release gives it room)."""
        return self._s.accounts.room(payer, self._s.inflight)

    def may_hand(self, payer: Hashable, size: int) -> bool:
        """Whether ``size`` more bytes (a notice, not a delivery) may be handed to ``payer`` now."""
        return self._s.accounts.may_hand(payer, size, self._s.inflight)

    def may_pipe(self, payer: Hashable, unsent: int) -> bool:
        """Whether ``payer`` may be handed another answer, ``unsent`` bytes made for it not charged yet."""
        return self._s.accounts.may_pipe(payer, unsent, self._s.inflight)
