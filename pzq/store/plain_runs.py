"""A take's run of plain messages read as columns: the records of a run (key, value) turned into their
keys, refs, enqueue times, frames and delivery counts with no object per message (``Runs.plain_run``
reads the records and hands them here).

A plain record is ``[enqueued µs, 0, [frames]]`` (no TTL, no meta, the body inline): what every native
and API message without a TTL is. ``plain_columns`` reads a whole run at once, each step in C, when
every record is plain and none is in flight (the usual run); ``plain_rows`` reads one at a time and
stops before the first record that needs a closer look, which the general path (``scan``) then reads.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Container
from operator import itemgetter
from typing import NamedTuple

import msgpack

from pzq.store.layout import KEY, U32, U64, U64_MAX
from pzq.store.pending import PendingCounts

PLAIN = 0x93  # a record's first byte when it is [enqueued µs, expires µs, frames]: no meta, body inline
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


class PlainRun(NamedTuple):
    """A run of plain messages as ``plain_run`` reads them, column by column: no object per message."""

    keys: list[bytes]  # each one's record key (KEY: qid, seq)
    refs: list[tuple[int, int]]  # (qid, seq)
    enqueued: list[int]  # µs
    frames: list[list[bytes]]
    deliveries: list[int] | None  # how often each was delivered before; None: none was (the usual run)


NO_RUN = PlainRun([], [], [], [], None)

# A plain record's first bytes with no TTL: ``[enqueued_us, 0, [frames]]`` (msgpack: a 3-array, a
# non-negative int, 0, an array header), what every native and API message without a TTL is
# (messages.native_record)
PLAIN_NO_TTL = re.compile(rb"\x93(?:[\x00-\x7f]|\xcc.|\xcd..|\xce.{4}|\xcf.{8})\x00[\x90-\x9f\xdc\xdd]", re.S)


def stored_count(counts, key: bytes) -> int:
    """A delivery count from the deliveries table (``counts``: its lookup, None when it holds none); a
    damaged one reads as 0, as ``scan`` reads it."""
    raw = counts(key) if counts is not None else None
    return U32.unpack(raw)[0] if raw and len(raw) == 4 else 0


def plain_columns(
    qid: int, records: list, max_bytes: int, skip: Container[tuple[int, int]], counts, pending: PendingCounts
) -> tuple[PlainRun, int, bool] | None:
    """``plain_run`` of ``records`` (key, value), each step over the whole run in C, when every record
    is plain and none is in flight (the usual run); None otherwise (``plain_rows`` reads them)."""
    keys = list(map(_first, records))
    end = bisect.bisect_left(keys, U64.pack(qid + 1)) if qid < U64_MAX else len(keys)  # (this queue's)
    if end < len(keys):
        del keys[end:], records[end:]
    values = list(map(_second, records))
    # ([enqueued µs, 0, [frames]] by their first bytes, the whole of each by unpackb, frames all bin)
    if not values or not all(map(PLAIN_NO_TTL.match, values)):
        return None
    try:
        rows = list(map(msgpack.unpackb, values))
    except (ValueError, msgpack.UnpackException):  # (one to read closely: the rows' way)
        return None
    enqueued, frames = list(map(_first, rows)), list(map(_third, rows))
    if not set(map(type, itertools.chain.from_iterable(frames))) <= {bytes}:
        return None
    refs = list(map(KEY.unpack, keys))
    if any(map(skip.__contains__, refs)):
        return None
    if max_bytes < sum(map(len, values)):  # (the record that reaches max_bytes is the last)
        cut = bisect.bisect_left(list(itertools.accumulate(map(len, values))), max_bytes) + 1
        del keys[cut:], refs[cut:], enqueued[cut:], frames[cut:]
    counted = list(map(pending.get, keys))
    deliveries: list[int] | None = None
    if counted.count(None) != len(counted) or counts is not None:
        deliveries = [
            count[0] if count is not None else stored_count(counts, key)
            for key, count in zip(keys, counted, strict=True)
        ]
    return PlainRun(keys, refs, enqueued, frames, deliveries), refs[-1][1] + 1, False


def plain_rows(
    qid: int,
    from_seq: int,
    records: list,
    max_bytes: int,
    skip: Container[tuple[int, int]],
    counts,
    pending: PendingCounts,
) -> tuple[PlainRun, int, bool]:
    """``plain_run`` of ``records`` a record at a time: stops before the first that needs a look."""
    prefix, unpack_key, unpackb = U64.pack(qid), KEY.unpack, msgpack.unpackb
    out = PlainRun([], [], [], [], [])
    size, seq, nxt, stopped = 0, from_seq, from_seq, False
    for key, value in records:
        if size >= max_bytes or not key.startswith(prefix):
            break
        seq = unpack_key(key)[1]
        if not value or value[0] != PLAIN:
            stopped = True
            break
        try:
            record = unpackb(value)
        except (ValueError, msgpack.UnpackException):
            stopped = True
            break
        frames = record[2]
        if (
            record[1] != 0
            or type(record[0]) is not int
            or type(frames) is not list
            or not (len(frames) == 1 and type(frames[0]) is bytes or all(type(f) is bytes for f in frames))
        ):  # (a TTL, or a record to read closely: ``scan`` takes it, or sets it aside)
            stopped = True
            break
        nxt = seq + 1
        if (qid, seq) in skip:
            continue
        count = pending.get(key)
        out.keys.append(key)
        out.refs.append((qid, seq))
        out.enqueued.append(record[0])
        out.frames.append(frames)
        out.deliveries.append(count[0] if count is not None else stored_count(counts, key))  # type: ignore[union-attr]
        size += len(value)
    return out, seq if stopped else nxt, stopped
