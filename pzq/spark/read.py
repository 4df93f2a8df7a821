"""Reading a queue into Spark: a reply's messages as rows (an Arrow batch), the seq ranges partitions
read, and the snapshot reader (a batch read that changes nothing)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from pzq.errors import ClientError
from pzq.spark.options import Options
from pzq.spark.streams import locate, shard_list

_UTC = datetime.UTC
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)


def _row(queue: str, item: list) -> tuple:
    seq, key, enqueued_us, deliveries, body = item
    return (queue, key, seq, body, _EPOCH + datetime.timedelta(microseconds=enqueued_us), deliveries)


# SCHEMA as Spark spells a StructType: a read with this schema hands Spark whole Arrow batches
_STRUCT = "struct<queue:string,key:string,seq:bigint,body:binary,enqueued_at:timestamp,deliveries:int>"


def arrow_schema():
    """The rows' schema as Arrow's (what ``page`` builds its batches with), for the readers of both modes."""
    import pyarrow as pa  # (pyspark's own dependency for Python data sources; imported where it runs)

    text, binary, stamp = pa.string(), pa.binary(), pa.timestamp("us", tz="UTC")  # (Spark's: UTC microseconds)
    names = ("queue", "key", "seq", "body", "enqueued_at", "deliveries")
    return pa.schema(zip(names, (text, text, pa.int64(), binary, stamp, pa.int32()), strict=True))


def columnar(schema) -> bool:
    """True when ``schema`` (a StructType) is SCHEMA, so that pages can go to Spark as Arrow batches."""
    return hasattr(schema, "simpleString") and schema.simpleString() == _STRUCT


def page(queue: str, messages: list[list], arrow) -> Iterator:
    """One reply's messages for Spark: one Arrow batch built column by column in C (``arrow``, the
    schema), rather than a tuple per row that pyspark's worker would convert field by field in Python
    (13 us a row on a loaded 2-core machine against 0.7 us: most of a read's client time); tuples when
    the query chose another schema."""
    if not messages:
        return
    if arrow is None:
        for item in messages:
            yield _row(queue, item)
        return
    import pyarrow as pa

    seqs, keys, enqueued_us, deliveries, bodies = zip(*messages, strict=True)  # (every message has the same 5 fields)
    yield pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(queue, pa.string()), len(seqs)),
            pa.array(keys, pa.string()),
            pa.array(seqs, pa.int64()),
            pa.array(bodies, pa.binary()),
            pa.array(enqueued_us, pa.int64()).view(pa.timestamp("us", tz="UTC")),
            pa.array(deliveries, pa.int32()),
        ],
        schema=arrow,
    )


@dataclasses.dataclass(frozen=True)
class SeqRange(InputPartition):
    """Seqs ``lo .. hi-1`` of a queue (lease seqs when streaming, queue seqs in a snapshot)."""

    lo: int
    hi: int


@dataclasses.dataclass(frozen=True)
class StreamRange(InputPartition):
    """Seqs ``lo .. hi-1`` of one stream of a sharded queue: ``queue`` on the shard at ``endpoint``."""

    endpoint: str
    queue: str
    lo: int
    hi: int


def spread(ranges: list[tuple[str, str, int, int]], n: int) -> list[StreamRange]:
    """Streams' ranges ``(endpoint, queue, lo, hi)`` as about ``n`` partitions in all, each stream's in
    shares of its size (at least one a stream with rows; one empty partition when none has any)."""
    ranges = [r for r in ranges if r[3] > r[2]]
    total = sum(hi - lo for _, _, lo, hi in ranges)
    out = []
    for endpoint, queue, lo, hi in ranges:
        share = max(1, round(n * (hi - lo) / total))
        out += [StreamRange(endpoint, queue, part.lo, part.hi) for part in split(lo, hi, share)]
    return out or [StreamRange("", "", 0, 0)]


def split(lo: int, hi: int, n: int) -> list[SeqRange]:
    """``lo .. hi-1`` in at most ``n`` consecutive ranges of nearly equal size, none empty."""
    n = max(1, min(n, hi - lo))
    size, extra = divmod(hi - lo, n)
    out, start = [], lo
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(SeqRange(start, end))
        start = end
    return out


class SnapshotReader(DataSourceReader):
    """A batch read of what a queue stores now, on one server or on every stream of a shard list (each
    (queue, shard) read whole: a shard that does not answer fails the read); changes nothing."""

    def __init__(self, options: Options, arrow: bool = False):
        self.options = options
        self.arrow = arrow  # read() yields Arrow batches (SCHEMA), else tuples

    def partitions(self) -> list[SeqRange] | list[StreamRange]:
        opts = self.options
        shards = shard_list(opts)
        if shards is None:  # one server, as before
            with opts.client() as api:
                info = api.info(opts.queue)
            return [SeqRange(0, 0)] if info["depth"] == 0 else split(info["first"], info["next"], opts.partitions)
        streams, missing = locate(opts, shards)
        if missing:
            raise ClientError(f"pzq snapshot of {opts.queue!r}: shard(s) {', '.join(missing)} did not answer")
        ranges = []
        for stream in streams:
            with opts.client(stream.endpoint) as api:
                info = api.info(stream.queue)
            if info["depth"]:
                ranges.append((stream.endpoint, stream.queue, info["first"], info["next"]))
        return spread(ranges, opts.partitions)

    def read(self, partition: SeqRange | StreamRange) -> Iterator[tuple]:  # type: ignore[override]
        opts = self.options
        if isinstance(partition, StreamRange):
            opts = dataclasses.replace(opts, endpoint=partition.endpoint, queue=partition.queue)
        if partition.lo >= partition.hi:
            return
        arrow = arrow_schema() if self.arrow else None
        with opts.client() as api:
            after = partition.lo
            while after < partition.hi:
                messages, after = api.snapshot(opts.queue, after, partition.hi, opts.fetch_size)
                yield from page(opts.queue, messages, arrow)
