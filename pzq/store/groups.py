"""Consumer groups and their leases (leases.py), kept across restarts: the ``groups`` and ``leases``
tables.

    groups      qid u64 | group name (utf-8) -> msgpack [gid, base, end, deadline_us (, owner z85)]
    leases      gid u64 | lease seq u64      -> message seq u64 | deliveries when leased u32

A group's leases are its lease seqs ``base .. end-1``; a Spark offset is a lease seq. Neither table
is refused for room: acknowledging leases is how a full store drains.
"""

from __future__ import annotations

import struct

import msgpack

from pzq.store.side_table import SideTable, whole

_U64 = struct.Struct(">Q")
_LEASE_KEY = struct.Struct(">QQ")
_LEASE_VALUE = struct.Struct(">QI")

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


class LeaseRecords(SideTable[tuple[int, int], tuple[int, int]]):
    """(gid, lease seq) -> (message seq, deliveries when leased)."""

    NAME = "leases"
    COUNTED = False

    def key(self, k: tuple[int, int]) -> bytes:
        return _LEASE_KEY.pack(*k)

    def pack(self, v: tuple[int, int]) -> bytes:
        return _LEASE_VALUE.pack(*v)

    def unpack(self, key: bytes, value: bytes) -> tuple[tuple[int, int], tuple[int, int]]:
        gid, lseq = _LEASE_KEY.unpack(key)
        seq, deliveries = _LEASE_VALUE.unpack(value)
        return (gid, lseq), (seq, deliveries)

    def of_group(self, gid: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Every readable lease of group ``gid``, in lease order."""
        return self.items(_U64.pack(gid))

    def keys_of_group(self, gid: int) -> list[bytes]:
        return [key for key, _ in self.raw(_U64.pack(gid))]

    def between(self, gid: int, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """(lease seq, key) of the records group ``gid`` holds from ``lo`` to ``hi - 1``, as stored:
        a walk over what exists, so a range as wide as a damaged record's costs no more than its leases."""
        out: list[tuple[int, bytes]] = []
        start, stop = _LEASE_KEY.pack(gid, lo), _LEASE_KEY.pack(gid, hi)
        with self._env.reading() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(start):
                for key in cursor.iternext(keys=True, values=False):
                    if key >= stop:
                        break
                    out.append((_LEASE_KEY.unpack(key)[1], key))
        return out
