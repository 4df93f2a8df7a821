"""What an API PRODUCE with a ``key`` stored, to drop its retries: the ``produced`` table.

    produced    dedup key (utf-8) -> msgpack [stored_us, count, [digest, ...]]

``digest`` is a 16-byte BLAKE2b of the request's messages (the last 16 kept): the same key with the
same messages within the dedup window is a retry. A record goes when its window has passed.
Native batch ids (pzq/gateways/native_batches.py) share the table under NATIVE_PREFIX, which the API's
keys may not use.
"""

from __future__ import annotations

from typing import NamedTuple

import msgpack

from pzq.store.layout import whole
from pzq.store.side_table import SideTable

NATIVE_PREFIX = "native:"  # the namespace of native batch ids


class Produced(NamedTuple):
    stored_us: int
    messages: int  # how many the PRODUCE stored
    digests: list[bytes]


class DedupKeys(SideTable[str, Produced]):
    NAME = "produced"

    def key(self, k: str) -> bytes:
        return k.encode()

    def pack(self, v: Produced) -> bytes:
        return msgpack.packb([v.stored_us, v.messages, v.digests])

    def unpack(self, key: bytes, value: bytes) -> tuple[str, Produced]:
        stored_us, count, digests = msgpack.unpackb(value)
        if not isinstance(digests, list) or not all(isinstance(d, bytes) for d in digests):
            raise TypeError("not a list of digests")
        return key.decode(), Produced(whole(stored_us, "stored_us"), whole(count, "count"), digests)
