"""Native message keys of a whole run, both ways, with no Python statement per key: the keys frame of a
DELIVER and the refs an ACK's keys name.

A key is ``native.message_key``'s "<16 digits of the enqueue µs>|<16 hex qid><16 hex seq>" (49 bytes):
its 32 hex digits are the 16 bytes of (qid, seq) as two big-endian u64, so a run's keys are one
``hexlify`` of their ids joined, and an ACK's refs one ``unhexlify`` of its keys' digits joined. Anything
else (a key pzq did not make, an enqueue time past 16 digits) is read or written a key at a time, as
``native.ref_of_key`` and ``message_key`` do.
"""

from __future__ import annotations

import binascii
import itertools
import operator
import struct
from collections.abc import Sequence

import msgpack

from pzq.gateways.contract import Ref
from pzq.gateways.native import ref_of_key
from pzq.protocols import native_consume as wire

_ID = struct.Struct(">QQ")  # a message id's two numbers (qid, seq): its key's 32 hex digits are these bytes
_TAIL = slice(17, 49)  # the hex digits of a key pzq made


def refs_of_keys(keys: Sequence[bytes]) -> list[Ref | None]:
    """``ref_of_key`` of each key (an ACK's run). The keys pzq made ("<16 digits>|<32 lowercase hex>"):
    all of them read at once, every step over the run in C; a run with any other key, as ref_of_key
    reads each."""
    n = len(keys)
    if n and set(map(len, keys)) == {49} and (joined := b"".join(keys))[16::49] == b"|" * n:
        tails = b"".join(map(operator.getitem, keys, itertools.repeat(_TAIL, n)))  # type: ignore[arg-type]
        if tails.isalnum() and tails == tails.lower():  # (then only hex digits get past unhexlify)
            try:
                return list(_ID.iter_unpack(binascii.unhexlify(tails)))
            except binascii.Error:
                pass
        del joined
    return list(map(ref_of_key, keys))


def message_keys(ids: Sequence[bytes], enqueued: Sequence[int]) -> bytes:
    """The keys frame of a DELIVER of the messages of ``ids`` (each 16 bytes: qid, seq), enqueued at
    ``enqueued``: each ``native.message_key`` ("<16 digits of its enqueue µs>|<16 hex qid><16 hex seq>"),
    packed with no object per key: the messages of a producer's batch share their enqueue time, so a
    run of them is one group of ``wire.pack_keys``."""
    groups, start = [], 0
    for at, same in itertools.groupby(enqueued):  # (a group per run of one enqueue time: usually one or two)
        n = len(list(same))
        groups.append((b"%016d|" % at, binascii.hexlify(b"".join(ids[start : start + n]), b"|", _ID.size), n))
        start += n
    if all(len(prefix) == 17 for prefix, _, _ in groups):
        return wire.pack_keys(groups)
    refs = map(_ID.unpack, ids)
    return msgpack.packb([b"%016d|%016x%016x" % (at, *ref) for ref, at in zip(refs, enqueued, strict=True)])
