"""Dead letters: messages moved aside after too many deliveries, an expired TTL, or a client's request;
listed, requeued at the end of their queue, or deleted for good. Drawn on ``Runs`` (runs.py)."""

from __future__ import annotations

import msgpack

from pzq.store.bodies import CHUNKED_DEAD, BodyRef
from pzq.store.environment import KeyExists
from pzq.store.layout import KEY, DeadLetter, Message, QueueInfo, accounted
from pzq.store.queues import raise_
from pzq.store.runs import Runs


class DeadLetters(Runs):
    """The dead letters of the queues, beside their messages (table ``dead``)."""

    def dead_letter(self, message: Message, reason: str, *, now_us: int) -> bool:
        """Move a stored message to its queue's dead letters. False if it was no longer stored."""
        if not self.delete(message.queue, message.seq, keep_body=True):
            return False
        info = self._queues[message.queue]
        key = KEY.pack(info.qid, message.seq)
        body = message.body
        frames = [] if body is not None else message.frames
        record = [message.enqueued_us, message.expires_us, frames, message.deliveries, reason, now_us]
        if message.meta or body is not None:
            record.append(message.meta or None)
        if body is not None:  # (its chunks stay where they are: the dead letter names them)
            record.append(list(BodyRef(*body).packed()))
        value = msgpack.packb(record)
        if not self.env.do(self.env.write().put, key, value, db=self._dead_db, overwrite=False):
            self.env.do(raise_, KeyExists(f"dead letter {message.id} is already stored"))
        size = accounted(key, value) + (BodyRef(*body).accounted if body is not None else 0)
        self._account(info, dead_count=1, dead_size=size)
        return True

    def _decode_dead(self, info: QueueInfo, key: bytes, value: bytes, txn) -> DeadLetter:
        record = msgpack.unpackb(value)
        enqueued_us, expires_us, frames, deliveries, reason, dead_at_us = record[:6]
        body = BodyRef.read(record[7]) if value[0] == CHUNKED_DEAD else None
        message = Message(
            info.name,
            info.qid,
            KEY.unpack(key)[1],
            frames if body is None else self.body_frames(body, txn),
            enqueued_us,
            expires_us,
            deliveries,
            record[6] if len(record) > 6 else None,
            body,
        )
        return DeadLetter(message, reason, dead_at_us)

    def dead_letters(
        self, queue: str, from_seq: int = 0, limit: int = 100, max_bytes: int | None = None
    ) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of ``queue``, oldest first; with ``max_bytes``, no more once their
        bodies reach it (the first is always read)."""
        return list(self._iter(self._dead_db, queue, from_seq, limit, self._decode_dead, max_bytes))

    def requeue_dead(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> list[Message]:
        """Put dead letters back at the end of their queue with a fresh delivery count.

        One by ``seq``, or up to ``limit`` of the oldest when ``seq`` is None. Returns the new messages.
        """
        info = self._queues.get(queue)
        if info is None:
            return []
        letters = self.dead_letters(queue, seq or 0, 1 if seq is not None else limit)
        if seq is not None:
            letters = [d for d in letters if d.message.seq == seq]
        moved = []
        for letter in letters:
            self._remove_dead(info, letter.message.seq, keep_body=True)
            moved.append(
                self._append(
                    queue,
                    letter.message.frames,
                    letter.message.enqueued_us,
                    letter.message.expires_us,
                    check_limit=False,
                    meta=letter.message.meta,
                    body=letter.message.body,
                )
            )
        return moved

    def delete_dead(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> int:
        """Delete dead letters for good: one by ``seq``, or up to ``limit`` of the oldest when ``seq``
        is None. Returns how many went."""
        info = self._queues.get(queue)
        if info is None:
            return 0
        letters = self.dead_letters(queue, seq or 0, 1 if seq is not None else limit)
        gone = 0
        for letter in letters:
            if seq is not None and letter.message.seq != seq:
                continue
            self._remove_dead(info, letter.message.seq)
            gone += 1
        return gone

    def _remove_dead(self, info: QueueInfo, seq: int, *, keep_body: bool = False) -> None:
        key = KEY.pack(info.qid, seq)
        value = self.env.write().get(key, db=self._dead_db) or b""
        self.env.do(self.env.write().delete, key, db=self._dead_db)
        size = accounted(key, value)
        if (ref := self.ref_of(value, dead=True)) is not None:
            size += ref.accounted if keep_body else self.delete_body(ref)
        self._account(info, dead_count=-1, dead_size=-size)
