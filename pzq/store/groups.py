"""Consumer groups and their leases (leases.py), kept across restarts: the ``groups`` and ``leases``
tables.

    groups      qid u64 | group name (utf-8) -> msgpack [gid, base, end, deadline_us (, owner z85)]
    leases      gid u64 | first lease seq u64 -> first message seq u64 | count u32 | deliveries u32
                                                 (pzq 0.1.0 wrote: message seq u64 | deliveries u32,
                                                  a run of one, still read)

A group's leases are its lease seqs ``base .. end-1``; a Spark offset is a lease seq. One record is a
*run*: ``count`` messages with consecutive seqs, leased as consecutive lease seqs with the same
delivery count, so a lease of a fresh queue is one record however many messages it takes. Records
below ``base`` are acknowledged and wait to be deleted (a few thousand messages per turn). Neither
table is refused for room: acknowledging leases is how a full store drains.
"""

from __future__ import annotations

import struct

import msgpack

from pzq.store.layout import UNREADABLE, whole
from pzq.store.side_table import SideTable

_U64 = struct.Struct(">Q")
_LEASE_KEY = struct.Struct(">QQ")
_LEASE_VALUE = struct.Struct(">QII")
_OLD_LEASE_VALUE = struct.Struct(">QI")

GroupRecord = list  # [gid, base, end, deadline_us (, owner)]


class Groups(SideTable[tuple[int, str], GroupRecord]):
    NAME = "groups"
    COUNTED = False

    def key(self, k: tuple[int, str]) -> bytes:
        return _U64.pack(k[0]) + k[1].encode()

    def pack(self, v: GroupRecord) -> bytes:
        return msgpack.packb(v)

    def unpack(self, key: bytes, value: bytes) -> tuple[tuple[int, str], GroupRecord]:
        record = msgpack.unpackb(value)
        if not isinstance(record, list) or len(record) < 4:
            raise TypeError("not a group record")
        for field, name in zip(record[:4], ("gid", "base", "end", "deadline_us"), strict=True):
            whole(field, f"group {name}")
        if record[1] > record[2]:
            raise ValueError(f"group base {record[1]} is past its end {record[2]}")
        if len(record) > 4 and not isinstance(record[4], str):
            raise TypeError("a group owner is not a key")
        return (_U64.unpack(key[:8])[0], key[8:].decode()), record


class LeaseRecords(SideTable[tuple[int, int], tuple[int, int, int]]):
    """(gid, first lease seq) -> (first message seq, count, deliveries when leased)."""

    NAME = "leases"
    COUNTED = False

    def key(self, k: tuple[int, int]) -> bytes:
        return _LEASE_KEY.pack(*k)

    def pack(self, v: tuple[int, int, int]) -> bytes:
        return _LEASE_VALUE.pack(*v)

    def unpack(self, key: bytes, value: bytes) -> tuple[tuple[int, int], tuple[int, int, int]]:
        gid, lseq = _LEASE_KEY.unpack(key)
        if len(value) == _OLD_LEASE_VALUE.size:
            seq, deliveries = _OLD_LEASE_VALUE.unpack(value)
            return (gid, lseq), (seq, 1, deliveries)
        seq, count, deliveries = _LEASE_VALUE.unpack(value)
        if count == 0:
            raise ValueError("a lease run of no messages")
        whole(lseq + count, "lease run end")
        whole(seq + count, "lease run's last seq")
        return (gid, lseq), (seq, count, deliveries)

    def of_group(self, gid: int) -> list[tuple[tuple[int, int], tuple[int, int, int]]]:
        """Every readable run of group ``gid``, in lease order."""
        return self.items(_U64.pack(gid))

    def keys_of_group(self, gid: int) -> list[bytes]:
        return [key for key, _ in self.raw(_U64.pack(gid))]

    def covering(self, gid: int, lo: int, hi: int) -> list[tuple[int, tuple[int, int, int]]]:
        """(first lease seq, run) of every readable run of group ``gid`` that overlaps leases
        ``lo .. hi-1``, in lease order: a walk over the runs there are, from the one holding ``lo``."""
        out: list[tuple[int, tuple[int, int, int]]] = []
        prefix, start, stop = _U64.pack(gid), _LEASE_KEY.pack(gid, lo), _LEASE_KEY.pack(gid, hi)
        with self._env.reading() as txn:
            cursor = txn.cursor(db=self._db)
            # Start at the last record at or before lo: the run holding lo begins there, if any.
            if cursor.set_range(start):
                if cursor.key() != start and cursor.prev() and not cursor.key().startswith(prefix):
                    cursor.next()
            elif not cursor.last():
                return out
            for key, value in cursor:
                if key >= stop or not key.startswith(_U64.pack(gid)):
                    break
                try:
                    (_, lseq), run = self.unpack(key, value)
                except UNREADABLE:
                    continue  # (its leases read as gone)
                if lseq + run[1] > lo:
                    out.append((lseq, run))
        return out

    def first(self, gid: int) -> tuple[bytes, int, tuple[int, int, int] | None] | None:
        """(key, first lease seq, run or None if damaged) of group ``gid``'s lowest record, or None."""
        prefix = _U64.pack(gid)
        with self._env.reading() as txn:
            cursor = txn.cursor(db=self._db)
            if not cursor.set_range(prefix) or not cursor.key().startswith(prefix):
                return None
            key, value = cursor.key(), cursor.value()
        try:
            (_, lseq), run = self.unpack(key, value)
        except UNREADABLE:
            return key, _LEASE_KEY.unpack(key)[1] if len(key) == _LEASE_KEY.size else 0, None
        return key, lseq, run
