"""The store's key layout and record types: what every part of the queue model reads and writes.

Key layout (every integer big-endian, so LMDB's byte order is FIFO order)::

    queues      name (utf-8)            -> msgpack [qid, next_seq, count, bytes, dead_count, dead_bytes, flags]
                                           (flags: 1 = implicit, made by a client's request; format 3)
    meta        b"next_qid"             -> u64 (ids are never reused, so message ids stay unique)
                b"seq_floor"            -> u64 (a new queue's first seq: above every seq of a queue that
                                           was deleted or expired, so no seq a Spark offset names comes
                                           again under the same name; format 3)
                b"format"               -> u64 (the store's format version, ``FORMAT``; absent = 1)
                b"shard"                -> utf-8, the shard this store is (``--shard`` at its first start)
                b"partitions\0" + name  -> u64, the partitions of a queue made with CREATE's count
                                           (older pzq ignores both: no format change)
    messages    qid u64 | seq u64       -> msgpack [enqueued_us, expires_us (0 = never), [frame, ...]
                                                    (, meta: a protocol's own fields, e.g. eMQP's)]
    deliveries  qid u64 | seq u64       -> u32 delivery count (absent = never delivered)
    damaged     qid u64 | seq u64       -> the raw record of a message that could not be read (set aside)
    dead        qid u64 | seq u64       -> msgpack [enqueued_us, expires_us, [frame, ...], deliveries,
                                                    reason, dead_at_us (, meta)]
    bodies      body id u64 | chunk u32 -> bytes of a big body, in order (format 4; store/bodies.py): its
                                           message record is [enqueued_us, expires_us, [], meta or nil,
                                           [body id, chunks, [frame sizes]]], its dead letter
                                           [..., dead_at_us, meta or nil, [body id, chunks, [sizes]]]
    uploads     body id u64             -> msgpack chunks: a body still being written (no record yet)
                b"next_body" (in meta)  -> u64, the next body id

Side tables (schedules, consumer groups, dedup keys, bindings, eMQP jobs) live in the same
environment, each with one owner in this package (``SIDE_TABLES``); their pages count toward the
store limit with the queues'.

Format versions: 1 is the layout above. 2 adds the schedules' run records (store/schedules.py: each run
writes its next time and runs left apart from the payload). Format-1 records are read as they are; a
format-1 pzq, which would run spent runs again from the older whole record, refuses a format-2 store.
3 adds the queue record's flags (implicit queues expire when unused: store/queues.py) and the seq floor;
a record of six fields is an explicit queue (it never expires), and no floor reads as 1.
4 adds big bodies in chunks (``bodies``, ``uploads``, the chunked records): a format-3 pzq would read a
chunked message as an empty one, so it refuses a format-4 store; format-3 records are read as they are.
A change of any record's layout raises ``FORMAT``, teaches ``Catalog.load`` to read (or upgrade) the
older one, and comes with a test that opens a store written by the older pzq (tests/test_upgrade.py).
"""

from __future__ import annotations

import builtins
import dataclasses
import re
import struct

import msgpack

FORMAT = 4  # the store format this pzq writes and the newest it reads

# What reading a damaged record raises; anything else is a bug and propagates.
UNREADABLE = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    struct.error,
    UnicodeDecodeError,
    msgpack.UnpackException,
)
U64_MAX = (1 << 64) - 1


def whole(value: object, what: str, low: int = 0, high: int = U64_MAX) -> int:
    """``value`` if it is an int from ``low`` to ``high``; ValueError (an unreadable record) if not.
    A damaged record must be refused when read, not when its numbers reach a loop or a struct."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} {value!r:.40} is not a whole number from {low} to {high}")
    return value


KEY = struct.Struct(">QQ")
U64 = struct.Struct(">Q")
U32 = struct.Struct(">I")
# Accounted bytes per message beyond key and value: LMDB node headers, the deliveries entry and page
# slack. It keeps "store full" honest for tiny messages, whose overhead outweighs their bodies.
OVERHEAD = 64
HEX32 = re.compile(r"[0-9a-f]{32}")
QUEUE_TABLES = ("queues", "meta", "messages", "deliveries", "dead", "damaged", "bodies", "uploads")
# Tables of the side-table owners (schedules.py, groups.py, dedup_keys.py, bindings.py, emqp_jobs.py)
SIDE_TABLES = ("schedules", "groups", "leases", "produced", "mqks", "emqp_jobs")


@dataclasses.dataclass(slots=True)
class Message:
    """One stored message. ``frames`` are the body parts exactly as produced.

    Not frozen: a frozen dataclass costs a microsecond more per message on the hot path.
    """

    queue: str
    qid: int
    seq: int
    frames: list[bytes]
    enqueued_us: int
    expires_us: int = 0
    deliveries: int = 0
    meta: dict | None = None  # a protocol's own fields (eMQP: client, msgid, headers); others ignore it
    body: tuple | None = None  # where a big body's chunks are (store/bodies.py BodyRef), None when inline

    @property
    def id(self) -> str:
        """32 lowercase hex characters, unique in the store and stable across redeliveries."""
        return message_id(self.qid, self.seq)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A message moved aside after too many deliveries, an expired TTL, or a client's request."""

    message: Message
    reason: str
    dead_at_us: int


@dataclasses.dataclass
class QueueInfo:
    """Counters of one queue, kept in memory and written back with each commit."""

    name: str
    qid: int
    next_seq: int = 1
    count: int = 0
    bytes: int = 0
    dead_count: int = 0
    dead_bytes: int = 0
    implicit: bool = False  # made by a client's request, not named by the operator: expires when unused

    def pack(self) -> builtins.bytes:  # ("bytes" is also a field of this class)
        fields = [self.qid, self.next_seq, self.count, self.bytes, self.dead_count, self.dead_bytes, int(self.implicit)]
        return msgpack.packb(fields)

    @classmethod
    def unpack(cls, name: str, raw: builtins.bytes) -> QueueInfo:
        fields = msgpack.unpackb(raw)
        if len(fields) == 6:  # (formats 1 and 2: every queue was kept for ever, so it stays explicit)
            fields.append(0)
        qid, next_seq, count, size, dead_count, dead_bytes, flags = fields
        return cls(name, qid, next_seq, count, size, dead_count, dead_bytes, bool(whole(flags, "queue flags", 0, 1)))


def message_id(qid: int, seq: int) -> str:
    """The 32-hex id of message ``seq`` of queue ``qid``."""
    return f"{qid:016x}{seq:016x}"


def parse_message_id(text: str | bytes) -> tuple[int, int] | None:
    """(qid, seq) of a 32-hex message id, or None when it is not one."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not HEX32.fullmatch(text):
        return None
    return int(text[:16], 16), int(text[16:], 16)


def accounted(key: bytes, value: bytes | memoryview) -> int:
    """Bytes a record counts toward the store limit."""
    return len(key) + len(value) + OVERHEAD
