"""eMQP jobs handed to a worker and not yet replied to, kept across restarts: the ``emqp_jobs`` table.

    emqp_jobs   qid u64 | seq u64 -> msgpack [msgid, worker identity (bytes), CURVE key (z85) | nil]

After a restart such a job waits for its REPLY (the worker outlives the broker) before it runs again.
Never refused for room: without the record, a job would run twice.
"""

from __future__ import annotations

import struct

import msgpack

from pzq.store.side_table import SideTable

_KEY = struct.Struct(">QQ")

Job = tuple[str, bytes, "str | None"]  # (msgid, worker identity, its CURVE key)


class EmqpJobs(SideTable[tuple[int, int], Job]):
    NAME = "emqp_jobs"
    COUNTED = False

    def key(self, k: tuple[int, int]) -> bytes:
        return _KEY.pack(*k)

    def pack(self, v: Job) -> bytes:
        return msgpack.packb(list(v))

    def unpack(self, key: bytes, value: bytes) -> tuple[tuple[int, int], Job]:
        msgid, identity, user = msgpack.unpackb(value)
        if not isinstance(msgid, str) or not isinstance(identity, bytes) or not (user is None or isinstance(user, str)):
            raise TypeError("not an eMQP job record")
        qid, seq = _KEY.unpack(key)
        return (qid, seq), (msgid, identity, user)
