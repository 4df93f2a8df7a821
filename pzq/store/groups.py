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

from pzq.store.side_table import SideTable

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
        if not isinstance(record, list) or len(record) < 4 or not all(isinstance(n, int) for n in record[:4]):
            raise TypeError("not a group record")
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
