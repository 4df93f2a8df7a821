"""The Broker: the queue rules on top of a Store, with its parts (range holds, settling) mixed in.

Here: producing, handing out, dropping and purging queues, requeueing dead letters, and the figures.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import NamedTuple

from pzq.broker.implicit import ImplicitQueues
from pzq.broker.questions import Questions
from pzq.broker.ranges import RangeHolds
from pzq.broker.settle import Settling
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import StoreFull
from pzq.store import Message, QueueInfo, Store, Upload
from pzq.store.layout import KEY

Taken = tuple[tuple[int, int], int, list[bytes]]  # a message handed out by take_run: (ref, enqueued µs, frames)


class TakenRun(NamedTuple):
    """Messages handed out by ``take_columns``, column by column (no object per message)."""

    refs: list[tuple[int, int]]
    enqueued: list[int]  # µs
    frames: list[list[bytes]]
    sizes: list[int]  # bytes of each body, charged to its payer
    ids: list[bytes]  # each one's message id as 16 bytes (two big-endian u64: qid, seq), its record's key


class Broker(RangeHolds, Settling, ImplicitQueues, Questions):
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
        super().__init__(store, ack_timeout_s=ack_timeout_s, max_deliveries=max_deliveries, limits=limits)
        per_owner = max(1, store.catalog.max_queues // limits.implicit_connection_part)
        self._init_implicit(implicit_ttl_s, per_owner, limits.implicit_sweep_per_turn, limits.share_reserve_part)
        store.on_set_aside.append(self._set_aside)
        # While set (the server's memory alarm: pzq/endpoints/memory.py), every producer is refused with
        # this text ("queue full" in each protocol); consumers and acks go on, so that memory drains.
        self.refusing: str | None = None

    def reset(self) -> None:
        """Forget every delivery, as a restart does (and start the unused queues' clocks again)."""
        super().reset()
        self.reset_implicit()

    # -- producing --------------------------------------------------------------------------------

    def produce(
        self, queue: str, body: Sequence[bytes], *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Store a message (durable at the next commit). Raises StoreFull when there is no room."""
        try:
            if self.refusing is not None:
                raise StoreFull(self.refusing)
            message = self.store.put(queue, body, now_us=now_us, expires_us=expires_us, meta=meta)
        except StoreFull:
            self.counters.refused_full += 1
            raise
        self.counters.produced += 1
        self.readiness += 1
        self._count(queue, "produced")
        return message

    def produce_many(
        self, queue: str, bodies: Sequence[Sequence[bytes]] | Sequence[bytes], *, now_us: int, encoded: bool = False
    ) -> int:
        """Store messages in one go (see Store.put_many; ``encoded``: each message is the msgpack array
        of its frames, as a batch carries it: Store.put_encoded): how many, from the first, were stored;
        the rest were refused for room."""
        store = self.store.put_encoded if encoded else self.store.put_many
        try:
            stored = 0 if self.refusing is not None else store(queue, bodies, now_us=now_us)  # type: ignore[arg-type]
        except StoreFull:
            stored = 0
        self.counters.refused_full += len(bodies) - stored
        if stored:
            self.counters.produced += stored
            self.readiness += 1
            self._count(queue, "produced", stored)
        return stored

    # A big body is written a part per turn (store/bodies.py): begun, written, then produced as a message
    # in the turn of its last part; dropped when its producer is answered otherwise.

    def begin_big(self, body: Sequence[bytes | bytearray | memoryview], chunk: int) -> Upload:
        """A big body to write in parts of ``chunk`` bytes. Raises StoreFull (counted) when refused."""
        try:
            if self.refusing is not None:
                raise StoreFull(self.refusing)
            return self.store.bodies.begin(body, chunk)
        except StoreFull:
            self.counters.refused_full += 1
            raise

    def write_big(self, upload: Upload, most: int) -> int:
        """Write the next parts of ``upload`` (about ``most`` bytes); StoreFull (counted) when the store filled."""
        try:
            return self.store.bodies.write(upload, most)
        except StoreFull:
            self.counters.refused_full += 1
            raise

    def produce_big(
        self, queue: str, upload: Upload, *, now_us: int, expires_us: int = 0, meta: dict | None = None
    ) -> Message:
        """Store the message whose body ``upload`` wrote in full (durable at the next commit)."""
        message = self.store.put_body(queue, upload, now_us=now_us, expires_us=expires_us, meta=meta)
        self.counters.produced += 1
        self.readiness += 1
        self._count(queue, "produced")
        return message

    def drop_big(self, upload: Upload) -> None:
        """Give up a body not yet produced: its parts are removed."""
        self.store.bodies.drop(upload)

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

    def requeue_dead(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> list[Message]:
        """Put dead letters back at the end of ``queue`` (one by ``seq``, or up to ``limit`` of the
        oldest), ready for every consumer (see Store.requeue_dead); returns the new messages."""
        moved = self.store.dead_letters.requeue(queue, seq, limit=limit)
        if moved:
            self.readiness += 1
        return moved

    # -- handing out ------------------------------------------------------------------------------

    def has_ready(self, queue: str) -> bool:
        return self.ready_count(queue) > 0

    def ready_count(self, queue: str) -> int:
        """Stored messages of ``queue`` not in flight (some may turn out expired when taken)."""
        info = self.store.queue(queue, create=False)
        if info is None:
            return 0
        return info.count - self._state(info.qid).inflight

    def take(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: float,
        now_us: int,
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
        info = self.store.queue(queue, create=False)
        if info is None or n <= 0:
            return []
        payer = consumer if payer is None else payer
        room = self.accounts.room(payer, self.inflight)
        if room <= 0:
            return []
        max_bytes = room if max_bytes is None else min(max_bytes, room)
        state = self._state(info.qid)
        deadline = now + (self.ack_timeout_s if timeout_s is None else timeout_s)
        out: list[Message] = []
        size, most = 0, max_bytes
        while len(out) < n and size < most:
            batch = self._next_ready(queue, info.qid, state, n - len(out), max_bytes=most - size)
            if not batch:
                break
            sizes = [sum(map(len, m.frames)) for m in batch]
            size += sum(sizes)
            cut_short = self.cut_short
            # Only a TTL, a message's own cap (in its meta) or --max-deliveries asks to look at each one
            capped = self.max_deliveries
            going = [m for m in batch if not (m.expires_us or m.meta or capped)]
            if len(going) < len(batch):
                going, kept = [], []
                for message, length in zip(batch, sizes, strict=True):
                    cap = (message.meta or {}).get("max_deliveries") or 0
                    reason = self._past_limits(message.expires_us, cap, message.deliveries, now_us)
                    if reason:
                        self._dead_letter(message, reason, now_us)
                    else:
                        going.append(message)
                        kept.append(length)
                sizes = kept
            if going:  # (the run's counts and in-flight entries in one call each)
                again = self.store.mark_delivered_run(queue, going)
                if again:
                    self.counters.redelivered += again
                    self._count(queue, "redelivered", again)
                self.inflight.add_many([(m.qid, m.seq) for m in going], deadline, consumer, sizes, payer)
                state.inflight += len(going)
                out += going
            if cut_short:  # (its bounded share of stale seqs passed: the rest is the next take's)
                break
        if size >= room:  # (stopped by the payer's room: it is told when it has more, see accounts.py)
            self.accounts.filled(payer, self.inflight)
        self.counters.delivered += len(out)
        return out

    def take_run(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: float,
        now_us: int,
        max_bytes: int | None = None,
        payer: Hashable = None,
    ) -> list[Taken]:
        """``take`` as ``(ref, enqueued µs, frames)`` of each message (``take_columns``'s, row by row)."""
        run = self.take_columns(queue, n, consumer, now=now, now_us=now_us, max_bytes=max_bytes, payer=payer)
        return list(zip(run.refs, run.enqueued, run.frames, strict=True))

    def take_columns(
        self,
        queue: str,
        n: int,
        consumer: Hashable,
        *,
        now: float,
        now_us: int,
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
        info = self.store.queue(queue, create=False)
        if info is None or n <= 0:
            return out
        payer = consumer if payer is None else payer
        room = self.accounts.room(payer, self.inflight)
        if room <= 0:
            return out
        max_bytes = room if max_bytes is None else min(max_bytes, room)
        qid = info.qid
        state = self._state(qid)
        most, size = max_bytes, 0
        if not (self.max_deliveries or state.requeued or self._held.get(qid)):
            deadline = now + self.ack_timeout_s
            while len(out.refs) < n and size < most:
                start = state.cursor
                run, state.cursor, stopped = self.store.plain_run(
                    queue, state.cursor, n - len(out.refs), most - size, self.inflight.refs()
                )
                if run.refs:
                    again = self.store.count_deliveries(queue, run)
                    if again:
                        self.counters.redelivered += again
                        self._count(queue, "redelivered", again)
                    sizes = list(map(sum, map(map, itertools.repeat(len), run.frames)))  # (each body's bytes)
                    # (fresh: plain_run passed over what is in flight, and reads each record once)
                    self.inflight.add_many(run.refs, deadline, consumer, sizes, payer, fresh=True)
                    state.inflight += len(run.refs)
                    self.counters.delivered += len(run.refs)
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
            self.accounts.filled(payer, self.inflight)
        if len(out.refs) < n and size < most:
            left = most - size  # (take's first message is always taken: a big body alone, as take would)
            for m in self.take(queue, n - len(out.refs), consumer, now=now, now_us=now_us, max_bytes=left, payer=payer):
                out.refs.append((m.qid, m.seq))
                out.enqueued.append(m.enqueued_us)
                out.frames.append(m.frames)
                out.sizes.append(sum(map(len, m.frames)))
                out.ids.append(KEY.pack(m.qid, m.seq))
        return out

    # -- whole queues -----------------------------------------------------------------------------

    def drop_queue(self, queue: str) -> int:
        """Delete a queue and everything in it, in flight included; returns how many messages it had.
        It is gone for every client at once (its name may make a new, empty queue); its records are
        deleted by ``drop_work``, a share per turn (a restart goes on with them: store/drops.py)."""
        info = self.store.queue(queue, create=False)
        if info is None:
            return 0
        self.inflight.remove_matching(lambda ref: ref[0] == info.qid)
        self._held.pop(info.qid, None)
        for ref in [r for r in self._late if r[0] == info.qid]:
            del self._late[ref]
        self._ready.pop(info.qid, None)
        self.per_queue.pop(queue, None)
        self._forget_owner(queue)
        return self.store.drops.drop(queue)

    @property
    def dropping(self) -> bool:
        """True while deleted queues' records are left to delete (``drop_work``)."""
        return bool(self.store.drops.dropping)

    def dropping_left(self) -> tuple[int, int]:
        """Deleted queues whose records are not all gone yet, and the messages and dead letters left."""
        return self.store.drops.left()

    def drop_work(self, most: int, deadline: float | None = None) -> int:
        """Delete up to ``most`` records of deleted queues, none past ``deadline`` (time.monotonic());
        returns how many went."""
        return self.store.drops.share(most, deadline) if self.store.drops.dropping else 0

    def purge(self, queue: str, lo: int, hi: int, limit: int) -> tuple[int, int]:
        """Delete the ready messages of ``queue`` with seqs ``lo .. hi-1``, at most ``limit`` of the
        stored ones walked (the operator's purge, done a share per turn); what is in flight to a
        consumer or held by a group stays, to be settled by its holder. Returns (deleted, the seq to
        go on from: ``hi`` once done)."""
        info = self.store.queue(queue, create=False)
        if info is None:
            return 0, hi
        held = self._held.get(info.qid)
        seqs = self.store.seqs_in(queue, lo, hi, limit)
        deleted = 0
        for seq in seqs:
            if (info.qid, seq) in self.inflight or (held and held.holder_of(seq) is not None):
                continue
            deleted += self.store.delete(queue, seq)
        return deleted, hi if len(seqs) < limit else seqs[-1] + 1

    # -- figures ----------------------------------------------------------------------------------

    def queue_inflight(self, qid: int) -> int:
        state = self._ready.get(qid)
        return state.inflight if state else 0

    def queue_figures(self, info: QueueInfo) -> dict:
        """One queue's figures as STATS reports them."""
        return {
            "depth": info.count,
            "inflight": self.queue_inflight(info.qid),
            "dead_letters": info.dead_count,
            "bytes": info.bytes,
        }

    def stats(self) -> dict:
        """The figures of the six PZQ monitor lines (totals over all queues) and per queue."""
        return {**self.totals(), "queues": {info.name: self.queue_figures(info) for info in self.store.queues()}}

    def totals(self) -> dict:
        """The figures of the six PZQ monitor lines, in their order (the monitor builds the per-queue
        part of STATS apart, a slice a turn: pzq/admin/figures.py)."""
        return {
            "messages": sum(q.count for q in self.store.queues()),
            "messages_inflight": len(self.inflight) + sum(held.count for held in self._held.values()),
            "db_size": self.store.disk_bytes(),
            "inflight_db_size": self.inflight.approx_bytes(),
            "syncs": self.store.syncs,
            "expired_messages": self.counters.expired,
        }
