"""Runs of messages in one call: a producer's run of records, the delivery counts of a take's run, the
deletes of an ack run (and of a group's acknowledged range), and the headers a lease reads, a run of
plain messages at a time. Drawn on the core (``core.py``): these are the verbs the hot paths call.

A native producer's turn of messages is stored with one cursor call (``put_many``). A producer's batch
(PZQ-BATCH/1) carries each message as the msgpack array of its frames, which is what a record holds
after its ``[enqueued_us, 0,`` header: ``put_encoded`` stores them behind one header built once, with
no per-message encoding and one cursor call.

The per-message calls (``mark_delivered``, ``delete``) cost a clock read, a key, a transaction lookup
and an accounting update each; a native consumer's turn takes and acks hundreds, so these do the same
work once per run (issue 27: "pop and delete a run of refs in one loop"). Same effects, same order.

``plain_run`` is the take's batch path: it reads a run of records as they are stored (frames, enqueue
time, delivery count) without building a ``Message`` for each, and stops before the first record that
needs a closer look (a TTL, meta such as its own delivery cap, a body in chunks, or a record it cannot
read), which the general path (``scan``) then reads as before (the columns: ``plain_runs.py``).

``lease_headers`` is ``headers`` for a group's lease: a record whose first bytes say it has no TTL and
no meta (a native or API message: ``[enqueued_us, 0, [frames]]``) needs nothing else read, so the walk
looks at those few bytes only, and a run of such messages with consecutive seqs and one delivery count
comes back as one entry. Delivery counts are found by walking the deliveries table beside the
messages (a fresh queue has none: one seek) rather than by a lookup per message. Any other record is
read whole. A record damaged past its first bytes is set aside when it is fetched, as any record is:
it then reads as gone. ``delete_range`` walks the deliveries table beside the messages the same way.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Container, Sequence
from operator import is_not, itemgetter
from typing import Any

import msgpack

from pzq.store.bodies import CHUNKED_MESSAGE, Bodies, ref_of
from pzq.store.core import Core
from pzq.store.environment import KeyExists, LmdbError, raise_
from pzq.store.layout import KEY, OVERHEAD, U32, U64_MAX, Message, QueueInfo
from pzq.store.pending import run_all
from pzq.store.plain_runs import NO_RUN, PLAIN_NO_TTL, PlainRun, plain_columns, plain_rows

CHUNKED = bytes([CHUNKED_MESSAGE])  # a chunked record's first byte
_first, _second = itemgetter(0), itemgetter(1)

# Past this many body bytes a native record is joined from its frames (one copy): msgpack grows its buffer
# by copies, which took 19 ms of a 16 MiB message's 80 ms turn. The bytes are msgpack's, to the byte.
BIG_RECORD = 1 << 20


def _header(length: int, small: int, sizes: tuple[bytes, bytes, bytes]) -> bytes:
    """A msgpack array (``small`` 0x90) or bin (``small`` 0) header for ``length`` items or bytes."""
    if small and length < 16:
        return bytes([small | length])
    if length < 256 and not small:
        return sizes[0] + length.to_bytes(1, "big")
    if length < 65536:
        return sizes[1] + length.to_bytes(2, "big")
    return sizes[2] + length.to_bytes(4, "big")


def native_record(now_us: int, body: Sequence[bytes], pack=msgpack.packb) -> bytes:
    """``msgpack.packb([now_us, 0, body])`` of a message's frames, joined in one copy when it is big."""
    if sum(map(len, body)) < BIG_RECORD:  # (``pack``: a run's own Packer, a third of packb's cost)
        return pack([now_us, 0, body])
    parts = [b"\x93", msgpack.packb(now_us), b"\x00", _header(len(body), 0x90, (b"", b"\xdc", b"\xdd"))]
    for frame in body:
        parts += (_header(len(frame), 0, (b"\xc4", b"\xc5", b"\xc6")), frame)
    return b"".join(parts)


