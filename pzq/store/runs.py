"""Runs of messages in one call: the delivery counts of a take's run and the deletes of an ack run.

The per-message calls (``mark_delivered``, ``delete``) cost a clock read, a key, a transaction lookup
and an accounting update each; a native consumer's turn takes and acks hundreds, so these do the same
work once per run (issue 27: "pop and delete a run of refs in one loop"). Same effects, same order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pzq.store.environment import LmdbError
from pzq.store.layout import KEY, Message, accounted
from pzq.store.messages import CHUNKED, Messages
from pzq.store.queues import raise_


class Runs(Messages):
    """Delivery counts and deletes of runs of messages (see the module's text)."""

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
