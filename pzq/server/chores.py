"""The loop's own chores in a turn, beside the endpoints' reads and works: lease returns, expiry, the sweep
of implicit queues, dropped queues' records and the once-a-second tick, each drawn on the turn's budget.

``tasks`` lays the turn out in its usual order; the loop (pzq/server/loop.py) serves it round-robin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pzq.clock import Now
from pzq.endpoints.base import TurnBudget

if TYPE_CHECKING:
    from pzq.admin import Admin
    from pzq.broker import Broker
    from pzq.config import Limits
    from pzq.endpoints.base import Endpoint
    from pzq.leases import Leases

TICK_S = 1.0  # housekeeping (rates, lease expiry); idle wake-ups are at most this frequent

Task = Callable[[dict, Now], None]  # (ready sockets, the turn's Now)


class Chores:
    """The turn's work that is no endpoint's. ``budget`` is the turn's (the loop sets it at each turn);
    ``each_second`` is the server's part of the tick (metrics, the console's process)."""

    def __init__(
        self, broker: Broker, leases: Leases, admin: Admin, limits: Limits, each_second: Callable[[Now], None]
    ):
        self.broker = broker
        self.leases = leases
        self.admin = admin
        self.limits = limits
        self.each_second = each_second
        self.budget = TurnBudget.start(0.0, 0)
        self.next_tick = 0.0  # when the tick is next due (monotonic): a wake-up of the loop

    def tasks(self, endpoints: Sequence[Endpoint]) -> list[Task]:
        """The turn's work before the commit, in its usual order: each endpoint's reads, lease returns,
        expiry, each endpoint's dispatch, the sweep, dropped queues' records, the once-a-second tick."""
        reads = [self._reader(e) for e in endpoints]
        works = [self._worker(e) for e in endpoints]
        return [*reads, self.lease_work, self.expire, *works, self.sweep, self.drop_work, self.tick]

    @staticmethod
    def _reader(endpoint: Endpoint) -> Task:
        return lambda ready, now: endpoint.read(ready, now)

    def _worker(self, endpoint: Endpoint) -> Task:
        def work(ready: dict, now: Now) -> None:
            endpoint.work(now)
            self.budget.take()

        return work

    def lease_work(self, ready: dict, now: Now) -> None:
        if self.leases.pending:  # (a share per turn of big acks, expiries, within the turn's records)
            share = self.leases.share_left()
            most = min(share, self.budget.records_for(share))
            self.leases.work(now.wall_us, most)
            self.budget.take(records=most)

    def expire(self, ready: dict, now: Now) -> None:
        # (what comes back raises the broker's readiness; the rest next turn: next_deadline is then due)
        expired = self.broker.expire(now.mono, self.budget.records_for(self.limits.turn_records))
        self.budget.take(records=expired)

    def sweep(self, ready: dict, now: Now) -> None:
        """Queues made by clients' requests that stayed unused for --implicit-queue-ttl go (a share a turn)."""
        due = self.broker.next_sweep()
        if due is not None and now.mono >= due:
            self.broker.sweep_implicit(now.mono, self.budget.deadline)
            self.budget.take()

    def drop_work(self, ready: dict, now: Now) -> None:
        """Records of deleted queues (MQKS delete_queue) go, within the turn's records and clock."""
        if self.broker.dropping:
            most = self.budget.records_for(self.limits.turn_records)
            self.budget.take(records=max(1, self.broker.drop_work(most, self.budget.deadline)))

    def tick(self, ready: dict, now: Now) -> None:
        """Once a second: expired leases, the admin's rates, the events' interval, then the server's part."""
        if now.mono < self.next_tick:
            return
        self.leases.mark_expired(now.wall_us)
        self.admin.tick(now.mono)
        self.broker.events.tick(now.mono)
        self.next_tick = now.mono + TICK_S
        self.each_second(now)
        self.budget.take()
