"""Durable leases by sequence range, per consumer group: what a Spark query reads a queue through.

A stream processor such as Spark plans a batch (its start and end offsets are written to its
checkpoint), runs it, and acknowledges the batch only when it plans the next one, possibly minutes
later, possibly after its driver restarted. So the queue must hand out messages in ranges that can be
read again, identically, until they are acknowledged. A group does that:

- ``lease(after, max)`` takes the next ready messages of the queue and numbers them with the group's
  own consecutive *lease seqs* (a Spark offset is a lease seq). It is idempotent: asking again from
  the same ``after`` returns the leases already made instead of taking more.
- ``fetch(lo, hi)`` returns the messages leased as ``lo .. hi-1``, read-only, as often as asked, with
  the delivery count they had when they were leased.
- ``ack_upto(seq)`` deletes every leased message below ``seq`` for good (idempotent).

Leases are kept by range: a group's record is a *run* of consecutive queue seqs leased as consecutive
lease seqs (store/groups.py), and the broker holds each run as one range, not one in-flight entry per
message. Leased messages are held exclusively (no other consumer gets them, and another client's late
ack, nack, requeue or dead-letter of one is refused), across restarts too: ``load()`` holds the runs
again. ``ack_upto`` moves the group's base durably at once and deletes the runs below it with a cursor,
a few thousand messages per turn (``work``). A group that nobody has called for ``timeout`` seconds is
expired: its unacknowledged messages return to their queue over the next turns, lowest leases first,
with their delivery count raised, and a later fetch of that range reports them as ``gone``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Literal, overload

from pzq.broker import Broker, Exclusive, continues
from pzq.errors import ProtocolError, StoreFull
from pzq.store import Message
from pzq.store.groups import Groups, LeaseRecords
from pzq.store.side_table import UNREADABLE

log = logging.getLogger("pzq.leases")

# What one call may cost the loop: a lease or a fetch stops after CALL_BUDGET_S of work (or MAX_LEASE,
# MAX_FETCH messages) and answers the shorter range; the caller goes on from its end. A lease writes
# one record per run of consecutive seqs and holds one range per run, whatever its size; what costs is
# reading the messages (their TTL and delivery cap are checked), about 2 µs each.
CALL_BUDGET_S = 0.010
LEASE_CHUNK = 1_000  # messages taken (or fetched: FETCH_CHUNK) between two looks at the clock
FETCH_CHUNK = 1_000
MAX_LEASE = 1_000_000  # messages one lease call may take at most
MAX_FETCH = 10_000  # messages one fetch may return
WORK_PER_TURN = 5_000  # acknowledged messages deleted (or expired ones returned) per turn, within CALL_BUDGET_S
# Runs (records, held ranges) of one group and of all groups: a run costs a record and ~100 B, and
# every lookup bisects them. A fresh queue's lease is one run; a queue shared with other consumers
# splits into more. Past either limit a lease answers the shorter range it has (possibly none).
MAX_RUNS_PER_GROUP = 10_000
MAX_RUNS = 100_000
MAX_GROUPS = 100_000  # consumer groups of every queue together (each is a record and a timer)


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


class Leases:
    """Every group's leases, kept in the store and mirrored in the broker's in-flight table."""

    def __init__(self, broker: Broker, *, timeout_s: float):
        self.broker = broker
        self.store = broker.store
        self.group_table = Groups(broker.store)
        self.lease_table = LeaseRecords(broker.store)
        self.timeout_us = int(timeout_s * 1e6)
        self.groups: dict[tuple[str, str], Group] = {}
        self.expired_total = 0
        self._spent = 0  # of this turn's WORK_PER_TURN, by ACK_UPTO calls
        self.runs_total = 0
        self._acking: set[tuple[str, str]] = set()  # groups with acknowledged runs still stored
        self._expiring: set[tuple[str, str]] = set()  # expired groups whose runs are going back
        self.load()

    def load(self) -> None:
        """Read every group and hold its leased runs again: at start-up and after a rollback. Runs
        below a group's base were acknowledged and are deleted over the next turns. A damaged record
        (a second group with one gid, a run past its queue's end or over another run) is removed and
        logged: it must never make a group fetch, acknowledge or return what it does not hold."""
        self.groups.clear()
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

    def _damaged(self, what: str) -> None:
        self.store.unreadable_records += 1
        log.error("damaged consumer group record: %s", what)

    @overload
    def _group(self, queue: str, name: str, create: Literal[True], user: str | None) -> Group: ...
    @overload
    def _group(self, queue: str, name: str, create: bool, user: str | None) -> Group | None: ...

    def _group(self, queue: str, name: str, create: bool, user: str | None) -> Group | None:
        """The group, if ``user`` (the caller's CURVE key, None without CURVE) may use it: a group
        belongs to the key that made it (or first used it with a key), so that another client cannot
        read or acknowledge its leases."""
        group = self.groups.get((queue, name))
        if group is None and create:
            if len(self.groups) >= MAX_GROUPS:
                raise ProtocolError(
                    "too-many-groups",
                    f"{MAX_GROUPS} consumer groups exist; no new one until some expire (--api-group-timeout)",
                )
            info = self.store.queue(queue)
            group = Group(queue, info.qid, name, self._next_gid, owner=user)
            self._save(group)  # first: it may be refused (StoreFull), and then nothing is changed
            self._next_gid += 1
            self.groups[(queue, name)] = group
        elif group is not None and group.owner != user:
            if group.owner is not None:
                raise ProtocolError("not-owner", f"group {name!r} of {queue!r} belongs to another client key")
            if user is not None:  # made before CURVE was on: the first key to use it takes it
                group.owner = user
                self._save(group)
        return group

    def _save(self, group: Group) -> None:
        record: list[int | str] = [group.gid, group.base, group.end, group.deadline_us]
        if group.owner is not None:
            record.append(group.owner)
        self.group_table.put(group.key(), record)
        group.saved_deadline_us = group.deadline_us

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
        self, queue: str, name: str, after: int, max_n: int, *, now: float, now_us: int, user: str | None = None
    ) -> tuple[int, int]:
        """Make sure leases ``after .. after+max_n-1`` exist as far as messages are ready; returns
        (base, end) where ``end`` (at most ``after + max_n``) is the end of the range to read."""
        if max_n < 0:
            raise ProtocolError("bad-max", f"max must be 0 or more, not {max_n}")
        max_n = min(max_n, MAX_LEASE)
        if self.store.low_disk:  # refused before any message is taken: its records could not be written
            raise StoreFull(f"queue full: the disk of {self.store.path} is nearly full; no new leases")
        group = self._group(queue, name, True, user)
        if after > group.end:
            raise ProtocolError(
                "bad-offset", f"group {name!r} of {queue!r} never leased up to {after} (its leases end at {group.end})"
            )
        self._touch(group, now_us)
        # Below base is acknowledged or expired: a reader that starts there simply reads on from base.
        target = max(after, group.base) + max_n
        if group.end < target:
            runs: list[list[int]] = []
            wanted = target - group.end
            deadline = time.perf_counter() + CALL_BUDGET_S
            room = min(MAX_RUNS_PER_GROUP - group.runs, MAX_RUNS - self.runs_total)
            tail = group.tail if group.tail is not None and group.tail[0] + group.tail[2] == group.end else None
            while wanted > 0:
                chunk = self.broker.take_ranges(queue, min(wanted, LEASE_CHUNK), group.holder, now_us=now_us)
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
        once ``max_bytes`` of bodies are read or CALL_BUDGET_S is spent (at least one message is
        always returned)."""
        group = self._group(queue, name, False, user)
        end = 0 if group is None else group.end
        if not 0 <= lo <= hi <= end:
            raise ProtocolError(
                "bad-range", f"range {lo}..{hi} is not within the leases of group {name!r} of {queue!r} (0..{end})"
            )
        if hi - lo > MAX_FETCH:
            raise ProtocolError("bad-range", f"fetch at most {MAX_FETCH} messages at a time, not {hi - lo}")
        out: list[tuple[int, Message]] = []
        if group is None:
            return out, 0, hi
        self._touch(group, now_us)
        size = 0
        deadline = time.perf_counter() + CALL_BUDGET_S
        for first, (seq, count, deliveries) in self.lease_table.covering(group.gid, max(lo, group.base), hi):
            a, b = max(lo, group.base, first), min(hi, first + count)
            if a >= b or self.broker.holder_of((group.qid, seq + (a - first))) != group.holder:
                continue  # (nothing here, or a damaged record over what the group does not hold: gone)
            # The run's messages are consecutive records: read them in one cursor walk.
            for at in range(a, b, FETCH_CHUNK):
                if out and time.perf_counter() > deadline:
                    return out, (at - lo) - len(out), at
                more = self._fetch_run(
                    queue, first, seq, deliveries, at, min(b, at + FETCH_CHUNK), out, size, max_bytes
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
        for message in self.store.scan(queue, seq + (a - first), b - a):
            lseq = first + (message.seq - seq)
            if lseq >= b:  # (a message of the run is gone: the walk went past it)
                break
            if out and max_bytes is not None and size >= max_bytes:
                return None
            message.deliveries = deliveries
            out.append((lseq, message))
            size += sum(len(f) for f in message.frames)
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
        # and the turn's own share is smaller by this one (see work).
        left = self._ack_some(group, WORK_PER_TURN - self._spent, time.perf_counter() + CALL_BUDGET_S)
        self._spent = WORK_PER_TURN - left
        return group.base

    def drop_queue(self, queue: str) -> None:
        """Forget every group of a queue that is being deleted, with its lease records."""
        for key in [k for k in self.groups if k[0] == queue]:
            group = self.groups.pop(key)
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

    def expire(self, now_us: int) -> int:
        """``mark_expired`` and one turn's ``work``: how many messages went back in this call."""
        self.mark_expired(now_us)
        return self.work(now_us)

    def work(self, now_us: int, budget: int | None = None) -> int:
        """One turn's share: delete acknowledged messages and return expired groups' messages to their
        queues, at most ``budget`` (WORK_PER_TURN, less what an ACK_UPTO of this turn did) and
        CALL_BUDGET_S of work; returns how many went back. A group of a million leases never holds
        the loop."""
        budget = (WORK_PER_TURN - self._spent) if budget is None else budget
        self._spent = 0
        deadline = time.perf_counter() + CALL_BUDGET_S
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

    def stats(self) -> dict:
        return {
            f"{g.queue}/{g.name}": {"base": g.base, "end": g.end, "held": g.end - g.base} for g in self.groups.values()
        }
