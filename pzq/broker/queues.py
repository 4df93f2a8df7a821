"""The broker's part for whole queues: their deletion (a share of records per turn), the operator's
purge, dead letters requeued, and the figures the monitor reports.
"""

from __future__ import annotations

from pzq.broker.state import BrokerState
from pzq.store import Message, QueueInfo


class Queues:
    """The Broker's whole queues and figures."""

    def __init__(self, state: BrokerState):
        self._s, self._store = state, state.store

    def requeue_dead(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> list[Message]:
        """Put dead letters back at the end of ``queue`` (one by ``seq``, or up to ``limit`` of the
        oldest), ready for every consumer (see Store.requeue_dead); returns the new messages."""
        moved = self._store.dead_letters.requeue(queue, seq, limit=limit)
        if moved:
            self._s.readiness += 1
        return moved

    def drop_queue(self, queue: str) -> int:
        """Delete a queue and everything in it, in flight and held included (rule 12; the Broker's
        ``drop_queue`` also tells its implicit queues); returns how many messages it had. It is gone for
        every client at once (its name may make a new, empty queue); its records are deleted by
        ``drop_work``, a share per turn (a restart goes on with them: store/drops.py)."""
        info = self._store.queue(queue, create=False)
        if info is None:
            return 0
        self._s.inflight.remove_matching(lambda ref: ref[0] == info.qid)
        self._s.ranges.pop(info.qid, None)
        for ref in [r for r in self._s.late if r[0] == info.qid]:
            del self._s.late[ref]
        self._s.ready.pop(info.qid, None)
        self._s.per_queue.pop(queue, None)
        return self._store.drops.drop(queue)

    @property
    def dropping(self) -> bool:
        """True while deleted queues' records are left to delete (``drop_work``)."""
        return bool(self._store.drops.dropping)

    def dropping_left(self) -> tuple[int, int]:
        """Deleted queues whose records are not all gone yet, and the messages and dead letters left."""
        return self._store.drops.left()

    def drop_work(self, most: int, deadline: float | None = None) -> int:
        """Delete up to ``most`` records of deleted queues, none past ``deadline`` (time.monotonic());
        returns how many went."""
        return self._store.drops.share(most, deadline) if self._store.drops.dropping else 0

    def purge(self, queue: str, lo: int, hi: int, limit: int) -> tuple[int, int]:
        """Delete the ready messages of ``queue`` with seqs ``lo .. hi-1``, at most ``limit`` of the
        stored ones walked (the operator's purge, done a share per turn); what is in flight to a
        consumer or held by a group stays, to be settled by its holder. Returns (deleted, the seq to
        go on from: ``hi`` once done)."""
        info = self._store.queue(queue, create=False)
        if info is None:
            return 0, hi
        held = self._s.ranges.get(info.qid)
        seqs = self._store.seqs_in(queue, lo, hi, limit)
        deleted = 0
        for seq in seqs:
            if (info.qid, seq) in self._s.inflight or (held and held.holder_of(seq) is not None):
                continue
            deleted += self._store.delete(queue, seq)
        return deleted, hi if len(seqs) < limit else seqs[-1] + 1

    # -- figures ----------------------------------------------------------------------------------

    def queue_inflight(self, qid: int) -> int:
        state = self._s.ready.get(qid)
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
        return {**self.totals(), "queues": {info.name: self.queue_figures(info) for info in self._store.queues()}}

    def totals(self) -> dict:
        """The figures of the six PZQ monitor lines, in their order (the monitor builds the per-queue
        part of STATS apart, a slice a turn: pzq/admin/figures.py)."""
        return {
            "messages": sum(q.count for q in self._store.queues()),
            "messages_inflight": len(self._s.inflight) + sum(held.count for held in self._s.ranges.values()),
            "db_size": self._store.disk_bytes(),
            "inflight_db_size": self._s.inflight.approx_bytes(),
            "syncs": self._store.syncs,
            "expired_messages": self._s.counters.expired,
        }

    def queue_counts(self) -> dict[str, dict[str, int]]:
        """Each queue's counts since start (produced, delivered, acked...), copied: the metrics' figures."""
        return {queue: dict(counts) for queue, counts in self._s.per_queue.items()}
