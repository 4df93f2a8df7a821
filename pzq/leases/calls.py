"""The three calls of a consumer group (lease, fetch, acknowledge) and its ownership; see pzq.leases."""

from __future__ import annotations

import collections
import logging
import time
from typing import Literal, overload

from pzq.broker import Broker, continues
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, ClientShares, Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.leases.returns import UNBOUNDED_RECORDS, Group, LeaseReturns, TurnRecords
from pzq.store import Message
from pzq.store.groups import Groups, LeaseRecords
from pzq.store.side_table import UNREADABLE

log = logging.getLogger("pzq.leases")


class Leases(LeaseReturns):
    """Every group's leases, kept in the store and mirrored in the broker's in-flight table."""

    def __init__(self, broker: Broker, *, timeout_s: float, limits: Limits = DEFAULT_LIMITS):
        self.broker = broker
        self.limits = limits
        self.store = broker.store
        self.group_table = Groups(broker.store)
        self.lease_table = LeaseRecords(broker.store)
        self.timeout_us = int(timeout_s * 1e6)
        self.groups: dict[tuple[str, str], Group] = {}
        self.group_queues: collections.Counter[str] = collections.Counter()  # queue -> its groups
        self.expired_total = 0
        self._spent = 0  # of this turn's share (limits.lease_work_per_turn), by ACK_UPTO calls
        self.runs_total = 0
        self._acking: set[tuple[str, str]] = set()  # groups with acknowledged runs still stored
        self._expiring: set[tuple[str, str]] = set()  # expired groups whose runs are going back
        self.group_shares = ClientShares(limits.max_groups, limits)
        self._group_maker: dict[tuple[str, str], object] = {}
        # Records the server's turn has left (its TurnBudget's), asked by ACK_UPTO; unbounded outside a turn
        self.turn_records: TurnRecords = UNBOUNDED_RECORDS
        self.load()
        broker.add_queue_user(self)

    def uses_queue(self, queue: str) -> bool:
        """A queue with a consumer group is in use (its offsets name its seqs): it never expires."""
        return self.group_queues.get(queue, 0) > 0

    def queue_expired(self, queue: str) -> None:
        pass  # (a queue with a group never expires: nothing is kept for one without)

    def load(self) -> None:
        """Read every group and hold its leased runs again: at start-up and after a rollback. Runs
        below a group's base were acknowledged and are deleted over the next turns. A damaged record
        (a second group with one gid, a run past its queue's end or over another run) is removed and
        logged: it must never make a group fetch, acknowledge or return what it does not hold."""
        self.groups.clear()
        self.group_queues.clear()
        self._acking.clear()
        self._expiring.clear()
        self.runs_total = 0
        self._next_gid = 1
        gids: set[int] = set()
        by_queue: dict[int, list[tuple[int, int, Group, bytes]]] = {}
        for (qid, name), record in self.group_table.items():
            gid, base, end, deadline_us, *rest = record  # (an owner since pzq 0.3)
            self._next_gid = max(self._next_gid, gid + 1)
            info = self.store.queue_by_id(qid)
            if info is None:
                continue
            if gid in gids:
                self._damaged(f"group {name!r} of queue {info.name!r} has the gid {gid} of another group: ignored")
                continue
            gids.add(gid)
            group = Group(info.name, qid, name, gid, base, end, deadline_us, deadline_us, rest[0] if rest else None)
            self.groups[(group.queue, group.name)] = group
            self.group_queues[group.queue] += 1
            for key, value in self.lease_table.raw(self.lease_table.key((gid, 0))[:8]):
                try:
                    (_, lseq), (seq, count, _) = self.lease_table.unpack(key, value)
                except UNREADABLE:
                    continue  # (its leases read as gone; _ack_some or _return_some deletes it)
                if seq + count > info.next_seq:
                    self._damaged(
                        f"a lease record of group {name!r} claims seqs {seq}..{seq + count - 1} of "
                        f"{info.name!r}, past its end: removed"
                    )
                    self.lease_table.delete_raw(key)
                    continue
                by_queue.setdefault(qid, []).append((seq, seq + count, group, key))
                group.runs += 1
                if lseq < base:
                    self._acking.add((group.queue, group.name))
        for qid, runs in by_queue.items():  # in seq order: every range goes at the end of its list
            runs.sort(key=lambda run: run[0])
            info = self.store.queue_by_id(qid)
            reached = 0
            for lo, hi, group, key in runs:
                if lo < reached and info is not None:
                    self._damaged(
                        f"a lease record of group {group.name!r} claims seqs {lo}..{hi - 1} of "
                        f"{info.name!r}, which another lease holds: removed"
                    )
                    self.lease_table.delete_raw(key)
                    group.runs -= 1
                    continue
                reached = hi
                stored = 0 if info is None else self.store.count_in(info.name, lo, hi)
                self.broker.hold_range(qid, lo, hi, group.holder, stored)
        self.runs_total = sum(group.runs for group in self.groups.values())
        for gone in [k for k in self._group_maker if k not in self.groups]:  # (made in a rolled-back turn)
            self._release_group(gone)

    def _damaged(self, what: str) -> None:
        self.store.unreadable_records += 1
        log.error("damaged consumer group record: %s", what)

    @overload
    def _group(
        self, queue: str, name: str, create: Literal[True], user: str | None, client: object = None
    ) -> Group: ...
    @overload
    def _group(self, queue: str, name: str, create: bool, user: str | None, client: object = None) -> Group | None: ...

    def _group(self, queue: str, name: str, create: bool, user: str | None, client: object = None) -> Group | None:
        """The group, if ``user`` (the caller's CURVE key, None without CURVE) may use it: a group
        belongs to the key that made it (or first used it with a key), so that another client cannot
        read or acknowledge its leases. A new one counts against the share of its maker (``user``,
        else ``client``: the connection, when the caller can tell one)."""
        group = self.groups.get((queue, name))
        if group is None and create:
            if len(self.groups) >= self.limits.max_groups:
                raise ProtocolError(
                    "too-many-groups",
                    f"{self.limits.max_groups} consumer groups exist; no new one until some expire (--lease-timeout)",
                )
            maker = user if user is not None else client
            reason = None if maker is None else self.group_shares.refusal(maker, len(self.groups))
            if reason is not None:
                raise ProtocolError("too-many-groups", f"no more consumer groups for this client: {reason}")
            info = self.broker.create_queue(queue, owner=None if user is None else ("key", user))
            group = Group(queue, info.qid, name, self._next_gid, owner=user)
            self._save(group)  # first: it may be refused (StoreFull), and then nothing is changed
            self._next_gid += 1
            self.groups[(queue, name)] = group
            self.group_queues[queue] += 1
            if maker is not None:
                self._group_maker[(queue, name)] = maker
                self.group_shares.add(maker)
        elif group is not None and group.owner != user:
            if group.owner is not None:
                raise ProtocolError("not-owner", f"group {name!r} of {queue!r} belongs to another client key")
            if user is not None:  # made before CURVE was on: the first key to use it takes it
                group.owner = user
                self._save(group)
        return group

    def _touch(self, group: Group, now_us: int) -> None:
        """Push the group's expiry back. Written at most every tenth of the timeout, so an idle query
        polling many times a second costs no commits; after a restart it may expire that much early."""
        group.deadline_us = now_us + self.timeout_us
        if group.deadline_us - group.saved_deadline_us > self.timeout_us // 10:
            self._save(group)

    # -- the three calls ---------------------------------------------------------------------------

    def offsets(self, queue: str, name: str, user: str | None = None) -> tuple[int, int]:
        """(base, end) of a group: base is where a new reader of the group starts."""
        group = self._group(queue, name, False, user)
        return (0, 0) if group is None else (group.base, group.end)

    def lease(
        self,
        queue: str,
        name: str,
        after: int,
        max_n: int,
        *,
        now: Now,
        user: str | None = None,
        client: object = None,
    ) -> tuple[int, int]:
        """Make sure leases ``after .. after+max_n-1`` exist as far as messages are ready; returns
        (base, end) where ``end`` (at most ``after + max_n``) is the end of the range to read. A group
        made by it counts against ``user``'s share, else ``client``'s (the caller's connection)."""
        if max_n < 0:
            raise ProtocolError("bad-max", f"max must be 0 or more, not {max_n}")
        max_n = min(max_n, self.limits.max_lease)
        if self.store.low_disk:  # refused before any message is taken: its records could not be written
            raise StoreFull(f"queue full: the disk of {self.store.path} is nearly full; no new leases")
        group = self._group(queue, name, True, user, client)
        if after > group.end:
            raise ProtocolError(
                "bad-offset", f"group {name!r} of {queue!r} never leased up to {after} (its leases end at {group.end})"
            )
        self._touch(group, now.wall_us)
        # Below base is acknowledged or expired: a reader that starts there simply reads on from base.
        target = max(after, group.base) + max_n
        if group.end < target:
            runs: list[list[int]] = []
            wanted = target - group.end
            deadline = self.turn_records.deadline(self.limits.lease_call_budget_s)
            room = min(self.limits.max_runs_per_group - group.runs, self.limits.max_runs - self.runs_total)
            tail = group.tail if group.tail is not None and group.tail[0] + group.tail[2] == group.end else None
            while wanted > 0:
                chunk = self.broker.take_ranges(
                    queue, min(wanted, self.limits.lease_chunk), group.holder, now_us=now.wall_us
                )
                if not chunk:
                    break
                for seq, count, deliveries in chunk:
                    if runs and continues(runs[-1], seq, deliveries):
                        runs[-1][1] += count  # (a run that goes on across chunks stays one record)
                    elif len(runs) < room or (
                        not runs and tail is not None and continues(tail[1:], seq, deliveries)
                    ):  # (a run that goes on from the group's last record adds no record: always room)
                        runs.append([seq, count, deliveries])
                    else:  # past the runs a group may hold: back to the queue, never handed out
                        self.broker.release_range(group.qid, seq, seq + count, group.holder)
                        wanted = 0
                        continue
                    wanted -= count
                if time.perf_counter() >= deadline:  # a shorter range: the caller goes on from its end
                    break
            if runs and tail is not None:
                first, seq, count, deliveries = tail  # the group's last run: does the first new one go on from it?
                if continues(tail[1:], runs[0][0], runs[0][2]):
                    runs[0] = [seq, count + runs[0][1], deliveries]
                    group.end = first
            for seq, count, deliveries in runs:  # one record per run of consecutive seqs
                if group.end != (group.tail[0] if group.tail else -1):
                    group.runs += 1
                    self.runs_total += 1
                self.lease_table.put((group.gid, group.end), (seq, count, deliveries))
                group.tail = (group.end, seq, count, deliveries)
                group.end += count
            if runs:
                self._save(group)
        return group.base, min(group.end, target)

    def fetch(
        self,
        queue: str,
        name: str,
        lo: int,
        hi: int,
        *,
        now_us: int,
        max_bytes: int | None = None,
        user: str | None = None,
    ) -> tuple[list[tuple[int, Message]], int, int]:
        """The messages leased as ``lo .. hi-1`` with their lease seqs, how many of that range are gone
        (acknowledged, or expired back to the queue), and where the answer ends: ``hi``, or earlier
        once ``max_bytes`` of bodies are read or self.limits.lease_call_budget_s is spent (at least one message is
        always returned)."""
        group = self._group(queue, name, False, user)
        end = 0 if group is None else group.end
        if not 0 <= lo <= hi <= end:
            raise ProtocolError(
                "bad-range", f"range {lo}..{hi} is not within the leases of group {name!r} of {queue!r} (0..{end})"
            )
        if hi - lo > self.limits.max_fetch:
            raise ProtocolError("bad-range", f"fetch at most {self.limits.max_fetch} messages at a time, not {hi - lo}")
        out: list[tuple[int, Message]] = []
        if group is None:
            return out, 0, hi
        self._touch(group, now_us)
        size = 0
        deadline = self.turn_records.deadline(self.limits.lease_call_budget_s)
        for first, (seq, count, deliveries) in self.lease_table.covering(group.gid, max(lo, group.base), hi):
            a, b = max(lo, group.base, first), min(hi, first + count)
            if a >= b or self.broker.holder_of((group.qid, seq + (a - first))) != group.holder:
                continue  # (nothing here, or a damaged record over what the group does not hold: gone)
            # The run's messages are consecutive records: read them in one cursor walk.
            for at in range(a, b, self.limits.fetch_chunk):
                if out and time.perf_counter() > deadline:
                    return out, (at - lo) - len(out), at
                more = self._fetch_run(
                    queue, first, seq, deliveries, at, min(b, at + self.limits.fetch_chunk), out, size, max_bytes
                )
                if more is None:
                    return out, ((out[-1][0] + 1) - lo) - len(out), out[-1][0] + 1
                size = more
        return out, (hi - lo) - len(out), hi

    def _fetch_run(
        self,
        queue: str,
        first: int,
        seq: int,
        deliveries: int,
        a: int,
        b: int,
        out: list[tuple[int, Message]],
        size: int,
        max_bytes: int | None,
    ) -> int | None:
        """Append leases ``a .. b-1`` of the run that starts at lease ``first`` (message ``seq``);
        returns the bytes read so far, or None once ``max_bytes`` is reached."""
        for message in self.store.scan(queue, seq + (a - first), b - a, counts=False):  # (the run has its count)
            lseq = first + (message.seq - seq)
            if lseq >= b:  # (a message of the run is gone: the walk went past it)
                break
            if out and max_bytes is not None and size >= max_bytes:
                return None
            message.deliveries = deliveries
            out.append((lseq, message))
            size += sum(map(len, message.frames))
        return size

    def ack_upto(self, queue: str, name: str, upto: int, *, now_us: int, user: str | None = None) -> int:
        """Delete every message leased below ``upto``; returns the group's new base."""
        group = self._group(queue, name, False, user)
        end = 0 if group is None else group.end
        if not 0 <= upto <= end:
            raise ProtocolError(
                "bad-offset", f"cannot acknowledge up to {upto}: group {name!r} of {queue!r} leased up to {end}"
            )
        if group is None or upto <= group.base:
            return upto if group is None else group.base
        self._touch(group, now_us)
        group.base = upto
        self._save(group)  # durable with this turn: below base is acknowledged, deleted or not yet
        self._acking.add((group.queue, group.name))
        # A first share now, so that the queue's depth follows at once; the rest over the next turns,
        # and the turn's own share is smaller by this one (see work). The share is also within the records
        # the turn has left (``turn_records``: set by the server loop each turn), so the commit stays small.
        share = min(self.share_left(), max(0, self.turn_records()))
        left = self._ack_some(group, share, time.perf_counter() + self.limits.lease_call_budget_s)
        self._spent += share - left
        self.turn_records.took(share - left)
        return group.base

    def stats(self) -> dict:
        return {
            f"{g.queue}/{g.name}": {"base": g.base, "end": g.end, "held": g.end - g.base} for g in self.groups.values()
        }
