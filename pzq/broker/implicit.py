"""The broker's part that keeps the queues made by clients' requests: who made them (a share each),
who still uses them, and their expiry.

A queue a client's request made (a produce, an MQKS consume or rebind, a consumer group) is *implicit*
(``QueueInfo.implicit``); one named by the operator (``--queue``) is explicit and never expires. An
implicit queue expires once it has been unused for ``implicit_ttl_s``: unused means no message (ready,
in flight or dead), no range a group holds, and no *user* that says it uses the queue. A user is any
part with consumers, bindings, workers, schedules or groups (the gateways, the leases): it registers
with ``add_queue_user`` and answers ``uses_queue``; it is told ``queue_expired`` when a queue goes, so
that it forgets what it kept for it. Nobody reaches into anyone else's tables.

The sweep (``sweep_implicit``) looks at a bounded share of the implicit queues per call, so the loop
can run it as one of its periodic tasks inside the turn budget; a whole pass over them is followed by
a rest of a quarter of the TTL (at most 10 s): queues in use cost a look each per pass, not per turn.

Shares: a client (``owner``: a connection, or a CURVE key where there is one) has at most
``Limits.implicit_connection_part``-th of ``--max-queues`` implicit queues alive that it made, and the
store keeps ``Limits.implicit_reserved_part``-th of ``--max-queues`` for explicit queues
(``Store.max_implicit``). Of the room left to implicit queues, the last ``Limits.share_reserve_part``-th
is kept for clients that have made none yet (as ``pzq.limits.ClientShares`` keeps its pools'): however
many clients filled the rest, each within its share, a new client can still make its first queue. (91
short API connections that each made 100 queues holding a message, which never expire, took every
name: an honest new queue was refused on every door.) Connections that come and go can still fill the
room: while implicit queues fill nine tenths of it (``pressed``), the unused ones expire at once, a pass
every second, so that honest clients' new names find room again within seconds, not after the TTL.
What that leaves a client with thousands of connections (without CURVE, each is a client of its own):
the reserve, one queue a connection; then new names are refused until queues empty and expire.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Protocol

from pzq.broker.state import BrokerState
from pzq.errors import StoreFull
from pzq.store import QueueInfo

log = logging.getLogger("pzq.broker")

SWEEP_REST_S = 10.0  # the longest rest between two passes of the sweep
PRESSED_REST_S = 1.0  # the rest while implicit queues fill nine tenths of their room: they expire unused at once


class QueueUser(Protocol):
    """A part that keeps things of its own for queues (consumers, bindings, workers, schedules, groups)."""

    def uses_queue(self, queue: str) -> bool:
        """True while this part still uses ``queue`` (it must then not expire)."""
        ...

    def queue_expired(self, queue: str) -> None:
        """``queue`` was unused for the TTL and is gone: forget what was kept for it."""
        ...


class ImplicitQueues:
    """The Broker's implicit queues: their owners' shares, their users and their bounded expiry."""

    def __init__(
        self,
        state: BrokerState,
        drop: Callable[[str], int],
        *,
        ttl_s: float,
        per_owner: int,
        sweep_per_call: int,
        reserve_part: int = 8,
    ):
        """``drop``: deletes a queue (the Broker's ``drop_queue``, which tells ``forget_owner``)."""
        self._s, self._store, self._drop = state, state.store, drop
        self.implicit_ttl_s = ttl_s
        self.implicit_per_owner = per_owner  # 0: no share per owner
        self.implicit_reserve_part = max(1, reserve_part)  # the room's last part, for clients that made none
        self.sweep_per_call = sweep_per_call
        self._users: list[QueueUser] = []
        self._made_by: dict[Hashable, set[str]] = {}  # owner -> implicit queues it made that still exist
        self._owner_of: dict[str, Hashable] = {}  # and back: both as many entries as implicit queues at most
        # implicit queue -> (when the sweep first saw it unused, its next seq then): a message produced
        # and taken between two looks moves the next seq, and its clock starts again
        self._unused_since: dict[str, tuple[float, int]] = {}
        self._sweep_names: list[str] = []
        self._sweep_at = 0
        self._next_sweep = 0.0
        # When the last pass ended (none yet: long ago, but a finite time: a store whose implicit queues
        # filled nine tenths of their room when it was opened made the first sweep due at minus infinity,
        # and the loop's wait for it an OverflowError, every turn)
        self._pass_done = 0.0
        self.implicit_expired = 0  # queues expired since start (figures)
        self.implicit_refused = 0  # new names refused past a client's share or into the reserve (figures)

    def add_queue_user(self, user: QueueUser) -> None:
        """Register a part that keeps things for queues: asked before any implicit queue expires."""
        self._users.append(user)

    def create_queue(self, queue: str, owner: Hashable | None = None) -> QueueInfo:
        """``queue``, made implicit (durable with the next commit) if it did not exist; StoreFull when
        there is no room for it, ``owner`` made its share already, ``owner`` made some and only the
        reserve for clients that made none is left, or implicit queues have taken theirs; StoreError for
        a bad name. ``owner`` is who asks: a connection, or its CURVE key."""
        info = self._store.queue(queue, create=False)
        if info is not None:
            return info
        if owner is not None and self.implicit_per_owner:
            made = self._made_by.get(owner)
            refusal = self._refusal(len(made) if made else 0)
            if refusal is not None and made:
                for stale in [name for name in made if not self._still_implicit(name)]:
                    self.forget_owner(stale)  # (made in a turn that was rolled back)
                refusal = self._refusal(len(made))
            if refusal is not None:
                self.implicit_refused += 1
                raise StoreFull(refusal)
        try:
            info = self._store.queue(queue, implicit=True)
        except StoreFull:
            self.implicit_refused += 1
            raise
        if owner is not None and self.implicit_per_owner:
            self._made_by.setdefault(owner, set()).add(queue)
            self._owner_of[queue] = owner
        return info

    def _refusal(self, made: int) -> str | None:
        """Why a client that made ``made`` queues still there may make no other; None if it may."""
        if made >= self.implicit_per_owner:
            return (
                f"queue full: this client made {made} queues that still exist, its share of "
                "--max-queues (they expire when empty and unused)"
            )
        reserve = self._store.catalog.max_implicit // self.implicit_reserve_part
        if made and self._store.catalog.implicit_count >= self._store.catalog.max_implicit - reserve:
            return (
                f"queue full: the last {reserve} queues clients' requests may make are kept for clients "
                f"that have made none yet, and this one made {made} (they expire when empty and unused)"
            )
        return None

    def owner_gone(self, owner: Hashable) -> None:
        """A connection closed: its queues are no longer counted against it (they expire on their own)."""
        for queue in self._made_by.pop(owner, ()):
            self._owner_of.pop(queue, None)

    def forget_owner(self, queue: str) -> None:
        """``queue`` is gone: it no longer counts against whoever made it."""
        owner = self._owner_of.pop(queue, None)
        made = self._made_by.get(owner) if owner is not None else None
        if made is not None:
            made.discard(queue)
            if not made:
                del self._made_by[owner]

    def _still_implicit(self, queue: str) -> bool:
        info = self._store.queue(queue, create=False)
        return info is not None and info.implicit

    def in_use(self, info: QueueInfo) -> bool:
        """True if the queue holds anything or any user still uses it."""
        if info.count or info.dead_count or self._s.ranges.get(info.qid):
            return True
        return any(user.uses_queue(info.name) for user in self._users)

    def pressed(self) -> bool:
        """True while implicit queues fill nine tenths of the room they may take: a flood of names from
        connections that come and go, each within its share. Unused ones then expire at once."""
        return self._store.catalog.implicit_count * 10 >= self._store.catalog.max_implicit * 9

    def next_sweep(self) -> float | None:
        """When the sweep has work next (None while there are no implicit queues)."""
        if not self._store.catalog.implicit_count:
            return None
        return min(self._next_sweep, self._pass_done + PRESSED_REST_S) if self.pressed() else self._next_sweep

    def sweep_implicit(self, now: float, deadline: float | None = None) -> int:
        """Look at up to ``sweep_per_call`` implicit queues and delete those unused for the TTL; returns
        how many went. A queue's clock starts when the sweep first finds it unused and stops whenever it
        is in use again. ``deadline`` (monotonic; the turn's budget) stops it early, between queues, after
        at least a few: a deletion costs some LMDB work, so the count alone does not bound the time."""
        due = self.next_sweep()
        if due is None or now < due:
            return 0
        ttl = 0.0 if self.pressed() else self.implicit_ttl_s
        if self._sweep_at >= len(self._sweep_names):  # a pass begins: with the implicit queues of now
            self._sweep_names, self._sweep_at = self._store.catalog.implicit_names(), 0
            known = set(self._sweep_names)
            for name in [n for n in self._unused_since if n not in known]:
                del self._unused_since[name]
        expired = 0
        end = min(len(self._sweep_names), self._sweep_at + self.sweep_per_call)
        begun = self._sweep_at
        while self._sweep_at < end:
            looked = self._sweep_at - begun
            if deadline is not None and looked and looked % 16 == 0 and time.monotonic() >= deadline:
                break  # (16 queues at least: a call always moves the pass on)
            name = self._sweep_names[self._sweep_at]
            self._sweep_at += 1
            info = self._store.queue(name, create=False)
            if info is None or not info.implicit or self.in_use(info):
                self._unused_since.pop(name, None)
                continue
            since, seq = self._unused_since.get(name, (now, info.next_seq))
            if seq != info.next_seq:
                since = now
            self._unused_since[name] = (since, info.next_seq)
            if now - since >= ttl:
                self._expire_queue(name)
                expired += 1
        if self._sweep_at >= len(self._sweep_names):  # the pass is done: rest (the next goes on at once)
            self._next_sweep = now + min(SWEEP_REST_S, self.implicit_ttl_s / 4)
            self._pass_done = now
        if expired:  # (one line a call, not one a queue: a flood's queues expire together)
            log.info(
                "%d queue(s) made by clients' requests expired: empty and unused for %gs", expired, self.implicit_ttl_s
            )
        return expired

    def _expire_queue(self, queue: str) -> None:
        del self._unused_since[queue]
        self._drop(queue)
        for user in self._users:
            user.queue_expired(queue)
        self.implicit_expired += 1
        log.debug("queue %r expired", queue)

    def reset(self) -> None:
        """The turn was rolled back: every clock starts again (a queue the sweep deleted may be back)."""
        self._unused_since.clear()
        self._sweep_names, self._sweep_at = [], 0
