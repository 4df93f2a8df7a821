"""Runs of messages in one call: a batch's records, the delivery counts of a take's run and the deletes
of an ack run.

A producer's batch (PZQ-BATCH/1) carries each message as the msgpack array of its frames, which is what
a record holds after its ``[enqueued_us, 0,`` header: ``put_encoded`` stores them behind one header
built once, with no per-message encoding and one cursor call.

The per-message calls (``mark_delivered``, ``delete``) cost a clock read, a key, a transaction lookup
and an accounting update each; a native consumer's turn takes and acks hundreds, so these do the same
work once per run (issue 27: "pop and delete a run of refs in one loop"). Same effects, same order.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import msgpack

from pzq.store.environment import KeyExists, LmdbError
from pzq.store.layout import KEY, OVERHEAD, Message, accounted
from pzq.store.messages import CHUNKED, Messages
from pzq.store.queues import raise_


class Runs(Messages):
    """Batches' records, delivery counts and deletes of runs of messages (see the module's text)."""

    def put_encoded(self, queue: str, messages: Sequence[bytes], *, now_us: int) -> int:
        """``put_many`` of messages each given as the msgpack array of its frames (checked by the
        caller: pzq.protocols.native_batch.split_bodies): how many, from the first, were stored (the
        others did not fit). Raises StoreFull, storing nothing, when the queue cannot be made."""
        if not messages or self.low_disk:
            return 0
        info = self._queues.get(queue) or self.queue(queue, implicit=True)
        room = self.max_size - self._total_bytes - self._side()
        head = b"\x93" + msgpack.packb(now_us) + b"\x00"  # ([now_us, 0, frames]: a native record)
        values = [head + message for message in messages]
        fixed = KEY.size + OVERHEAD
        total = sum(map(len, values)) + fixed * len(values)
        if total > room:  # (the prefix that fits: a full queue never leaves a gap)
            total, fits = 0, 0
            for value in values:
                if total + len(value) + fixed > room:
                    break
                total, fits = total + len(value) + fixed, fits + 1
            del values[fits:]
            if not values:
                return 0
        first = info.next_seq
        keys = map(KEY.pack, itertools.repeat(info.qid), range(first, first + len(values)))
        items = list(zip(keys, values, strict=True))
        cursor = self.env.write().cursor(db=self._messages_db)
        try:
            _, added = cursor.putmulti(items, overwrite=False)
        except LmdbError as exc:
            self.env.do(raise_, exc)
        if added != len(items):  # another writer used these seqs: storing over them would lose messages
            self.env.do(raise_, KeyExists(f"messages of queue {queue!r} from seq {first} are already stored"))
        info.next_seq = first + len(items)
        self._account(info, len(items), total)
        return len(items)

    def mark_delivered_run(self, queue: str, messages: Sequence[Message]) -> int:
        """``mark_delivered`` each of ``messages`` (as read by ``scan``/``get``: their ``deliveries`` is the
        count read with them) and set each one's ``deliveries`` to its new count; returns how many of
        them had been delivered before (redeliveries)."""
        qid, pack, now = self._queues[queue].qid, KEY.pack, time.monotonic()
        items = []
        again = 0
        for message in messages:
            count = message.deliveries + 1
            again += count > 1
            message.deliveries = count
            items.append((pack(qid, message.seq), (count, now)))
        self._pending_counts.set_many(items)
        return again

    def delete_many(self, queue: str, seqs: Sequence[int]) -> list[bool]:
        """``delete`` each of ``seqs`` of ``queue`` in order, in one loop and one accounting update;
        whether each was stored (False: already gone, or a repeat)."""
        info = self._queues.get(queue)
        if info is None:
            return [False] * len(seqs)
        txn = self.env.write()
        pack, qid, pending = KEY.pack, info.qid, self._pending_counts
        messages_db, deliveries_db = self._messages_db, self._deliveries_db
        out: list[bool] = []
        count = size = 0
        try:  # inline rather than through env.do(): every ack comes here
            for seq in seqs:
                key = pack(qid, seq)
                value = txn.pop(key, db=messages_db)
                if value is None:
                    out.append(False)
                    continue
                txn.delete(key, db=deliveries_db)  # a lookup only, when it was never written
                if key in pending:
                    pending.pop(key, None)
                size += accounted(key, value)
                if value[:1] == CHUNKED and (ref := self.ref_of(value)) is not None:
                    size += self.delete_body(ref)
                count += 1
                out.append(True)
        except LmdbError as exc:
            self.env.do(raise_, exc)  # (rolls the turn back and raises StoreError)
            raise
        finally:
            if count:  # (what was deleted before a failure is accounted: the rollback undoes both)
                self._account(info, -count, -size)
        return out
