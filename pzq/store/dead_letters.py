"""Dead letters: messages moved aside after too many deliveries, an expired TTL, or a client's request;
read, requeued at the end of their queue, or deleted for good. A part the store holds
(``store.dead_letters``), handed the store's records (``records.py``): it moves messages with their
verbs and keeps its own table (``dead``) beside theirs."""

from __future__ import annotations

import msgpack

from pzq.store.bodies import CHUNKED_DEAD, BodyRef, ref_of
from pzq.store.environment import KeyExists, raise_
from pzq.store.layout import KEY, DeadLetter, Message, QueueInfo, accounted
from pzq.store.records import Records


class DeadLetters:
    """The dead letters of the queues, beside their messages (table ``dead``)."""

    def __init__(self, store: Records) -> None:
        self.store, self.env, self.bodies = store, store.env, store.bodies
        self._dead_db = store.env.dbs["dead"]

    def add(self, message: Message, reason: str, *, now_us: int) -> bool:
        """Move a stored message to its queue's dead letters. False if it was no longer stored."""
        if not self.store.delete(message.queue, message.seq, keep_body=True):
            return False
        info = self.store.queue(message.queue)  # (there: its message was just deleted from it)
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
        self.store.account(info, dead_count=1, dead_size=size)
        return True

    def decode(self, info: QueueInfo, key: bytes, value: bytes, txn) -> DeadLetter:
        record = msgpack.unpackb(value)
        enqueued_us, expires_us, frames, deliveries, reason, dead_at_us = record[:6]
        body = BodyRef.read(record[7]) if value[0] == CHUNKED_DEAD else None
        message = Message(
            info.name,
            info.qid,
            KEY.unpack(key)[1],
            frames if body is None else self.bodies.frames(body, txn),
            enqueued_us,
            expires_us,
            deliveries,
            record[6] if len(record) > 6 else None,
            body,
        )
        return DeadLetter(message, reason, dead_at_us)

    def read(self, queue: str, from_seq: int = 0, limit: int = 100, max_bytes: int | None = None) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of ``queue``, oldest first; with ``max_bytes``, no more once their
        bodies reach it (the first is always read)."""
        return list(self.store.walk(self._dead_db, queue, from_seq, limit, self.decode, max_bytes))

    def requeue(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> list[Message]:
        """Put dead letters back at the end of their queue with a fresh delivery count.

        One by ``seq``, or up to ``limit`` of the oldest when ``seq`` is None. Returns the new messages.
        """
        info = self.store.queue(queue, False)
        if info is None:
            return []
        letters = self.read(queue, seq or 0, 1 if seq is not None else limit)
        if seq is not None:
            letters = [d for d in letters if d.message.seq == seq]
        moved = []
        for letter in letters:
            self._remove_dead(info, letter.message.seq, keep_body=True)
            moved.append(
                self.store.append(
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

    def delete(self, queue: str, seq: int | None = None, *, limit: int = 1000) -> int:
        """Delete dead letters for good: one by ``seq``, or up to ``limit`` of the oldest when ``seq``
        is None. Returns how many went."""
        info = self.store.queue(queue, False)
        if info is None:
            return 0
        letters = self.read(queue, seq or 0, 1 if seq is not None else limit)
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
        if (ref := ref_of(value, dead=True)) is not None:
            size += ref.accounted if keep_body else self.bodies.delete(ref)
        self.store.account(info, dead_count=-1, dead_size=-size)
