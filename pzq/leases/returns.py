"""Work a consumer group leaves for later turns: deleting acknowledged runs, returning expired ones.

Every call here stops within one turn's share (``Limits.lease_work_per_turn`` messages and
``Limits.lease_call_budget_s`` of work), so a group of a million leases never holds the loop. What one
call of the API may cost (``Limits``): a lease or a fetch stops after ``lease_call_budget_s`` of work,
or where the server's turn budget ends if sooner (after its first chunk at least), or after ``max_lease``,
``max_fetch`` messages, and answers the shorter range; the caller goes on from its end. The turn's
records bound the deletions of an ACK_UPTO and of each turn's share. A lease writes one record per run
of consecutive seqs and holds one range per run, whatever its size; what costs is reading the messages
(their TTL and delivery cap are checked), about 2 µs each.
Runs (records, held ranges) of one group (``max_runs_per_group``) and of all groups (``max_runs``)
are bounded: a run costs a record and ~100 B, and every lookup bisects them. A fresh queue's lease is
one run; a queue shared with other consumers splits into more. Past either limit a lease answers the
shorter range it has (possibly none).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable

from pzq.broker import Broker, Exclusive
from pzq.config import ClientShares, Limits
from pzq.store.groups import Groups, LeaseRecords

log = logging.getLogger("pzq.leases")


@dataclasses.dataclass
class Group:
    """One consumer group of one queue: leases ``base .. end-1`` are held and not yet acknowledged."""

    queue: str
    qid: int
    name: str
    gid: int
    base: int = 0
    end: int = 0
    deadline_us: int = 0  # wall clock, so it outlives restarts
    saved_deadline_us: int = 0
    owner: str | None = None  # the CURVE key (z85) the group belongs to; None: any client (no CURVE)
    tail: tuple[int, int, int, int] | None = None  # its last run (lease seq, seq, count, deliveries), if known
    runs: int = 0  # lease records it has (each a held range until acknowledged or returned)

    @property
    def holder(self) -> Exclusive:
        return Exclusive(f"lease {self.gid}")

    def key(self) -> tuple[int, str]:
        return self.qid, self.name


class TurnRecords:
    """The records the server's turn has left, as lease calls see them: ``budget`` is the loop's
    TurnBudget (anything with ``records_left`` and ``take``), None outside a server's turn (unbounded)."""

    __slots__ = ("budget",)

    def __init__(self, budget=None):
        self.budget = budget

    def __call__(self) -> int:
        return 1 << 62 if self.budget is None else self.budget.records_left

    def took(self, records: int) -> None:
        if self.budget is not None:
            self.budget.take(0, records)

    def deadline(self, seconds: float) -> float:
        """A call's ``time.perf_counter()`` deadline: ``seconds`` from now, and no later than the turn's
        budget (one call whose work began late in a turn must not take the turn far past it)."""
        left = seconds if self.budget is None else min(seconds, max(0.0, self.budget.left()))
        return time.perf_counter() + left


UNBOUNDED_RECORDS = TurnRecords()


