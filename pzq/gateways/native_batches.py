"""Producers' batches on the native receive socket (PZQ-BATCH/1, pzq/protocols/native_batch.py).

A batch is stored in one ``produce_many`` call, as a run of legacy messages is: all of it, or the prefix
that fitted (a full queue never leaves a gap), acknowledged with how many. Its id is remembered in the
store's dedup table (``native:`` + the id, beside the API's PRODUCE keys; with CURVE, ``native:`` + the
producer's key + 0x1f + the id: each key has its own ids) in the same transaction as
its messages, with a digest of its bodies: the same id with the same bodies within the dedup window is a
resend whose ack was lost, answered with the first outcome and stored nothing. The same id with other
bodies is stored (a duplicate is better than a lost message). At most ``Limits.batch_dedup_ids`` ids are
remembered in all (a resend comes within a client's timeout, seconds): past it the namespace that holds the
most forgets its oldest early (``Remembered``), so that one key's flood of batches forgets its own ids, never
those of a key that holds no more than the others.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Hashable, Sequence

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import StoreFull
from pzq.gateways.contract import BrokerSurface, Send
from pzq.logs import warn_bad
from pzq.protocols import native
from pzq.protocols import native_batch as wire
from pzq.store.dedup_keys import NATIVE_PREFIX, DedupKeys, Produced

PREFIX = NATIVE_PREFIX  # the dedup table's namespace of native batch ids (the API refuses keys in it)
STORED = "batch-stored"  # token of an answer that says something was stored this turn
ANSWER = "batch-answer"  # token of an answer that stays true whatever the turn's commit does
CURVE_SEPARATOR = "\x1f"  # between a CURVE key and a batch id (ids are printable: 0x21-0x7e)


def id_key(batch_id: bytes, curve_key: str | None) -> str:
    """The dedup table's key of a batch id: one namespace without CURVE, one per CURVE key with it (a
    byte no id holds between the two, so neither namespace can name a key of the other)."""
    if curve_key is None:
        return PREFIX + batch_id.decode("ascii")
    return f"{PREFIX}{curve_key}{CURVE_SEPARATOR}{batch_id.decode('ascii')}"


class Remembered:
    """The batch ids remembered, each in its namespace (a producer's CURVE key; None without CURVE), at most
    ``most`` in all, oldest first. Past ``most`` the namespace that holds the most ids forgets its oldest (on
    a tie, the one that got there first, other than the one adding): a producer's flood of batches forgets
    its own ids, and a key that holds fewer than the most never loses one to another key's. So each key
    holds at most ``most`` ids, and there are at most ``most`` keys (each holds one at least). O(1) a batch:
    namespaces are kept in buckets by size."""

    def __init__(self, most: int):
        self.most = most
        self.ids: collections.OrderedDict[str, tuple[Hashable, int]] = collections.OrderedDict()  # -> (space, µs)
        self._spaces: dict[Hashable, collections.OrderedDict[str, None]] = {}  # each one's ids, oldest first
        self._sized: dict[int, dict[Hashable, None]] = {}  # size -> the namespaces of that size
        self._largest = 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def spaces(self) -> int:
        return len(self._spaces)

    def add(self, space: Hashable, key: str, stored_us: int) -> list[tuple[str, int]]:
        """Remember ``key`` (an id of ``space``) as stored at ``stored_us`` (again: it becomes the newest);
        returns the (key, stored µs) of the ids forgotten to make room."""
        ids, ids_of = self.ids, self._spaces.setdefault(space, collections.OrderedDict())
        if ids.pop(key, None) is None:
            self._resize(space, len(ids_of), len(ids_of) + 1)
        ids_of.pop(key, None)
        ids[key], ids_of[key] = (space, stored_us), None
        out: list[tuple[str, int]] = []
        while len(ids) > self.most:
            largest = self._sized[self._largest]
            if len(ids_of) == self._largest and len(largest) == 1:
                victim = space
            else:  # (the namespace that reached that size first, another than the one adding)
                victim = next(other for other in largest if other != space)
            old = next(iter(self._spaces[victim]))
            out.append((old, ids[old][1]))
            self.remove(old)
        return out

    def expired(self, horizon_us: int) -> list[str]:
        """Forget the ids stored at ``horizon_us`` or before (their window passed), oldest first."""
        out: list[str] = []
        ids = self.ids
        while ids and next(iter(ids.values()))[1] <= horizon_us:
            out.append(next(iter(ids)))
            self.remove(out[-1])
        return out

    def remove(self, key: str) -> None:
        """Forget ``key``, if it is remembered."""
        found = self.ids.pop(key, None)
        if found is None:
            return
        space = found[0]
        ids_of = self._spaces[space]
        del ids_of[key]
        self._resize(space, len(ids_of) + 1, len(ids_of))
        if not ids_of:
            del self._spaces[space]

    def _resize(self, space: Hashable, before: int, after: int) -> None:
        sized = self._sized
        if before:
            bucket = sized[before]
            del bucket[space]
            if not bucket:
                del sized[before]
        if after:
            sized.setdefault(after, {})[space] = None
        self._largest = max(self._largest, after)
        while self._largest and self._largest not in sized:  # (it shrinks by one at most a call)
            self._largest -= 1


def space_of(key: str) -> str | None:
    """The namespace of a dedup table key made by ``id_key``: its CURVE key, or None."""
    head, sep, _ = key[len(PREFIX) :].partition(CURVE_SEPARATOR)
    return head if sep else None


class Batches:
    """Stores the batches of producers of ``queue`` and answers them; remembers their ids in ``keys``
    (none: every batch is stored, even a resend) for ``dedup_window_s`` seconds."""

    def __init__(
        self,
        broker: BrokerSurface,
        queue: str,
        keys: DedupKeys | None,
        *,
        max_message_size: int,
        dedup_window_s: float,
        limits: Limits = DEFAULT_LIMITS,
        socket: str = "receive",
    ):
        self.broker = broker
        self.queue = queue
        self.keys = keys
        self.socket = socket
        self.caps = wire.Caps(
            max_messages=limits.batch_max_messages,
            max_bytes=min(limits.batch_max_bytes, limits.turn_write_bytes),  # (one turn's commit holds it)
            max_message_size=max_message_size,
            max_frames=limits.batch_max_frames,
        )
        self.most_ids = limits.batch_dedup_ids
        self.window_us = int(dedup_window_s * 1e6)
        self.batches_total = 0
        self.duplicates_total = 0
        self.refused_total = 0
        self.forgotten_total = 0  # ids forgotten before their window passed (past most_ids)
        self.load()

    def load(self) -> None:
        """Read the remembered ids, oldest first: at start-up and after a rolled-back turn."""
        self._ids = Remembered(1 << 62)  # (no writes here: past the limit, the next batch forgets the excess)
        found = [] if self.keys is None else self.keys.items(PREFIX.encode())
        for stored_us, key in sorted((record.stored_us, key) for key, record in found):
            self._ids.add(space_of(key), key, stored_us)
        self._ids.most = self.most_ids

    def received(self, frames: Sequence[bytes], now_us: int) -> Send:
        """The answer to one batch or probe (``native_batch.is_batch(frames)``); its messages stored."""
        event = wire.parse_batch(frames, self.caps)
        if isinstance(event, wire.Probe):
            return Send(self.socket, wire.probe_answer(event.routing, event.probe_id, self.caps), ANSWER)
        if isinstance(event, wire.BatchRejected):
            self.refused_total += 1
            warn_bad("producer", event.error.code, event.error.detail)
            return Send(self.socket, wire.batch_error(event.routing, event.batch_id, event.error.detail), ANSWER)
        self.batches_total += 1
        routing, batch_id, count = event.routing, event.batch_id, len(event.messages)
        if self.keys is None:
            stored = self.broker.produce_many(self.queue, event.messages, now_us=now_us, encoded=True)
            return self._answer(routing, batch_id, stored, count)
        key = id_key(batch_id, frames.key if type(frames) is wire.KeyedFrames else None)
        digest = hashlib.blake2b(event.raw, digest_size=16).digest()
        seen = self.keys.get(key)  # (a damaged record reads as None: as if the id were new)
        if seen is not None and seen.stored_us + self.window_us > now_us and seen.digests == [digest]:
            self.duplicates_total += 1
            answer = self._answer(routing, batch_id, min(seen.messages, count), count)
            # (committed by an earlier turn, unless it was this one's: then it goes if the turn's commit fails)
            return answer if seen.stored_us == now_us else Send(self.socket, answer.frames, ANSWER)
        if seen is not None and seen.stored_us + self.window_us > now_us:
            warn_bad("producer", "batch-id-reused", f"batch id {batch_id[:80]!r} again, other messages: stored")
        try:  # first: an id refused for room leaves nothing stored
            self.keys.put(key, Produced(now_us, count, [digest]))
        except StoreFull:
            return self._answer(routing, batch_id, 0, count)
        stored = self.broker.produce_many(self.queue, event.messages, now_us=now_us, encoded=True)
        if stored == 0:  # as before, so that the producer's resend is no "duplicate"
            if seen is None:
                self.keys.delete(key)
            else:
                self.keys.put(key, seen)
        else:
            if stored < count:  # (a replacement always fits)
                self.keys.put(key, Produced(now_us, stored, [digest]))
            self._remember(self.keys, key, now_us)
        return self._answer(routing, batch_id, stored, count)

    def _answer(self, routing: bytes, batch_id: bytes, stored: int, count: int) -> Send:
        if stored == count:
            return Send(self.socket, wire.batch_ack(routing, batch_id, stored), STORED)
        return Send(self.socket, wire.batch_error(routing, batch_id, native.QUEUE_FULL, stored), STORED)

    def _remember(self, keys: DedupKeys, key: str, now_us: int) -> None:
        ids = self._ids
        for old in ids.expired(now_us - self.window_us):
            keys.delete(old)
        for old, _ in ids.add(space_of(key), key, now_us):
            self.forgotten_total += 1
            keys.delete(old)

    def failed(self, frames: Sequence[bytes]) -> Send:
        """The answer to a batch of a turn that failed before or while it was stored: nothing of it is."""
        event = wire.parse_batch(frames, self.caps)
        if isinstance(event, wire.Probe):
            return Send(self.socket, wire.probe_answer(event.routing, event.probe_id, self.caps), ANSWER)
        if isinstance(event, wire.BatchRejected):
            return Send(self.socket, wire.batch_error(event.routing, event.batch_id, event.error.detail), ANSWER)
        return Send(self.socket, wire.batch_error(event.routing, event.batch_id, native.STORE_FAILED), ANSWER)

    def rolled_back(self, send: Send) -> Send:
        """A batch's answer once its turn's commit failed: what it stored is gone."""
        if send.token != STORED:
            return send
        return Send(self.socket, wire.refuse_batch(send.frames, native.STORE_FAILED), ANSWER)

    def stats(self) -> dict:
        return {
            "batches": self.batches_total,
            "batches_refused": self.refused_total,
            "batch_duplicates_dropped": self.duplicates_total,
            "batch_ids_forgotten_early": self.forgotten_total,
            "batch_ids": len(self._ids),
            "batch_id_keys": self._ids.spaces,
        }
