"""The Broker: the queue rules on top of a Store, composed of parts that share one ``BrokerState``.

Each part is a class of its own module, handed the state (state.py: the life of a delivery, its rules
and transition table, and what every part reads and keeps); none inherits from another. The Broker
holds them and offers their verbs under the names gateways, endpoints and the server call, bound once
here (``self.ack_many = settling.ack_many``): a call through the Broker is the part's own call, with no
call of the Broker's between. It keeps for itself only what joins two parts (``drop_queue``,
``produce_all``, ``reset``, ``gone``) and the byte account's questions the server asks.

| part | module | verbs |
|---|---|---|
| state | state.py | ``turn_begins``, ``committed``, ``rolled_back``, ``payer_gone``, ``redo_on_rollback`` |
| producing | produce.py | ``produce``, ``produce_many``, ``begin_big``, ``write_big``, ``produce_big``, ``drop_big``, |
| | | ``check_room`` |
| handing out | handing.py | ``take``, ``take_run``, ``take_columns``, ``has_ready``, ``ready_count`` |
| settling | settle.py | ``ack``, ``ack_many``, ``nack``, ``requeue_at_end``, ``requeue``, ``dead_letter``, |
| | | ``take_back``, ``take_back_many``, ``undeliver``, ``undeliver_many``, ``expire``, |
| | | ``consumer_gone``, ``holds``, ``deadline``, ``stored``, ``next_deadline`` |
| range holds | ranges.py | ``take_ranges``, ``hold_range``, ``release_range``, ``ack_range``, ``holder_of``, |
| | | ``held_ranges`` |
| implicit queues | implicit.py | ``create_queue``, ``add_queue_user``, ``owner_gone``, ``next_sweep``, |
| | | ``sweep_implicit`` |
| questions | questions.py | ``queue_info``, ``peek`` (the queues view's); ``in_flight_to``, ``held_count``, |
| | | ``deadline_of``, ``hold`` (the deliveries view's) |
| whole queues | queues.py | ``requeue_dead``, ``dropping_left``, ``drop_work``, ``purge``, ``queue_inflight``, |
| | | ``queue_figures``, ``stats``, ``totals``, ``queue_counts`` |
| delivery accounts | accounts.py | ``accounts`` itself (``delivery_bytes``, ``bank``, ``memory_stats`` here) |

Gateways see the Broker as gateways/contract.py's ``BrokerSurface``: a few verbs, and three views of
questions.py, held (``queues``, ``deliveries``) or made for a payer (``account(payer)``: its part of the
byte account), each a few named questions and verbs, never a table. The names above that no gateway
uses are the server's, the leases' and the tests'.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pzq.broker.handing import Handing
from pzq.broker.implicit import ImplicitQueues
from pzq.broker.produce import Producing
from pzq.broker.questions import Account, Deliveries, QueueQuestions
from pzq.broker.queues import Queues
from pzq.broker.ranges import RangeHolds
from pzq.broker.settle import Settling
from pzq.broker.state import BrokerState, Ref
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import StoreFull
from pzq.inflight import InFlight
from pzq.store import Message, Store


class Broker:
    """The queue rules on top of a Store; single-threaded, driven by the server loop."""

    def __init__(
        self,
        store: Store,
        *,
        ack_timeout_s: float,
        max_deliveries: int = 0,
        limits: Limits = DEFAULT_LIMITS,
        implicit_ttl_s: float = 60.0,
    ):
        """``implicit_ttl_s``: how long a queue made by a client's request lives unused (see implicit.py)."""
        state = BrokerState(store, ack_timeout_s=ack_timeout_s, max_deliveries=max_deliveries, limits=limits)
        self._state = state
        # What is never replaced, as plain attributes (the in-flight table and the counts that change
        # are properties below)
        self.store, self.counters, self.per_queue, self.events = store, state.counters, state.per_queue, state.events
        self.accounts = state.accounts
        self.turn_begins, self.committed, self.rolled_back = state.turn_begins, state.committed, state.rolled_back
        self.payer_gone, self.redo_on_rollback = state.payer_gone, state.redo_on_rollback

        producing = self._producing = Producing(state)
        self.produce, self.produce_many = producing.produce, producing.produce_many
        self.begin_big, self.write_big = producing.begin_big, producing.write_big
        self.produce_big, self.drop_big = producing.produce_big, producing.drop_big
        self.check_room = producing.check_room

        handing = self._handing = Handing(state)
        self.take, self.take_run, self.take_columns = handing.take, handing.take_run, handing.take_columns
        self.has_ready, self.ready_count = handing.has_ready, handing.ready_count

        settling = self._settling = Settling(state)
        self.ack, self.ack_many = settling.ack, settling.ack_many
        self.nack, self.requeue = settling.nack, settling.requeue
        self.requeue_at_end, self.dead_letter = settling.requeue_at_end, settling.dead_letter
        self.take_back, self.take_back_many = settling.take_back, settling.take_back_many
        self.undeliver, self.undeliver_many = settling.undeliver, settling.undeliver_many
        self.expire, self.consumer_gone = settling.expire, settling.consumer_gone
        self.holds, self.deadline = settling.holds, settling.deadline
        self.stored, self.next_deadline = settling.stored, settling.next_deadline

        ranges = self._ranges = RangeHolds(state)
        self.take_ranges, self.hold_range = ranges.take_ranges, ranges.hold_range
        self.release_range, self.ack_range = ranges.release_range, ranges.ack_range
        self.holder_of, self.held_ranges = ranges.holder_of, ranges.held_ranges
        store.on_set_aside.append(ranges.set_aside)

        implicit = self._implicit = ImplicitQueues(
            state,
            self.drop_queue,
            ttl_s=implicit_ttl_s,
            per_owner=max(1, store.catalog.max_queues // limits.implicit_connection_part),
            sweep_per_call=limits.implicit_sweep_per_turn,
            reserve_part=limits.share_reserve_part,
        )
        self.create_queue, self.add_queue_user = implicit.create_queue, implicit.add_queue_user
        self.owner_gone = implicit.owner_gone
        self.next_sweep, self.sweep_implicit = implicit.next_sweep, implicit.sweep_implicit

        # The views gateways ask (questions.py): held, never replaced (each reads the state of now)
        self.queues = QueueQuestions(state, implicit, ranges)
        self.queue_info, self.peek = self.queues.info, self.queues.peek
        deliveries = self.deliveries = Deliveries(state)
        self.in_flight_to, self.held_count = deliveries.holder, deliveries.count
        self.deadline_of, self.hold = deliveries.deadline_of, deliveries.hold

        queues = self._queues = Queues(state)
        self.requeue_dead, self.drop_work = queues.requeue_dead, queues.drop_work
        self.dropping_left, self.purge = queues.dropping_left, queues.purge
        self.queue_inflight, self.queue_figures = queues.queue_inflight, queues.queue_figures
        self.stats, self.totals, self.queue_counts = queues.stats, queues.totals, queues.queue_counts

    # -- the state's figures that change (read and set through the state, where every part sees them)

    # (Settable as the plain attributes they were, so that a Protocol naming them as attributes still
    # matches; nothing outside the broker sets them.)

    @property
    def inflight(self) -> InFlight[Ref]:
        """Every delivery in flight (replaced by ``reset``: never keep it)."""
        return self._state.inflight

    @inflight.setter
    def inflight(self, inflight: InFlight[Ref]) -> None:
        self._state.inflight = inflight

    @property
    def readiness(self) -> int:
        """Grows whenever messages may have become ready (rule 9 in state.py)."""
        return self._state.readiness

    @readiness.setter
    def readiness(self, readiness: int) -> None:
        self._state.readiness = readiness

    @property
    def refusing(self) -> str | None:
        """While set (the server's memory alarm), every producer is refused with this text."""
        return self._state.refusing

    @refusing.setter
    def refusing(self, reason: str | None) -> None:
        self._state.refusing = reason

    @property
    def implicit_expired(self) -> int:
        """Queues made by clients' requests that expired since start."""
        return self._implicit.implicit_expired

    @property
    def implicit_refused(self) -> int:
        """New queue names refused past a client's share or into the reserve since start."""
        return self._implicit.implicit_refused

    @property
    def dropping(self) -> bool:
        """True while deleted queues' records are left to delete (``drop_work``)."""
        return bool(self.store.drops.dropping)

    # -- what joins two parts -------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every delivery, as a restart does (and start the unused queues' clocks again)."""
        self._state.reset()
        self._implicit.reset()

    def gone(self, key: Hashable) -> int:
        """``key``'s end (a connection closed, a consumer cancelled, a pool's epoch passed), whatever it
        was: what it holds in flight goes back to its queues (``consumer_gone``; returns how many), what
        was charged to it is let go (``payer_gone``), the queues it made no longer count against it
        (``owner_gone``). Each part is a no-op for a key that was not that (and costs O(1) then)."""
        returned = self.consumer_gone(key) if self._state.inflight.count(key) else 0
        if not returned:
            self.payer_gone(key)  # (``consumer_gone`` did, when it had deliveries)
        self.owner_gone(key)
        return returned

    def drop_queue(self, queue: str) -> int:
        """Delete a queue and everything in it, in flight included; returns how many messages it had.
        It is gone for every client at once (its name may make a new, empty queue) and no longer counts
        against whoever made it; its records are deleted by ``drop_work``, a share per turn."""
        self._implicit.forget_owner(queue)
        return self._queues.drop_queue(queue)

    def produce_all(
        self, items: Sequence[tuple[str, Sequence[bytes]]], *, now_us: int, meta: dict | None = None
    ) -> list[Message]:
        """Store every ``(queue, body)`` or none: on StoreFull what this call stored is deleted again,
        so that a client's retry of a refused batch (or fan-out) stores no duplicates."""
        stored: list[Message] = []
        try:
            for queue, body in items:
                stored.append(self.produce(queue, body, now_us=now_us, meta=meta))
        except StoreFull:
            for message in stored:
                self.store.delete(message.queue, message.seq)
                self.per_queue[message.queue]["produced"] -= 1
            self.counters.produced -= len(stored)
            raise
        return stored

    # -- the byte account as the server's memory bound asks it (accounts.py): no table read

    def delivery_bytes(self) -> int:
        """Bytes charged to every payer: deliveries in flight, stale copies and piped bytes."""
        return self.accounts.total(self._state.inflight)

    def bank(self, *, others: int, ceiling: int, high_water: int) -> None:
        """The memory bound's figures for this turn (``DeliveryAccounts.bank``)."""
        self.accounts.bank(others=others, ceiling=ceiling, high_water=high_water)

    def memory_stats(self) -> dict:
        """The byte account's figures for the monitor's ``memory``."""
        return self.accounts.stats(self._state.inflight)

    def account(self, payer: Hashable) -> Account:
        """``payer``'s part of the byte account, as a gateway asks it (questions.py's ``Account``)."""
        return Account(self._state, payer)