class LeaseReturns:
    """The part of ``Leases`` that runs a share per turn; ``Leases`` adds the calls."""

    broker: Broker
    limits: Limits
    group_table: Groups
    lease_table: LeaseRecords
    timeout_us: int
    groups: dict[tuple[str, str], Group]
    group_queues: collections.Counter[str]
    expired_total: int
    runs_total: int
    _spent: int
    _acking: set[tuple[str, str]]
    _expiring: set[tuple[str, str]]
    group_shares: ClientShares  # each client's share of max_groups (its CURVE key, else its peer)
    _group_maker: dict[tuple[str, str], object]  # who made each group since start-up
    turn_records: TurnRecords  # the server's turn as lease calls see it (its records and its clock)

    def _release_group(self, key: tuple[str, str]) -> None:
        """The group is gone: it no longer counts against its maker's share."""
        maker = self._group_maker.pop(key, None)
        if maker is not None:
            self.group_shares.add(maker, -1)

    def _save(self, group: Group) -> None:
        record: list[int | str] = [group.gid, group.base, group.end, group.deadline_us]
        if group.owner is not None:
            record.append(group.owner)
        self.group_table.put(group.key(), record)
        group.saved_deadline_us = group.deadline_us

    def drop_queue(self, queue: str) -> None:
        """Forget every group of a queue that is being deleted, with its lease records."""
        for key in [k for k in self.groups if k[0] == queue]:
            group = self.groups.pop(key)
            self.group_queues.pop(queue, None)
            self._release_group(key)
            self._acking.discard(key)
            self._expiring.discard(key)
            self.runs_total -= group.runs
            for record_key in self.lease_table.keys_of_group(group.gid):
                self.lease_table.delete_raw(record_key)
            self.group_table.delete(group.key())

    # -- work spread over turns: deleting acknowledged runs, returning expired ones ----------------

    @property
    def pending(self) -> bool:
        """True while acknowledged runs wait to be deleted or expired ones to go back."""
        return bool(self._acking or self._expiring)

    def mark_expired(self, now_us: int) -> None:
        """Start returning the messages of every group idle past its deadline (``work`` does it)."""
        for group in self.groups.values():
            if group.base == group.end or group.deadline_us > now_us or (group.queue, group.name) in self._expiring:
                continue
            self._expiring.add((group.queue, group.name))
            log.warning(
                "group %r of queue %r was idle for %.0f s: its unacknowledged messages (leases %d..%d) "
                "go back to the queue",
                group.name,
                group.queue,
                self.timeout_us / 1e6,
                group.base,
                group.end - 1,
            )

    def give_back(self, lost: Callable[[Group], bool]) -> int:
        """Start returning the leased messages of every group ``lost`` names (its key may no longer consume
        its queue: a SIGHUP narrowed it), as if it had expired (``work`` does it, a share a turn), so that
        they do not wait --lease-timeout for a reader that is refused; returns how many groups."""
        given = 0
        for key, group in self.groups.items():
            if group.base < group.end and key not in self._expiring and lost(group):
                group.deadline_us = 0  # (expired: a call of its key, let in again, keeps what is left)
                self._expiring.add(key)
                given += 1
                log.warning(
                    "group %r of queue %r: its key may no longer consume the queue: its unacknowledged "
                    "messages (leases %d..%d) go back to the queue",
                    group.name,
                    group.queue,
                    group.base,
                    group.end - 1,
                )
        return given

    def share_left(self) -> int:
        """What is left of this turn's share of deletions and returns (``work``'s default budget)."""
        return max(0, self.limits.lease_work_per_turn - self._spent)

    def expire(self, now_us: int) -> int:
        """``mark_expired`` and one turn's ``work``: how many messages went back in this call."""
        self.mark_expired(now_us)
        return self.work(now_us)

    def work(self, now_us: int, budget: int | None = None) -> int:
        """One turn's share: delete acknowledged messages and return expired groups' messages to their
        queues, at most ``budget`` (self.limits.lease_work_per_turn, less what an ACK_UPTO of this turn did) and
        self.limits.lease_call_budget_s of work; returns how many went back. A group of a million leases never holds
        the loop."""
        budget = (self.limits.lease_work_per_turn - self._spent) if budget is None else budget
        self._spent = 0
        deadline = time.perf_counter() + self.limits.lease_call_budget_s
        for key in list(self._acking):
            group = self.groups.get(key)
            if group is None:
                self._acking.discard(key)
                continue
            budget = self._ack_some(group, budget, deadline)
            if budget <= 0 or time.perf_counter() > deadline:
                return 0
        returned = 0
        for key in list(self._expiring):
            group = self.groups.get(key)
            if group is None or group.deadline_us > now_us or key in self._acking:
                if group is None or group.deadline_us > now_us:
                    self._expiring.discard(key)  # (gone, or called again in time: what is left stays)
                continue
            n, budget = self._return_some(group, budget, deadline)
            returned += n
            if budget <= 0 or time.perf_counter() > deadline:
                break
        self.expired_total += returned
        return returned

    def _ack_some(self, group: Group, budget: int, deadline: float) -> int:
        """Delete the messages of group's runs below its base, within ``budget`` and ``deadline``;
        returns the budget left."""
        while budget > 0 and time.perf_counter() <= deadline:
            first = self.lease_table.first(group.gid)
            if first is None or first[1] >= group.base:
                self._acking.discard((group.queue, group.name))
                return budget
            key, lseq, run = first
            if run is None:  # a damaged record: its leases are gone
                self.lease_table.delete_raw(key)
                continue
            seq, count, deliveries = run
            upto = seq + min(count, group.base - lseq)
            deleted, at = self.broker.ack_range(group.qid, seq, upto, group.holder, budget)
            budget -= max(deleted, 1)
            self._advance(group, key, lseq, run, at - seq)
        return budget

    def _return_some(self, group: Group, budget: int, deadline: float) -> tuple[int, int]:
        """Send back an expired group's leased messages, lowest leases first, with their delivery
        count raised (written with this turn), within ``budget`` seqs and ``deadline``; its base
        follows. Returns (how many went back, the budget left)."""
        returned = 0
        while budget > 0 and time.perf_counter() <= deadline:
            first = self.lease_table.first(group.gid)
            if first is None:
                group.base = group.end
                self._expiring.discard((group.queue, group.name))
                break
            key, lseq, run = first
            if run is None:
                self.lease_table.delete_raw(key)
                continue
            seq, count, deliveries = run
            k = min(count, budget)
            returned += self.broker.release_range(group.qid, seq, seq + k, group.holder, deliveries=deliveries)
            budget -= k
            self._advance(group, key, lseq, run, k)
            group.base = max(group.base, lseq + k)
        self._save(group)
        return returned, budget

    def _advance(self, group: Group, key: bytes, lseq: int, run: tuple[int, int, int], done: int) -> None:
        """The first ``done`` messages of a run are settled: drop its record, or move its start on."""
        seq, count, deliveries = run
        if group.tail is not None and group.tail[0] == lseq:
            group.tail = None  # (the next lease makes a record of its own rather than extend this one)
        self.lease_table.delete_raw(key)
        if done < count:
            self.lease_table.put((group.gid, lseq + done), (seq + done, count - done, deliveries))
        else:
            group.runs -= 1
            self.runs_total -= 1
