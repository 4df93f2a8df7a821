"""Looking without changing: the web console's previews (the start of a message's body, read in place
from the map) and the audit of every record that ``pzq check`` and ``pzq dump`` read. A part the store
holds (``store.previews``), handed its records and dead letters; nothing here writes."""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Callable, Iterable, Iterator

import msgpack

from pzq.store.bodies import ref_of
from pzq.store.dead_letters import DeadLetters
from pzq.store.layout import KEY, U64, DeadLetter, Message, message_id
from pzq.store.records import Records


@dataclasses.dataclass(frozen=True)
class Preview:
    """The start of a stored message or dead letter, as the web console shows it."""

    id: str
    enqueued_us: int
    deliveries: int
    body_head: bytes  # the first bytes of its frames joined
    body_size: int  # of all its frames (its record's size when it has more than PREVIEW_FRAMES frames)
    reason: str = ""  # a dead letter's (left out past PREVIEW_FRAMES frames)
    size_exact: bool = True
    dead_at_us: int = 0  # a dead letter's (0 past PREVIEW_FRAMES frames)
    seq: int = 0


@dataclasses.dataclass(frozen=True)
class PreviewPage:
    """A page of previews: ``more`` when the walk stopped before the queue's end; ``last`` the seq of
    the last record walked (the next page starts after it, even when every walked one was skipped)."""

    previews: list[Preview]
    more: bool
    last: int | None


PREVIEW_FRAMES = 64  # frames of one record a preview walks: a million empty frames cost no more
PREVIEW_FLOOR = 100  # rows a page with a deadline has at least (fewer only at the queue's end or ``limit``)


_BIN_HEADERS = {0xC4: (2, ">B"), 0xC5: (3, ">H"), 0xC6: (5, ">I")}


def _preview_record(
    view: memoryview, head_bytes: int, dead: bool
) -> tuple[int, bytes, int, int, str, bool, int] | None:
    """(enqueued_us, first ``head_bytes`` of the body, body size, deliveries, reason, whether the size
    is exact, dead_at_us) of a record, read without copying its frames; None if it is not one. Walks the msgpack
    layout (layout.py): the fields before the frames, each frame's bin header (at most
    PREVIEW_FRAMES of them: past that the record's size stands for the body's), and a dead letter's
    fields after them."""
    try:
        fields = msgpack.Unpacker()
        fields.feed(view[:64])
        if fields.read_array_header() < (6 if dead else 3):
            return None
        enqueued_us, _ = int(fields.unpack()), fields.unpack()
        frames = fields.read_array_header()
        at, head, size = fields.tell(), bytearray(), 0
        if frames > PREVIEW_FRAMES:
            for _ in range(PREVIEW_FRAMES):
                header = _BIN_HEADERS.get(view[at])
                if header is None or len(head) >= head_bytes:
                    break
                start = at + header[0]
                length = struct.unpack_from(header[1], view, at + 1)[0]
                head += view[start : start + min(length, head_bytes - len(head))]
                at = start + length
            return enqueued_us, bytes(head), len(view), 0, "", False, 0
        for _ in range(frames):
            header = _BIN_HEADERS.get(view[at])
            if header is None:
                return None
            length = struct.unpack_from(header[1], view, at + 1)[0]
            start = at + header[0]
            if start + length > len(view):
                return None
            head += view[start : start + min(length, head_bytes - len(head))]
            size += length
            at = start + length
        deliveries, reason, dead_at_us = 0, "", 0
        if dead:
            rest = msgpack.Unpacker()
            rest.feed(view[at : at + 1024])
            deliveries, reason, dead_at_us = int(rest.unpack()), str(rest.unpack()), int(rest.unpack())
        return enqueued_us, bytes(head), size, deliveries, reason, True, dead_at_us
    except (ValueError, TypeError, IndexError, struct.error, msgpack.UnpackException):
        return None


