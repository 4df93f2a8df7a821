"""The broker's part that hands ready messages out, oldest first, as runs: ``take`` (messages),
``take_columns`` (columns, the batch path, every step over a plain run in C) and ``take_run`` (rows).

Each run is counted as delivered (rule 4 in state.py), tracked in flight until its deadline, its bodies
charged to a payer and cut at the payer's room (rule 8); a message past its TTL or its delivery cap goes
to the dead letters instead (rule 5).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import NamedTuple

from pzq.broker.state import BrokerState
from pzq.clock import Now
from pzq.store import Message
from pzq.store.layout import KEY

Taken = tuple[tuple[int, int], int, list[bytes]]  # a message handed out by take_run: (ref, enqueued µs, frames)


class TakenRun(NamedTuple):
    """Messages handed out by ``take_columns``, column by column (no object per message)."""

    refs: list[tuple[int, int]]
    enqueued: list[int]  # µs
    frames: list[list[bytes]]
    sizes: list[int]  # bytes of each body, charged to its payer
    ids: list[bytes]  # each one's message id as 16 bytes (two big-endian u64: qid, seq), its record's key


class Handing:
    """The Broker's handing out of ready messages (rules 1, 2, 4, 5, 8)."""

    def __init__(self, state: BrokerState):
        self._s, self._store, self._counters, self._accounts = state, state.store, state.counters, state.accounts
        self._count, self._ready_of = state.count, state.ready_of

    def has_ready(self, queue: str) -> bool:
        return self.ready_count(queue) > 0

    def ready_count(self, queue: str) -> int:
        """Stored messages of ``queue`` not in flight (some may turn out expired when taken)."""
        info = self._store.queue(queue, create=False)
        if info is None:
            return 0
        return info.count - self._ready_of(info.qid).inflight

    def take(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: Now,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
        payer: Hashable = None,
    ) -> list[Message]:
        """Hand up to ``n`` ready messages of ``queue`` to ``consumer``, oldest first: a run, in one call.

        Each is counted as delivered (durably, with the next commit) and tracked in flight until
        ``now + timeout_s``. Messages past their TTL or their delivery cap go to the dead letters.
        Their bodies are charged to ``payer`` (``consumer`` if None; pzq/broker/accounts.py), and the
        run stops at what its share has room for; with ``max_bytes`` too, it stops once their bodies
        reach it (the first is always taken, so a payer with room for anything gets one message).
        """
        info = self._store.queue(queue, create=False)
        if info is None or n <= 0:
            return []
        payer = consumer if payer is None else payer
        room = self._accounts.room(payer, self._s.inflight)
        if room <= 0:
            return []
        max_bytes = room if max_bytes is None else min(max_bytes, room)
        state = self._ready_of(info.qid)
        deadline = now.mono + (self._s.ack_timeout_s if timeout_s is None else timeout_s)
        out: list[Message] = []
        size, most = 0, max_bytes
        while len(out) < n and size < most:
            batch = self._s.next_ready(queue, info.qid, state, n - len(out), max_bytes=most - size)
            if not batch:
                break
            sizes = [sum(map(len, m.frames)) for m in batch]
            size += sum(sizes)
            cut_short = self._s.cut_short
            # Only a TTL, a message's own cap (in its meta) or --max-deliveries asks to look at each one
            capped = self._s.max_deliveries
            going = [m for m in batch if not (m.expires_us or m.meta or capped)]
            if len(going) < len(batch):
                going, kept = [], []
                for message, length in zip(batch, sizes, strict=True):
                    cap = (message.meta or {}).get("max_deliveries") or 0
                    reason = self._s.past_limits(message.expires_us, cap, message.deliveries, now.wall_us)
                    if reason:
                        self._s.to_dead_letters(message, reason, now.wall_us)
                    else:
                        going.append(message)
                        kept.append(length)
                sizes = kept
            if going:  # (the run's counts and in-flight entries in one call each)
                again = self._store.mark_delivered_run(queue, going)
                if again:
                    self._counters.redelivered += again
                    self._count(queue, "redelivered", again)
                self._s.inflight.add_many([(m.qid, m.seq) for m in going], deadline, consumer, sizes, payer)
                state.inflight += len(going)
                out += going
            if cut_short:  # (its bounded share of stale seqs passed: the rest is the next take's)
                break
        if size >= room:  # (stopped by the payer's room: it is told when it has more, see accounts.py)
            self._accounts.filled(payer, self._s.inflight)
        self._counters.delivered += len(out)
        return out

    def take_run(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: Now,
        max_bytes: int | None = None,
        payer: Hashable = None,
    ) -> list[Taken]:
        """``take`` as ``(ref, enqueued µs, frames)`` of each message (``take_columns``'s, row by row)."""
        run = self.take_columns(queue, n, consumer, now=now, max_bytes=max_bytes, payer=payer)
        return list(zip(run.refs, run.enqueued, run.frames, strict=True))

    def take_columns(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: Now,
        max_bytes: int | None = None,
        payer: Hashable = None,
    ) -> TakenRun:
        """``take`` as columns (refs, enqueue times, frames, body sizes): the batch path. Where nothing asks
        to look at each message (no --max-deliveries, none came back, no lease ranges, and as long as the
        records have no TTL and no meta) the stored records are handed on as read, their counts and
        in-flight entries set in one call each, every step over the run in C; from the first that needs
        a look on, ``take`` goes on. The same effects, in the same order, as ``take`` (its bytes charged
        to ``payer`` the same way)."""
        out = TakenRun([], [], [], [], [])
        info = self._store.queue(queue, create=False)
        if info is None or n <= 0:
            return out
        payer = consumer if payer is None else payer
        room = self._accounts.room(payer, self._s.inflight)
        if room <= 0:
            return out
        max_bytes = room if max_bytes is None else min(max_bytes, room)
        qid = info.qid
        state = self._ready_of(qid)
        most, size = max_bytes, 0
        if not (self._s.max_deliveries or state.requeued or self._s.ranges.get(qid)):
            deadline = now.mono + self._s.ack_timeout_s
            while len(out.refs) < n and size < most:
                start = state.cursor
                run, state.cursor, stopped = self._store.plain_run(
                    queue, state.cursor, n - len(out.refs), most - size, self._s.inflight.refs()
                )
                if run.refs:
                    again = self._store.count_deliveries(queue, run)
                    if again:
                        self._counters.redelivered += again
                        self._count(queue, "redelivered", again)
                    sizes = list(map(sum, map(map, itertools.repeat(len), run.frames)))  # (each body's bytes)
                    # (fresh: plain_run passed over what is in flight, and reads each record once)
                    self._s.inflight.add_many(run.refs, deadline, consumer, sizes, payer, fresh=True)
                    state.inflight += len(run.refs)
                    self._counters.delivered += len(run.refs)
                    size += sum(sizes)
                    out.refs.extend(run.refs)
                    out.enqueued.extend(run.enqueued)
                    out.frames.extend(run.frames)
                    out.sizes.extend(sizes)
                    out.ids.extend(run.keys)
                if stopped:
                    break
                if not run.refs and state.cursor == start:
                    return out  # (the end of the queue: none ready)
        if size >= room:
            self._accounts.filled(payer, self._s.inflight)
        if len(out.refs) < n and size < most:
            left = most - size  # (take's first message is always taken: a big body alone, as take would)
            for m in self.take(queue, n - len(out.refs), consumer, now=now, max_bytes=left, payer=payer):
                out.refs.append((m.qid, m.seq))
                out.enqueued.append(m.enqueued_us)
                out.frames.append(m.frames)
                out.sizes.append(sum(map(len, m.frames)))
                out.ids.append(KEY.pack(m.qid, m.seq))
        return out
