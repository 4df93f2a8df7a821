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

Leased messages are held by the broker exclusively (no other consumer gets them, and another client's
late ack, nack, requeue or dead-letter of one is refused), across restarts too: the lease records are
in the store and ``load()`` registers them again. A group that nobody has called for
``timeout`` seconds is expired: its unacknowledged messages return to their queue with their delivery
count already raised, and a later fetch of that range reports them as ``gone`` instead of returning them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal, overload

from pzq.broker import Broker, Exclusive
from pzq.errors import ProtocolError, StoreFull
from pzq.store import Message
from pzq.store.groups import Groups, LeaseRecords

log = logging.getLogger("pzq.leases")

# Messages one lease call takes at most; a larger ``max`` gets this many (the caller reads a shorter
# range and leases on from its end). Each costs a store write and ~250 B of memory while held: this
# bounds what one request makes the loop do.
MAX_LEASE = 5_000  # messages one lease call may take: ~30 ms of the loop, so that others wait no longer
MAX_FETCH = 10_000  # messages one fetch may return
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
        self.load()

    def load(self) -> None:
        """Read every group and hold its leased messages again: at start-up and after a rollback."""
        self.groups.clear()
        self._next_gid = 1
        for (qid, name), record in self.group_table.items():
            gid, base, end, deadline_us, *rest = record  # (an owner since pzq 0.3)
            self._next_gid = max(self._next_gid, gid + 1)
            info = self.store.queue_by_id(qid)
            if info is None:
                continue
            group = Group(info.name, qid, name, gid, base, end, deadline_us, deadline_us, rest[0] if rest else None)
            self.groups[(group.queue, group.name)] = group
            for _, (seq, _) in self.lease_table.of_group(gid):
                if self.store.get(info.name, seq) is not None:
                    self.broker.hold((qid, seq), group.holder)

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
            taken = self.broker.take(
                queue, target - group.end, group.holder, now=now, now_us=now_us, timeout_s=float("inf")
            )
            for message in taken:
                self.lease_table.put((group.gid, group.end), (message.seq, message.deliveries))
                group.end += 1
            if taken:
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
        once ``max_bytes`` of bodies are read (at least one message is always returned)."""
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
        for lseq in range(max(lo, group.base), hi):
            if out and max_bytes is not None and size >= max_bytes:
                return out, (lseq - lo) - len(out), lseq
            lease = self.lease_table.get((group.gid, lseq))
            if lease is None:  # (gone, or a damaged record: gone too)
                continue
            seq, deliveries = lease
            message = self.store.get(queue, seq)
            if message is not None:  # held by the lease, so only an ack of this group deletes it
                message.deliveries = deliveries
                out.append((lseq, message))
                size += sum(len(f) for f in message.frames)
        return out, (hi - lo) - len(out), hi

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
        for lseq, key in self.lease_table.between(group.gid, group.base, upto):  # (the records there are)
            lease = self.lease_table.get((group.gid, lseq))
            if lease is not None:
                self.broker.ack((group.qid, lease[0]), by=group.holder)
            self.lease_table.delete_raw(key)  # (a damaged record goes too)
        group.base = upto
        self._save(group)
        return group.base

    def drop_queue(self, queue: str) -> None:
        """Forget every group of a queue that is being deleted, with its lease records."""
        for key in [k for k in self.groups if k[0] == queue]:
            group = self.groups.pop(key)
            for record_key in self.lease_table.keys_of_group(group.gid):
                self.lease_table.delete_raw(record_key)
            self.group_table.delete(group.key())

    # -- expiry -------------------------------------------------------------------------------------

    def expire(self, now_us: int) -> int:
        """Return the messages of every group idle past its deadline to their queues; how many."""
        returned = 0
        for group in self.groups.values():
            if group.base == group.end or group.deadline_us > now_us:
                continue
            n = self.broker.consumer_gone(group.holder)
            for _, key in self.lease_table.between(group.gid, group.base, group.end):
                self.lease_table.delete_raw(key)
            log.warning(
                "group %r of queue %r was idle for %.0f s: its %d unacknowledged message(s) "
                "(leases %d..%d) went back to the queue",
                group.name,
                group.queue,
                self.timeout_us / 1e6,
                n,
                group.base,
                group.end - 1,
            )
            group.base = group.end
            self._save(group)
            returned += n
        self.expired_total += returned
        return returned

    def stats(self) -> dict:
        return {
            f"{g.queue}/{g.name}": {"base": g.base, "end": g.end, "held": g.end - g.base} for g in self.groups.values()
        }
