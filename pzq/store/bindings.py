"""MQKS queues' bindings, kept across restarts: the ``mqks`` table.

    mqks        queue name (utf-8) -> msgpack [[event, ...], unused seconds | nil, owned]

``unused``: the queue is deleted after this many seconds without a consumer (--delete-queue-when-
unused). ``owned``: MQKS made the queue, so deleting it is MQKS's to do (bindings written before
pzq 0.3 have no such field and count as owned).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgpack

from pzq.store.side_table import SideTable


@dataclasses.dataclass(slots=True)
class Binding:
    """An MQKS queue's durable settings. Its events are kept as a tuple: a tuple of strings is not a
    container the garbage collector walks (a list is), and a million bindings are kept in memory."""

    events: Sequence[str]
    unused: float | None = None  # --delete-queue-when-unused seconds
    owned: bool = True  # the queue did not exist before MQKS bound it: MQKS may delete it

    def __post_init__(self) -> None:
        self.events = tuple(self.events)


class Bindings(SideTable[str, Binding]):
    NAME = "mqks"

    def key(self, k: str) -> bytes:
        return k.encode()

    def pack(self, v: Binding) -> bytes:
        return msgpack.packb([v.events, v.unused, v.owned])

    def unpack(self, key: bytes, value: bytes) -> tuple[str, Binding]:
        events, unused, *rest = msgpack.unpackb(value)
        if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
            raise TypeError("events are not a list of names")
        if unused is not None and not isinstance(unused, (int, float)):
            raise TypeError("the unused delay is not a number")
        return key.decode(), Binding(events, unused, bool(rest[0]) if rest else True)
