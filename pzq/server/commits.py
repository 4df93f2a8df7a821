"""The group-commit boundary: when a turn's writes are committed, and what of its output may leave.

A turn's writes are committed at its end when a producer waits for its ack; otherwise they gather for
--commit-interval (consumers' acks, delivery counts).

A commit syncs its data pages and writes its meta page without waiting (pzq/store/environment.py): the
next commit's data sync carries that page to the disk. So each turn's output is kept for the last commit
(``Endpoint.hold``) and let go once that commit is on disk (``Endpoint.release``). Under load the next
turn's commit carries it: one sync a commit. The loop syncs the meta page on its own (``Store.sync``)
only when waiting for the next commit could keep an answer waiting:

- no more work is ready (the loop would sleep): a lone producer's ack never waits for the next message
  or for --commit-interval;
- output waited a whole turn and that turn wrote nothing (a turn of reads only carries nothing);
- an endpoint that does not hold its output (PHPMQ, MQKS, eMQP, API, monitor) has something to send.

A failed commit or sync while an earlier commit is not known on disk stops the server (SyncLost): the
kernel may have dropped that page's write, and what was kept for it is never sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pzq.broker import Broker
    from pzq.endpoints.base import Endpoint
    from pzq.metrics import Metrics
    from pzq.store import Store


class Commits:
    """The end of each turn: commit if due, keep its output for the last commit, sync when waiting
    would cost an answer its time, let go of what is on disk."""

    def __init__(self, store: Store, broker: Broker, interval_s: float):
        self.store = store
        self.broker = broker
        self.interval_s = interval_s
        self.metrics: Metrics | None = None
        self.holding = False  # output waits for the last commit's meta page: the next turn begins at once
        self.dirty_since: float | None = None  # when uncommitted writes nobody waits for began
        self.last_ms = 0.0  # the last commit's duration
        self._produced_at_commit = 0
        self._released: int | None = None  # the durable commit the endpoints' output was last released to

    def due_at(self) -> float | None:
        """When writes that gather must be committed (monotonic), if any gather."""
        return None if self.dirty_since is None else self.dirty_since + self.interval_s

    def commit_if_due(self, now: float, waiting: bool) -> bool:
        """Commit when a producer waits for its ack, or writes gathered for the interval; True when a
        commit wrote pages (and so synced, carrying the commit before it)."""
        store = self.store
        if not store.dirty:
            return False
        if self.dirty_since is None:
            self.dirty_since = now
        if not waiting and now - self.dirty_since < self.interval_s:
            return False
        started, syncs = time.perf_counter(), store.syncs
        store.commit(counts_older_than=now - self.interval_s)
        self.broker.committed()
        self.last_ms = (time.perf_counter() - started) * 1000
        if self.metrics is not None:
            produced = self.broker.counters.produced
            self.metrics.observe_commit(time.perf_counter() - started, produced - self._produced_at_commit)
            self._produced_at_commit = produced
        self.dirty_since = now if store.dirty else None
        return store.syncs != syncs

    def end_turn(self, endpoints: Sequence[Endpoint], wrote: bool, idle: Callable[[], bool]) -> None:
        """After the turn's commit (``wrote``: it wrote pages): hold, sync if needed, release.
        ``idle``: no work is ready (asked last, as it polls)."""
        store = self.store
        holders = [e for e in endpoints if e.holds_output]  # (the others' hold and release do nothing)
        if store.durable != store.committed:
            for endpoint in holders:
                endpoint.hold(store.committed)
            if (
                (self.holding and not wrote)
                or any(e.output_waiting() for e in endpoints if not e.holds_output)
                or idle()
            ):
                store.sync()
        # Released only when what is durable moved: a hold is always for a commit past it (it is held
        # because the two differ), so with ``durable`` where it was nothing held can go (a call for
        # nothing on each endpoint, every turn, was a turn's fixed cost)
        if store.durable != self._released:
            for endpoint in holders:
                endpoint.release(store.durable)
            self._released = store.durable
        self.holding = store.durable != store.committed

    def finish(self, endpoints: Sequence[Endpoint]) -> None:
        """The loop stops: what waits is synced and let go (flushed by the caller)."""
        self.store.sync()
        for endpoint in endpoints:
            endpoint.release(self.store.durable)
        self._released = self.store.durable
        self.holding = False
