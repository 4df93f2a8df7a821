"""The views the broker hands gateways, so that none reaches into the store, the in-flight table or the
byte account: ``QueueQuestions`` (a queue's counters, its name, its messages read-only, the queues a
client's request makes), ``Deliveries`` (who holds a delivery, how many a holder has, until when) and a
payer's ``Account``. Each asks the state of now (the in-flight table, which ``reset`` replaces), so a
gateway may keep a view but never a table; each changes broker state only through its named verbs."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

from pzq.broker.implicit import ImplicitQueues, QueueUser
from pzq.broker.ranges import RangeHolds
from pzq.broker.state import BrokerState, Ref
from pzq.store import Message, QueueInfo


class QueueQuestions:
    """Queues as gateways ask about them (``Broker.queues``): read, made by a client's request
    (implicit.py), who else holds their messages, what is left of deleted ones."""

    def __init__(self, state: BrokerState, implicit: ImplicitQueues, ranges: RangeHolds):
        self._s, self._store, self._implicit, self._ranges = state, state.store, implicit, ranges

    def info(self, queue: str) -> QueueInfo | None:
        """The counters of ``queue``; None if there is no such queue (nothing is created)."""
        return self._store.queue(queue, create=False)

    def name(self, qid: int) -> str | None:
        """The name of queue ``qid``; None once it is gone."""
        info = self._store.queue_by_id(qid)
        return None if info is None else info.name

    def create(self, queue: str, owner: Hashable | None = None) -> QueueInfo:
        """``queue``, made implicit if it did not exist (``ImplicitQueues.create_queue``: StoreFull past
        ``owner``'s share of names)."""
        return self._implicit.create_queue(queue, owner)

    def add_user(self, user: QueueUser) -> None:
        """Register a part that keeps things for queues: asked before any implicit queue expires."""
        self._implicit.add_queue_user(user)

    def peek(self, queue: str, from_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages of ``queue`` with seq >= ``from_seq``, in flight or not:
        a read-only look that changes nothing (the API's INFO and SNAPSHOT)."""
        return self._store.scan(queue, from_seq, limit)

    def message(self, ref: Ref) -> Message | None:
        """The stored message of ``ref``; None once it is gone."""
        info = self._store.queue_by_id(ref[0])
        return None if info is None else self._store.get(info.name, ref[1])

    def ref_in(self, queue: str, message_id: str | bytes) -> Ref | None:
        """The ref a client's message id names in ``queue``; None if it names none of its messages."""
        return self._store.catalog.ref_in(queue, message_id)

    def held_by_others(self, qid: int, ours: Callable[[Hashable], bool]) -> bool:
        """True if a message of queue ``qid`` is in flight to (or leased by) a holder that is not
        ``ours`` (a scan of what is in flight: for rare requests)."""
        return self._ranges.held_by_others(qid, ours)

    def dropping_left(self) -> tuple[int, int]:
        """Deleted queues whose records are not all gone yet, and the messages and dead letters left."""
        return self._store.drops.left()


class Deliveries:
    """Deliveries in flight as gateways ask about them (``Broker.deliveries``), and the terms a holder
    sets: a delivery held until a deadline of its own, acks redone after a rolled-back turn."""

    def __init__(self, state: BrokerState):
        self._s = state

    def holder(self, ref: Ref) -> Hashable | None:
        """The consumer ``ref`` is in flight to; None if it is not in flight (a range a group holds
        is not: see ``holder_of``)."""
        delivery = self._s.inflight.get(ref)
        return None if delivery is None else delivery.consumer

    def count(self, holder: Hashable) -> int:
        """How many deliveries ``holder`` holds."""
        return self._s.inflight.count(holder)

    def deadline_of(self, holder: Hashable) -> Callable[[Ref], float | None]:
        """A function of a ref: its deadline if ``holder`` holds it in flight, else None (the question
        for each delivery of a run, with no call through the broker each). It reads the deliveries of
        now: ask again after a ``reset``."""
        return self._s.inflight.deadline_of(holder)

    def held_by(self, holder: Hashable) -> Callable[[Ref], bool]:
        """A function of a ref: whether ``holder`` holds it in flight (``deadline_of``'s as a bool)."""
        return self._s.inflight.held_by(holder)

    def hold(self, ref: Ref, holder: Hashable, deadline: float = math.inf) -> None:
        """``holder`` holds ``ref`` until ``deadline`` (monotonic seconds): a stored message kept from
        every consumer (a durable lease re-registered after a restart: no deadline, its holder decides),
        or a delivery in flight given a deadline of its own (eMQP's timeout:N) instead of the ack
        timeout, its bytes still charged to its payer."""
        inflight = self._s.inflight
        delivery = inflight.get(ref)
        if delivery is None:
            self._s.ready_of(ref[0]).inflight += 1
            inflight.add(ref, deadline, holder)
        else:
            inflight.add(ref, deadline, holder, delivery.size, delivery.payer)

    def redo_on_rollback(self, holder: Hashable) -> None:
        """``holder``'s gateway keeps nothing a rollback undoes: its deliveries outlive a failed turn,
        its acks since the last commit are done again (``BrokerState.redo_on_rollback``)."""
        self._s.redo_on_rollback(holder)


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
