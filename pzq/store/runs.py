"""Runs of messages in one call: a batch's records, the delivery counts of a take's run, the deletes of
an ack run (and of a group's acknowledged range), and the headers a lease reads, a run of plain messages
at a time.

A producer's batch (PZQ-BATCH/1) carries each message as the msgpack array of its frames, which is what
a record holds after its ``[enqueued_us, 0,`` header: ``put_encoded`` stores them behind one header
built once, with no per-message encoding and one cursor call.

The per-message calls (``mark_delivered``, ``delete``) cost a clock read, a key, a transaction lookup
and an accounting update each; a native consumer's turn takes and acks hundreds, so these do the same
work once per run (issue 27: "pop and delete a run of refs in one loop"). Same effects, same order.

``plain_run`` is the take's batch path: it reads a run of records as they are stored (frames, enqueue
time, delivery count) without building a ``Message`` for each, and stops before the first record that
needs a closer look (a TTL, meta such as its own delivery cap, a body in chunks, or a record it cannot
read), which the general path (``scan``) then reads as before.

``lease_headers`` is ``headers`` for a group's lease: a record whose first bytes say it has no TTL and
no meta (a native or API message: ``[enqueued_us, 0, [frames]]``) needs nothing else read, so the walk
looks at those few bytes only, and a run of such messages with consecutive seqs and one delivery count
comes back as one entry. Delivery counts are found by walking the deliveries table beside the
messages (a fresh queue has none: one seek) rather than by a lookup per message. Any other record is
read whole. A record damaged past its first bytes is set aside when it is fetched, as any record is:
it then reads as gone. ``delete_range`` walks the deliveries table beside the messages the same way.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Container, Sequence

import msgpack

from pzq.store.environment import LmdbError
from pzq.store.layout import KEY, OVERHEAD, U32, U64, U64_MAX, Message
from pzq.store.messages import CHUNKED, Messages
from pzq.store.queues import raise_

PLAIN = 0x93  # a record's first byte when it is [enqueued µs, expires µs, frames]: no meta, body inline

Plain = tuple[int, int, list[bytes], int]  # (seq, enqueued µs, frames, deliveries so far)

# A plain record's first bytes with no TTL: ``[enqueued_us, 0, [frames]]`` (msgpack: a 3-array, a
# non-negative int, 0, an array header), what every native and API message without a TTL is
# (messages.native_record)
PLAIN_NO_TTL = re.compile(rb"\x93(?:[\x00-\x7f]|\xcc.|\xcd..|\xce.{4}|\xcf.{8})\x00[\x90-\x9f\xdc\xdd]", re.S)
# Past every key (a u64 qid and seq: 16 bytes): where a walk of the deliveries table ends
_PAST_KEYS = b"\xff" * 17
# One lease entry: (first seq, count, expires_us, max_deliveries or 0, deliveries); count > 1 only for
# a run of plain messages (no TTL, no cap)
LeaseEntry = tuple[int, int, int, int, int]


class Runs(Messages):
    """Batches' records, delivery counts and deletes of runs of messages, and plain runs for the take (see
    the module's text)."""

    def plain_run(
        self, queue: str, from_seq: int, limit: int, max_bytes: int, skip: Container[tuple[int, int]]
    ) -> tuple[list[Plain], int, bool]:
        """Up to ``limit`` messages of ``queue`` from ``from_seq`` on that need no look of their own (no
        TTL, no meta, the body inline), as ``(seq, enqueued µs, frames, deliveries)``, passing over those
        whose ref ``(qid, seq)`` is in ``skip`` (in flight: they count toward ``limit``, as ``scan``'s
        do); no more once their records reach ``max_bytes`` (the first is always read). Returns (them,
        the seq to go on from, whether it stopped at a record that needs a look: left for ``scan``)."""
        info = self._queues.get(queue)
        out: list[Plain] = []
        if info is None or limit <= 0:
            return out, from_seq, False
        qid, prefix, unpack_key, unpackb = info.qid, U64.pack(info.qid), KEY.unpack, msgpack.unpackb
        pending, deliveries_db, u32 = self._pending_counts, self._deliveries_db, U32.unpack
        size, seen, seq, nxt, stopped = 0, 0, from_seq, from_seq, False
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if not cursor.set_range(KEY.pack(qid, from_seq)):
                return out, from_seq, False
            get = txn.get
            # (no count written at all, the usual case when acks come before commits write counts: none to read)
            has_counts = txn.stat(deliveries_db)["entries"] > 0
            for key, value in cursor:
                if seen >= limit or size >= max_bytes or not key.startswith(prefix):
                    break
                seq = unpack_key(key)[1]
                if not value or value[0] != PLAIN:
                    stopped = True
                    break
                try:
                    record = unpackb(value)
                except (ValueError, msgpack.UnpackException):
                    stopped = True
                    break
                frames = record[2]
                if (
                    record[1] != 0
                    or type(record[0]) is not int
                    or type(frames) is not list
                    or not (len(frames) == 1 and type(frames[0]) is bytes or all(type(f) is bytes for f in frames))
                ):  # (a TTL, or a record to read closely: ``scan`` takes it, or sets it aside)
                    stopped = True
                    break
                nxt, seen = seq + 1, seen + 1
                if (qid, seq) in skip:
                    continue
                count = pending.get(key)
                if count is not None:
                    deliveries = count[0]
                elif not has_counts:
                    deliveries = 0
                else:
                    raw = get(key, db=deliveries_db)
                    # (a damaged count reads as 0, as ``scan`` reads it)
                    deliveries = u32(raw)[0] if raw and len(raw) == 4 else 0
                out.append((seq, record[0], frames, deliveries))
                size += len(value)
        return out, seq if stopped else nxt, stopped

    def count_deliveries(self, queue: str, run: Sequence[Plain]) -> int:
        """``mark_delivered`` each message of a plain run (``plain_run``'s, as read); returns how many had
        been delivered before (redeliveries)."""
        qid, pack, now = self._queues[queue].qid, KEY.pack, time.monotonic()
        again = 0
        items = []
        for seq, _, _, deliveries in run:
            again += deliveries > 0
            items.append((pack(qid, seq), (deliveries + 1, now)))
        self._pending_counts.set_many(items)
        return again

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
        return self._put_run(queue, info, list(zip(keys, values, strict=True)), total)

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
        counted: list[bytes] = []  # (keys whose delivery count waits in memory: dropped in one call)
        count = size = 0
        try:  # inline rather than through env.do(): every ack comes here
            # (no count written at all, the usual case when acks come before commits write counts: none to delete)
            has_counts = txn.stat(deliveries_db)["entries"] > 0
            for seq in seqs:
                key = pack(qid, seq)
                value = txn.pop(key, db=messages_db)
                if value is None:
                    out.append(False)
                    continue
                if has_counts:
                    txn.delete(key, db=deliveries_db)  # a lookup only, when it was never written
                if key in pending:
                    counted.append(key)
                size += len(key) + len(value)  # (+ OVERHEAD each: ``accounted``, added once below)
                if value[:1] == CHUNKED and (ref := self.ref_of(value)) is not None:
                    size += self.delete_body(ref)
                count += 1
                out.append(True)
        except LmdbError as exc:
            self.env.do(raise_, exc)  # (rolls the turn back and raises StoreError)
            raise
        finally:
            if counted:
                pending.pop_many(counted)
            if count:  # (what was deleted before a failure is accounted: the rollback undoes both)
                self._account(info, -count, -size - count * OVERHEAD)
        return out

    def delete_range(self, queue: str, lo: int, hi: int, limit: int) -> tuple[int, int]:
        """Remove at most ``limit`` stored messages with seqs ``lo .. hi-1``, walking only the records
        that exist (a consumer group's acknowledged range); returns (how many, the seq to go on from:
        ``hi`` once the range is done)."""
        info = self._queues.get(queue)
        if info is None or lo >= hi:
            return 0, hi
        txn = self.env.write()
        removed = size = 0
        end, start, pending = KEY.pack(info.qid, hi), KEY.pack(info.qid, lo), self._pending_counts
        try:
            counts = txn.cursor(db=self._deliveries_db)  # (a fresh message has no count: usually one seek)
            next_count = bytes(counts.key() if counts.set_range(start) else b"") or _PAST_KEYS
            cursor = txn.cursor(db=self._messages_db)
            key: bytes = bytes(cursor.key()) if cursor.set_range(start) else b""
            while key and key < end and removed < limit:
                value = cursor.value()
                size += len(value)
                if value[:1] == CHUNKED and (ref := self.ref_of(value)) is not None:
                    size += self.delete_body(ref)
                while next_count < key:  # (a count left without its message: kept, as a key delete keeps it)
                    next_count = bytes(counts.key() if counts.next() else b"") or _PAST_KEYS
                if next_count == key:
                    counts.delete()  # (and moves to the next count)
                    next_count = bytes(counts.key()) or _PAST_KEYS
                if pending:
                    pending.pop(key, None)
                removed += 1
                cursor.delete()  # (and moves to the next record: b"" past the last)
                key = bytes(cursor.key())
            at = hi if not key or key >= end else KEY.unpack(key)[1]
        except LmdbError as exc:
            self.env.do(raise_, exc)  # (rolls the turn back and raises StoreError)
            raise
        if removed:  # (every key is KEY.size bytes: accounted() of each, summed)
            self._account(info, -removed, -(size + removed * (KEY.size + OVERHEAD)))
        return removed, at

    def lease_headers(self, queue: str, from_seq: int, limit: int) -> list[LeaseEntry]:
        """What ``headers`` reads of up to ``limit`` messages of ``queue`` from ``from_seq`` on, as
        entries ``(seq, count, expires_us, max_deliveries or 0, deliveries)``: consecutive plain
        messages (no TTL, no meta) with one delivery count are one entry (see the module's text)."""
        info = self._queues.get(queue)
        if info is None or limit <= 0:
            return []
        out: list[list[int]] = []
        qid, pending, plain = info.qid, self._pending_counts, PLAIN_NO_TTL.match
        stop = KEY.pack(qid + 1, 0) if qid < U64_MAX else _PAST_KEYS
        last: list[int] = [-2, 0, 1, 1, 0]  # (no entry yet: nothing goes on from it)
        with self.env.reading() as txn:
            counts = txn.cursor(db=self._deliveries_db)  # (walked beside the messages: one seek when empty)
            next_count = bytes(counts.key() if counts.set_range(KEY.pack(qid, from_seq)) else b"") or _PAST_KEYS
            cursor = txn.cursor(db=self._messages_db)
            if not cursor.set_range(KEY.pack(qid, from_seq)):
                return []
            for key, value in itertools.islice(cursor, limit):
                if key >= stop:
                    break
                seq = int.from_bytes(key[8:], "big")
                deliveries = 0
                if key >= next_count:
                    while next_count < key:  # (a count left without its message)
                        next_count = bytes(counts.key() if counts.next() else b"") or _PAST_KEYS
                    if next_count == key:
                        raw = counts.value()
                        deliveries = U32.unpack(raw)[0] if len(raw) == 4 else 0
                        next_count = bytes(counts.key() if counts.next() else b"") or _PAST_KEYS
                if pending and (count := pending.get(key)) is not None:
                    deliveries = count[0]
                if plain(value):
                    if last[0] + last[1] == seq and last[4] == deliveries and last[2] == 0 == last[3]:
                        last[1] += 1
                    else:
                        last = [seq, 1, 0, 0, deliveries]
                        out.append(last)
                    continue
                header = self._header_of(info, key, value)
                if header is not None:
                    last = [seq, 1, header[0], header[1], deliveries]
                    out.append(last)
        self._set_aside()
        return [(seq, count, expires_us, cap, deliveries) for seq, count, expires_us, cap, deliveries in out]

    def _header_of(self, info, key: bytes, value: bytes) -> tuple[int, int] | None:
        """(expires_us, max_deliveries or 0) of a record read whole, as ``headers`` reads it; None (noted
        for ``_set_aside``) when it cannot be read."""
        try:
            record = msgpack.unpackb(value)
            expires_us = record[1]
            if type(expires_us) is not int or type(record[2]) is not list:
                raise ValueError("not a message record")
            meta = record[3] if len(record) > 3 else None
            cap = meta.get("max_deliveries") or 0 if type(meta) is dict else 0
        except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
            self._unreadable.append((info, key, f"{type(exc).__name__}: {exc}"))
            return None
        return expires_us, cap if type(cap) is int else 0