# Past every key (a u64 qid and seq: 16 bytes): where a walk of the deliveries table ends
_PAST_KEYS = b"\xff" * 17
# One lease entry: (first seq, count, expires_us, max_deliveries or 0, deliveries); count > 1 only for
# a run of plain messages (no TTL, no cap)
LeaseEntry = tuple[int, int, int, int, int]


def _pop_consecutive(cursor, keys: list[bytes]) -> list[Any] | None:
    """The values of ``keys`` deleted, when they are the records that follow each other from the first
    (an ack of a run as it was taken): read in one walk, deleted where the cursor stands (no search
    from the root for each); None, having deleted nothing, for any other run."""
    if not cursor.set_key(keys[0]):
        return None
    got = list(itertools.islice(cursor.iternext(), len(keys)))
    if list(map(_first, got)) != keys:
        return None
    cursor.set_key(keys[0])
    run_all(map(cursor.delete, itertools.repeat(False, len(keys))))  # (each moves the cursor to the next)
    return list(map(_second, got))


class Runs(Core):
    """Batches' records, delivery counts and deletes of runs of messages, and plain runs for the take (see
    the module's text)."""

    bodies: Bodies  # (the store's part, set by the store as it opens)

    def plain_run(
        self, queue: str, from_seq: int, limit: int, max_bytes: int, skip: Container[tuple[int, int]]
    ) -> tuple[PlainRun, int, bool]:
        """Up to ``limit`` messages of ``queue`` from ``from_seq`` on that need no look of their own (no
        TTL, no meta, the body inline), with their enqueue time, frames and delivery counts so far,
        passing over those whose ref ``(qid, seq)`` is in ``skip`` (in flight: they count toward
        ``limit``, as ``scan``'s do); no more once their records reach ``max_bytes`` (the first is always
        read). Returns (them, the seq to go on from, whether it stopped at a record that needs a look:
        left for ``scan``)."""
        info = self._queues.get(queue)
        if info is None or limit <= 0:
            return NO_RUN, from_seq, False
        with self.env.reading() as txn:
            cursor = txn.cursor(db=self._messages_db)
            if not cursor.set_range(KEY.pack(info.qid, from_seq)):
                return NO_RUN, from_seq, False
            records = list(itertools.islice(cursor.iternext(), limit))
            # (no count written at all, the usual case when acks come before commits write counts: none to read)
            written = txn.stat(self._deliveries_db)["entries"]
            counts = functools.partial(txn.get, db=self._deliveries_db) if written else None
            ran = plain_columns(info.qid, records, max_bytes, skip, counts, self._pending_counts)
            if ran is not None:
                return ran
            return plain_rows(info.qid, from_seq, records, max_bytes, skip, counts, self._pending_counts)

    def count_deliveries(self, queue: str, run: PlainRun) -> int:
        """``mark_delivered`` each message of a plain run (``plain_run``'s, as read); returns how many had
        been delivered before (redeliveries). A first delivery's count is one shared value: a run of them
        costs no object per message."""
        now = time.monotonic()
        if run.deliveries is None:  # (none has a count, pending or written: the usual run)
            self._pending_counts.set_new(run.keys, (1, now))
            return 0
        if not any(run.deliveries):
            self._pending_counts.set_many(run.keys, itertools.repeat((1, now), len(run.keys)))
            return 0
        self._pending_counts.set_many(run.keys, [(count + 1, now) for count in run.deliveries])
        return len(run.deliveries) - run.deliveries.count(0)

    def put_many(self, queue: str, bodies: Sequence[Sequence[bytes]], *, now_us: int) -> int:
        """Append messages (no TTL, no meta) to ``queue`` in one call: how many of them, from the first,
        were stored; the others did not fit under the store limit (or the disk is short). The native
        producers' hot path: one LMDB call for a turn's messages, no Message objects. Raises
        StoreFull, storing nothing, when the queue cannot be made."""
        if not bodies or self.low_disk:
            return 0
        info = self._queues.get(queue) or self.queue(queue, implicit=True)
        room = self.max_size - self._total_bytes - self._side()
        items: list[tuple[bytes, bytes]] = []
        key, qid, seq, total, pack = KEY.pack, info.qid, info.next_seq, 0, msgpack.Packer().pack
        for body in bodies:
            value = native_record(now_us, body, pack)
            size = len(value) + KEY.size + OVERHEAD
            if total + size > room:
                break
            items.append((key(qid, seq), value))
            seq += 1
            total += size
        return self._put_run(queue, info, items, total) if items else 0

    def _put_run(self, queue: str, info: QueueInfo, items: list[tuple[bytes, bytes]], total: int) -> int:
        """Put ``items`` (the queue's next seqs, in order) in one cursor call and account ``total`` bytes
        for them; returns how many."""
        cursor = self.env.write().cursor(db=self._messages_db)
        try:
            _, added = cursor.putmulti(items, overwrite=False)
        except LmdbError as exc:
            self.env.do(raise_, exc)
        if added != len(items):  # another writer used these seqs: storing over them would lose messages
            self.env.do(raise_, KeyExists(f"messages of queue {queue!r} from seq {info.next_seq} are already stored"))
        info.next_seq += len(items)
        self.account(info, len(items), total)
        return len(items)

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
        keys, counts = [], []
        again = 0
        for message in messages:
            count = message.deliveries + 1
            again += count > 1
            message.deliveries = count
            keys.append(pack(qid, message.seq))
            counts.append((count, now))
        self._pending_counts.set_many(keys, counts)
        return again

    def delete_many(self, queue: str, seqs: Sequence[int]) -> list[bool]:
        """``delete`` each of ``seqs`` of ``queue`` in order, each step over the whole run in C, with one
        accounting update; whether each was stored (False: already gone, or a repeat)."""
        info = self._queues.get(queue)
        if info is None:
            return [False] * len(seqs)
        txn = self.env.write()
        n, pending, messages_db, deliveries_db = len(seqs), self._pending_counts, self._messages_db, self._deliveries_db
        keys = list(map(KEY.pack, itertools.repeat(info.qid, n), seqs))
        try:  # inline rather than through env.do(): every ack comes here
            values: list[Any] | None = _pop_consecutive(txn.cursor(db=messages_db), keys)
            if values is None:
                values = list(map(functools.partial(txn.pop, db=messages_db), keys))  # (bytes, or None: gone)
            out = list(map(is_not, values, itertools.repeat(None, n)))
            count = out.count(True)
            if count < n:  # (some were gone already)
                keys = list(itertools.compress(keys, out))
                values = list(itertools.compress(values, out))
            # (no count written at all, the usual case when acks come before commits write counts: none to delete)
            if count and txn.stat(deliveries_db)["entries"] > 0:
                run_all(map(functools.partial(txn.delete, db=deliveries_db), keys))  # (a lookup when never written)
            size = sum(map(len, values)) + KEY.size * count  # (+ OVERHEAD each: ``accounted``, added once below)
            if any(map(bytes.startswith, values, itertools.repeat(CHUNKED))):  # (their bodies go too)
                size += sum(self.bodies.delete(ref) for value in values if (ref := ref_of(value)) is not None)
        except LmdbError as exc:
            self.env.do(raise_, exc)  # (rolls the turn back and raises StoreError)
            raise
        if pending:  # (keys whose delivery count waits in memory: dropped in one call)
            counted = list(filter(pending.__contains__, keys))
            if counted:
                pending.pop_many(counted)
        if count:
            self.account(info, -count, -size - count * OVERHEAD)
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
                if value[:1] == CHUNKED and (ref := ref_of(value)) is not None:
                    size += self.bodies.delete(ref)
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
            self.account(info, -removed, -(size + removed * (KEY.size + OVERHEAD)))
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
        self.set_aside()
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