class Previews:
    """Previews and the audit (see the module's text)."""

    def __init__(self, store: Records, dead_letters: DeadLetters) -> None:
        self.store, self.env, self.bodies, self.dead_letters = store, store.env, store.bodies, dead_letters
        self._messages_db, self._dead_db = store.env.dbs["messages"], store.env.dbs["dead"]
        self._damaged_db = store.env.dbs["damaged"]

    def first(self, queue: str, limit: int, head_bytes: int, *, dead: bool = False) -> list[Preview]:
        """The first ``limit`` committed messages (or dead letters) of ``queue``, each with only the
        first ``head_bytes`` of its body: a look that costs the same for 16 MiB bodies as for tiny
        ones. Unreadable records are left out (``scan`` sets them aside)."""
        return self.page(queue, limit, head_bytes, dead=dead).previews

    def page(
        self,
        queue: str,
        limit: int,
        head_bytes: int,
        *,
        dead: bool = False,
        after: int | None = None,
        skip: Callable[[int], bool] | None = None,
        walk: int | None = None,
        deadline: float | None = None,
    ) -> PreviewPage:
        """``first`` from the record after seq ``after`` (a cursor placed there, not a walk from the
        head), leaving out the seqs ``skip`` names (messages in flight: told from the key alone, before
        the record is read); at most ``walk`` records are walked (default twice ``limit``: unreadable
        and skipped ones count too, so a damaged queue or a head all in flight is not walked to its end);
        past ``deadline`` (time.perf_counter) the page ends early, once it has PREVIEW_FLOOR rows (or
        ``limit``), with ``more``."""
        info = self.store.queue(queue, False)
        if info is None or limit <= 0:
            return PreviewPage([], False, None)
        out: list[Preview] = []
        prefix = U64.pack(info.qid)
        walk = 2 * limit if walk is None else walk
        last, more = None, False
        with self.env.snapshot() as txn:
            cursor = txn.cursor(db=self._dead_db if dead else self._messages_db)
            start = prefix if after is None else KEY.pack(info.qid, after + 1) if after < (1 << 64) - 1 else None
            if start is None or not cursor.set_range(start):
                return PreviewPage(out, False, None)
            for walked, key in enumerate(cursor.iternext(keys=True, values=False)):
                if bytes(key[:8]) != prefix:
                    break
                if len(out) >= limit or walked >= walk:
                    more = True
                    break
                if deadline is not None and len(out) >= PREVIEW_FLOOR and time.perf_counter() > deadline:
                    more = True  # (what the loop may spend on one look is spent: the rest on the next page)
                    break
                seq = KEY.unpack(key)[1]
                last = seq
                if skip is not None and skip(seq):
                    continue
                value = cursor.value()
                ref = ref_of(value, dead)
                found = _preview_record(value, head_bytes, dead)
                if found is None:
                    continue
                if ref is not None:  # (the record's frames are empty: the body is in chunks)
                    found = (found[0], self.bodies.head(ref, head_bytes), sum(ref.sizes), *found[3:])
                enqueued_us, head, size, deliveries, reason, exact, dead_at_us = found
                if not dead:
                    deliveries = self.store.deliveries(bytes(key), txn)
                out.append(
                    Preview(
                        message_id(info.qid, seq), enqueued_us, deliveries, head, size, reason, exact, dead_at_us, seq
                    )
                )
        return PreviewPage(out, more, last)

    def oldest_enqueued(self, names: Iterable[str]) -> dict[str, int]:
        """When the head message of each queue of ``names`` that has one was stored (µs): one committed
        read of each head record's first field (the once-a-second figures, whatever its body's size)."""
        out: dict[str, int] = {}
        with self.env.snapshot() as txn:
            cursor = txn.cursor(db=self._messages_db)
            for name in names:
                info = self.store.queue(name, False)
                if info is None:
                    continue
                prefix = U64.pack(info.qid)
                if not info.count or not cursor.set_range(prefix) or bytes(cursor.key()[:8]) != prefix:
                    continue
                try:
                    fields = msgpack.Unpacker()
                    fields.feed(cursor.value()[:16])
                    fields.read_array_header()
                    out[info.name] = int(fields.unpack())
                except (ValueError, TypeError, msgpack.UnpackException):
                    continue  # (an unreadable head: scan sets it aside when it is delivered)
        return out

    def audit(self, queue: str) -> Iterator[tuple[str, Message | DeadLetter | None]]:
        """Every record of ``queue``, in order: ("message", Message), ("dead", DeadLetter), or (kind,
        None) for one that cannot be read. Read-only: nothing is set aside (``pzq check``, ``pzq dump``)."""
        info = self.store.queue(queue, False)
        if info is None:
            raise KeyError(queue)
        prefix = U64.pack(info.qid)
        with self.env.reading() as txn:
            for kind, db in (("message", self._messages_db), ("dead", self._dead_db)):
                cursor = txn.cursor(db=db)
                if not cursor.set_range(prefix):
                    continue
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    if kind == "message":
                        yield kind, self.store.read_record(info, key, value, txn)
                        continue
                    try:
                        yield kind, self.dead_letters.decode(info, key, value, txn)
                    except (ValueError, TypeError, msgpack.UnpackException):
                        yield kind, None

    def damaged(self) -> list[tuple[bytes, bytes]]:
        """The raw records set aside as unreadable (for ``pzq dump``)."""
        with self.env.reading() as txn:
            return list(txn.cursor(db=self._damaged_db))
