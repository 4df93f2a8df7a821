"""What of a turn's output may leave: the loop's half of one synchronous write a commit.

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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pzq.endpoints.base import Endpoint
    from pzq.store import Store


class Release:
    """The end of each turn: keep its output for the last commit, sync when waiting would cost an
    answer its time, let go of what is on disk."""

    def __init__(self, store: Store):
        self.store = store
        self.holding = False  # output waits for the last commit's meta page: the next turn begins at once

    def end_turn(self, endpoints: Sequence[Endpoint], wrote: bool, idle: Callable[[], bool]) -> None:
        """After the turn's commit (``wrote``: it wrote pages): hold, sync if needed, release.
        ``idle``: no work is ready (asked last, as it polls)."""
        store = self.store
        if store.durable != store.committed:
            for endpoint in endpoints:
                endpoint.hold(store.committed)
            if (
                (self.holding and not wrote)
                or any(e.output_waiting() for e in endpoints if not e.holds_output)
                or idle()
            ):
                store.sync()
        for endpoint in endpoints:
            endpoint.release(store.durable)
        self.holding = store.durable != store.committed

    def finish(self, endpoints: Sequence[Endpoint]) -> None:
        """The loop stops: what waits is synced and let go (flushed by the caller)."""
        self.store.sync()
        for endpoint in endpoints:
            endpoint.release(self.store.durable)
        self.holding = False
