"""What gateways ask the broker about queues and deliveries, so that none reaches into the store or
the in-flight table: a queue's counters, its name, room for a side record, a read-only look at its
messages, and who holds a delivery."""

from __future__ import annotations

from collections.abc import Hashable

from pzq.broker.state import BrokerState, Ref
from pzq.store import Message, QueueInfo


class Questions(BrokerState):
    """Read-only questions (a gateway's queue creation is ``create_queue``, in implicit.py)."""

    def queue_info(self, queue: str) -> QueueInfo | None:
        """The counters of ``queue``; None if there is no such queue (nothing is created)."""
        return self.store.queue(queue, create=False)

    def queue_name(self, qid: int) -> str | None:
        """The name of queue ``qid``; None once it is gone."""
        info = self.store.queue_by_id(qid)
        return None if info is None else info.name

    def check_room(self, size: int) -> None:
        """Raise StoreFull unless ``size`` more bytes fit (a gateway's side record, checked before
        anything changes)."""
        self.store.check_room(size)

    def peek(self, queue: str, from_seq: int, limit: int) -> list[Message]:
        """Up to ``limit`` stored messages of ``queue`` with seq >= ``from_seq``, in flight or not:
        a read-only look that changes nothing (the API's INFO and SNAPSHOT)."""
        return self.store.scan(queue, from_seq, limit)

    def ref_in(self, queue: str, message_id: str | bytes) -> Ref | None:
        """The ref a client's message id names in ``queue``; None if it names none of its messages."""
        return self.store.catalog.ref_in(queue, message_id)

    def in_flight_to(self, ref: Ref) -> Hashable | None:
        """The consumer ``ref`` is in flight to; None if it is not in flight (a range a group holds
        is not: see ``holder_of``)."""
        delivery = self.inflight.get(ref)
        return None if delivery is None else delivery.consumer
