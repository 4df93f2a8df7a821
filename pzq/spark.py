"""pzq as a Spark data source (format ``pzq``): queues as sources and sinks of Spark pipelines.

The only module of pzq that imports pyspark (``pip install pzq[spark]``). Register it once per session::

    from pzq.spark import register
    register(spark)
    events = (spark.readStream.format("pzq").option("endpoint", "tcp://127.0.0.1:11133")
              .option("queue", "events").option("group", "hourly-report").load())

Reading (streaming): each micro-batch is a range of the group's *lease seqs* (see pzq/leases.py).
``latestOffset`` leases the next messages on the server (durably, idempotently), ``read`` fetches a
leased range on an executor (replayable: a re-run batch gets the same rows), and ``commit`` - which
Spark calls once the batch is in its checkpoint, when it plans the next one - acknowledges them, which
deletes them from the queue. So the guarantee is at-least-once: a message leaves the queue only after
the batch that used it was committed; a batch that failed or was never committed is read again. A full
batch's plan leases the next batch ahead while Spark reads it; a batch Spark waits for is at most
FIRST_BATCH, the rest of a backlog leased ahead meanwhile (docs/spark.md, "Delivery guarantee").

Reading (batch): ``spark.read.format("pzq")`` is a snapshot of what a queue stores, read without
changing anything (no lease, no delivery count).

Writing (batch and streaming): rows with a ``body`` column (binary or string) and an optional
``queue`` column (else the ``queue`` option). Each task stores its rows in chunks and returns only
when the server has them on disk. Each chunk carries a key made of the query id, batch id, partition
and chunk number, and the server stores a key once (within ``--api-dedup-window``), so a batch Spark
runs again is not stored twice: exactly-once into the queue when the re-run produces the same rows.

Rows read: queue string, key string (the 32-hex message id, stable across redeliveries), seq long
(the lease seq when streaming, the queue seq in a snapshot), body binary (the message's frames
joined), enqueued_at timestamp, deliveries int (deliveries including this one; 0 in a snapshot).

Options: endpoint (tcp://127.0.0.1:11133), queue (default), group (spark), maxMessagesPerBatch (100000),
numPartitions (2), fetchSize (2000), timeout (seconds a call may take, server restarts included: 120);
for a batch write, dedupKey names the write so that writing it again stores nothing (use the batch id
inside ``foreachBatch``: ``.option("dedupKey", f"my-job:{batch_id}")``); for a CURVE server,
curveClientKey and curveServerKey (key files present on every node).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

try:  # admission control (latestOffset(start, limit)) came with pyspark 4.2
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
except ImportError:  # pragma: no cover - older pyspark calls latestOffset() without arguments
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

log = logging.getLogger("pzq.spark")

SCHEMA = "queue string, key string, seq long, body binary, enqueued_at timestamp, deliveries int"
# Messages of one micro-batch at most. Leases are ranges on the server (one record and one held range
# per run of consecutive seqs), so a big batch costs it no memory; what it costs is replay time when a
# batch fails, and rows Spark holds at once if the query caches them.
MAX_BATCH = 1_000_000
# Messages of a batch leased while Spark waits (no lease ahead made it ready: a query's first batch, or
# the first after batches that were not full): about 0.1 s of the server's work, so that Spark reads them
# while the rest of a backlog is leased ahead, rather than waiting for a whole maxMessagesPerBatch.
FIRST_BATCH = 100_000
FETCHES = 2  # FETCH requests a partition's reader has in flight (the API's memory bound admits two big replies)
_UTC = datetime.UTC
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)


@dataclasses.dataclass(frozen=True)
class Options:
    """The data source's options, checked once on the driver."""

    endpoint: str = "tcp://127.0.0.1:11133"
    queue: str = "default"
    group: str = "spark"
    max_per_batch: int = 100_000
    partitions: int = 2
    fetch_size: int = 2000
    timeout_s: float = 120.0
    dedup_key: str = ""
    curve: tuple[str, str] | None = None  # (client .key_secret file, server .key file), on every node

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        def number(name: str, default, kind=int):
            value = options.get(name)
            try:
                parsed = default if value is None else kind(value)
            except ValueError:
                raise ValueError(f"pzq option {name}: {value!r} is not a number") from None
            if parsed <= 0:
                raise ValueError(f"pzq option {name}: must be positive, got {parsed}")
            return parsed

        return cls(
            endpoint=options.get("endpoint") or cls.endpoint,
            queue=options.get("queue") or cls.queue,
            group=options.get("group") or cls.group,
            max_per_batch=min(number("maxMessagesPerBatch", cls.max_per_batch), MAX_BATCH),
            partitions=number("numPartitions", cls.partitions),
            fetch_size=min(number("fetchSize", cls.fetch_size), 10_000),
            timeout_s=number("timeout", cls.timeout_s, float),
            dedup_key=options.get("dedupKey") or "",
            curve=_curve(options.get("curveClientKey"), options.get("curveServerKey")),
        )

    def client(self):
        from pzq.clients.api import ApiClient  # imported where it runs: executors import pzq lazily

        return ApiClient(self.endpoint, timeout_s=self.timeout_s, curve=self.curve)


def _curve(client_key: str | None, server_key: str | None) -> tuple[str, str] | None:
    if bool(client_key) != bool(server_key):
        raise ValueError("pzq options curveClientKey and curveServerKey: give both or neither")
    return (client_key, server_key) if client_key and server_key else None


def _row(queue: str, item: list) -> tuple:
    seq, key, enqueued_us, deliveries, body = item
    return (queue, key, seq, body, _EPOCH + datetime.timedelta(microseconds=enqueued_us), deliveries)


# SCHEMA as Spark spells a StructType: a read with this schema hands Spark whole Arrow batches
_STRUCT = "struct<queue:string,key:string,seq:bigint,body:binary,enqueued_at:timestamp,deliveries:int>"


def _arrow_schema():
    import pyarrow as pa  # (pyspark's own dependency for Python data sources; imported where it runs)

    text, binary, stamp = pa.string(), pa.binary(), pa.timestamp("us", tz="UTC")  # (Spark's: UTC microseconds)
    names = ("queue", "key", "seq", "body", "enqueued_at", "deliveries")
    return pa.schema(zip(names, (text, text, pa.int64(), binary, stamp, pa.int32()), strict=True))


def columnar(schema) -> bool:
    """True when ``schema`` (a StructType) is SCHEMA, so that pages can go to Spark as Arrow batches."""
    return hasattr(schema, "simpleString") and schema.simpleString() == _STRUCT


def _page(queue: str, messages: list[list], arrow) -> Iterator:
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


def _lease(api, options: Options, after: int, max_n: int, stopping: threading.Event | None, durable=True) -> int:
    """Lease ``after .. after+max_n-1`` as far as messages are ready; returns the range's end. The server
    answers a shorter range past a call's work budget: call again from its end until nothing more comes.
    Every call but the last asks with ``durable`` 0 (its reply waits for no fsync); the last, from
    ``after``, waits for the commit that carries them all, so that an end is handed on only once its
    leases are on disk with one fsync, not one a call (a range of 1,000,000 is about 150 calls). Not
    ``durable``: no reply waits for a commit (the lease ahead; the plan that uses it asks durably)."""
    end = after
    while end < after + max_n and not (stopping is not None and stopping.is_set()):
        _, more = api.lease(options.queue, options.group, end, after + max_n - end, durable=False)
        if more <= end:
            break  # nothing more is ready
        end = more
    if durable and end > after:  # (nothing leased: the end is ``after``, on disk already)
        _, end = api.lease(options.queue, options.group, after, max_n)  # (the same leases, and any come since)
    return end


@dataclasses.dataclass(frozen=True)
class SeqRange(InputPartition):
    """Seqs ``lo .. hi-1`` of a queue (lease seqs when streaming, queue seqs in a snapshot)."""

    lo: int
    hi: int


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


class PzqDataSource(DataSource):
    """Format ``pzq``: a streaming and batch source and sink of pzq queues."""

    @classmethod
    def name(cls) -> str:
        return "pzq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return SnapshotReader(Options.parse(self.options), columnar(schema))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return LeaseStreamReader(Options.parse(self.options), columnar(schema))

    def writer(self, schema, overwrite: bool) -> DataSourceWriter:
        return QueueWriter(Options.parse(self.options), uuid.uuid4().hex)

    def streamWriter(self, schema, overwrite: bool) -> DataSourceStreamWriter:
        return QueueStreamWriter(Options.parse(self.options), uuid.uuid4().hex)


def register(spark) -> None:
    """Make ``format("pzq")`` known to ``spark`` (a SparkSession)."""
    spark.dataSource.register(PzqDataSource)


# -- reading ------------------------------------------------------------------------------------------


class LeaseStreamReader(DataSourceStreamReader):
    """Micro-batches over a consumer group's leases. The driver's calls share one API client."""

    def __init__(self, options: Options, arrow: bool = False):
        self.options = options
        self.arrow = arrow  # read() yields Arrow batches (SCHEMA), else tuples
        self._client = None
        self._last_end: int | None = None
        self._ahead: threading.Thread | None = None  # leasing the next batch while this one is read
        self._planned: tuple[int, int] | None = None  # (from, how many) the lease ahead leases
        self._leased_to: int | None = None  # the group's leases are made up to here (None: not asked yet)
        self._stopping = threading.Event()

    def __getstate__(self) -> dict:  # executors get a copy without the driver's socket and thread
        return {**self.__dict__, "_client": None, "_ahead": None, "_stopping": None}

    def _api(self):
        if self._client is None:
            self._client = self.options.client()
        return self._client

    def initialOffset(self) -> dict:
        base, end = self._api().offsets(self.options.queue, self.options.group)
        if self._leased_to is None:  # a new query: its first batch is leased while Spark prepares to plan it
            self._leased_to = end  # (Spark asks again later: once is enough)
            self._lease_ahead(base, min(self.options.max_per_batch, self._ready(base)))
        return {"seq": base}

    def _ready(self, after: int) -> int:
        """How many a plan from ``after`` leases while Spark waits: FIRST_BATCH, or as many as are leased
        already (by the query's run before a restart on its checkpoint, or by an availableNow plan)."""
        if self._leased_to is None:
            self._leased_to = self._api().offsets(self.options.queue, self.options.group)[1]
        return max(FIRST_BATCH, self._leased_to - after)

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.options.max_per_batch) if ReadMaxRows is not None else None

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        if start is not None:
            after = start["seq"]
        elif self._last_end is not None:
            after = self._last_end
        else:
            after = self._api().offsets(self.options.queue, self.options.group)[0]
        # availableNow: what is there is the run's end, leased now; Spark then plans its batches within it
        every = ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable)
        max_n = MAX_BATCH if every else self.options.max_per_batch
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            rows = getattr(limit, "max_rows", None) or getattr(limit, "maxRows", 0)  # (named both ways by version)
            max_n = min(int(rows or 0), MAX_BATCH)
        planned, self._planned = self._planned, None
        self._wait_ahead()  # (its leases are this batch's: the calls below find them made)
        if every:
            cap = max_n
        elif planned is not None and planned[0] == after:
            cap = min(max_n, planned[1])  # (what the lease ahead made ready)
        else:  # (what Spark waits for: a first part, while the rest is leased ahead)
            cap = min(max_n, self._ready(after))
        end = _lease(self._api(), self.options, after, cap, None)
        self._last_end = end
        if every:
            self._leased_to = max(self._leased_to or 0, end)  # (the run's batches: each planned whole)
        elif end - after >= cap:  # (a full batch: more is waiting)
            self._lease_ahead(end, max_n)
        return {"seq": end}

    def _lease_ahead(self, after: int, max_n: int) -> None:
        """Lease the next batch on a connection of its own while Spark reads this one, so that planning
        it finds its leases made (a full batch says more is waiting). LEASE is idempotent from ``after``:
        the next ``latestOffset`` asks for the same range and gets these leases, here or after a restart.
        What it holds is the group's next batch: no other consumer gets it, and a query that stops for
        good gives it back with the rest of its leases (``--lease-timeout``)."""
        options, stopping = self.options, self._stopping
        self._planned = (after, max_n)

        def run() -> None:
            try:
                with options.client() as api:  # (a client is not thread-safe: one of its own)
                    # (no fsync a reply: each held the executors' FETCHes; the next plan's LEASE is durable)
                    _lease(api, options, after, max_n, stopping, durable=False)
            except Exception as exc:  # noqa: BLE001 - the next latestOffset leases what is missing itself
                log.info("pzq group %r: leasing ahead stopped: %s", options.group, exc)

        self._ahead = threading.Thread(target=run, name="pzq-lease-ahead", daemon=True)
        self._ahead.start()

    def _wait_ahead(self, timeout: float | None = None) -> None:
        if self._ahead is not None:
            self._ahead.join(timeout)
            self._ahead = None

    def partitions(self, start: dict, end: dict) -> list[SeqRange]:
        return split(start["seq"], end["seq"], self.options.partitions)

    def read(self, partition: SeqRange) -> Iterator[tuple]:  # type: ignore[override]  # (our partitions)
        opts = self.options
        arrow = _arrow_schema() if self.arrow else None
        with opts.client() as api:
            # (the next page is read on the server while this one is turned into rows)
            pages = api.fetch_pages(opts.queue, opts.group, partition.lo, partition.hi, opts.fetch_size, FETCHES)
            for messages, gone in pages:
                if gone:
                    log.warning(
                        "pzq group %r: %d message(s) of leases %d..%d are gone (their lease expired "
                        "and they went back to queue %r)",
                        opts.group,
                        gone,
                        partition.lo,
                        partition.hi - 1,
                        opts.queue,
                    )
                yield from _page(opts.queue, messages, arrow)

    def commit(self, end: dict) -> None:
        self._api().ack_upto(self.options.queue, self.options.group, end["seq"])

    def stop(self) -> None:
        if self._stopping is not None:  # (None in a copy made for an executor)
            self._stopping.set()
        self._wait_ahead(5.0)  # (between two calls it stops at once; a daemon thread cannot outlive the driver)
        if self._client is not None:
            self._client.close()
            self._client = None


class SnapshotReader(DataSourceReader):
    """A batch read of what a queue stores now; changes nothing on the server."""

    def __init__(self, options: Options, arrow: bool = False):
        self.options = options
        self.arrow = arrow  # read() yields Arrow batches (SCHEMA), else tuples

    def partitions(self) -> list[SeqRange]:
        with self.options.client() as api:
            info = api.info(self.options.queue)
        if info["depth"] == 0:
            return [SeqRange(0, 0)]
        return split(info["first"], info["next"], self.options.partitions)

    def read(self, partition: SeqRange) -> Iterator[tuple]:  # type: ignore[override]  # (our partitions)
        opts = self.options
        if partition.lo >= partition.hi:
            return
        arrow = _arrow_schema() if self.arrow else None
        with opts.client() as api:
            after = partition.lo
            while after < partition.hi:
                messages, after = api.snapshot(opts.queue, after, partition.hi, opts.fetch_size)
                yield from _page(opts.queue, messages, arrow)


# -- writing ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Written(WriterCommitMessage):
    """What one task stored: messages, and chunks the server already had (a re-run task)."""

    count: int
    duplicate_chunks: int


CHUNK_ROWS = 1000
CHUNK_BYTES = 4 << 20


class QueueWriter(DataSourceWriter):
    """Stores every row as a message; a task returns once its rows are durable."""

    def __init__(self, options: Options, job: str):
        self.options = options
        self.job = job  # made on the driver: every task of this write shares it

    def _key_prefix(self, ctx) -> str:
        if self.options.dedup_key:  # the caller names this write (e.g. foreachBatch's batch id): re-runs dedup
            return f"spark:{self.options.dedup_key}:{ctx.partitionId()}"
        return f"spark:{self.job}:{ctx.partitionId()}"

    def write(self, rows: Iterator) -> Written:
        ctx = TaskContext.get()
        prefix = self._key_prefix(ctx) if ctx is not None else f"spark:{uuid.uuid4().hex}"
        default_queue = self.options.queue
        count = duplicates = chunk_no = size = 0
        chunk: list[tuple[str, bytes]] = []
        with self.options.client() as api:

            def flush():
                nonlocal count, duplicates, chunk_no, size
                if chunk:
                    result = api.produce(chunk, key=f"{prefix}:{chunk_no}")
                    count += result["count"]
                    duplicates += bool(result["duplicate"])
                    chunk_no += 1
                    chunk.clear()
                    size = 0

            for row in rows:
                fields = row.asDict()
                body = fields.get("body")
                if body is None:
                    raise ValueError("pzq sink: every row needs a non-null 'body' column")
                body = body.encode() if isinstance(body, str) else bytes(body)
                chunk.append((fields.get("queue") or default_queue, body))
                size += len(body)
                if len(chunk) >= CHUNK_ROWS or size >= CHUNK_BYTES:
                    flush()
            flush()
        return Written(count, duplicates)

    def commit(self, messages: list) -> None:
        total = sum(m.count for m in messages if m is not None)
        log.info("pzq sink: %d message(s) stored", total)

    def abort(self, messages: list) -> None:
        # What tasks stored is durable and may already be consumed: it cannot be taken back.
        log.warning("pzq sink: the write was aborted; messages its finished tasks stored stay in the queue")


class QueueStreamWriter(QueueWriter, DataSourceStreamWriter):
    """The sink of a streaming query; chunk keys name the query and batch, so re-runs dedup."""

    def _key_prefix(self, ctx) -> str:
        query = ctx.getLocalProperty("sql.streaming.queryId")
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        if query and batch is not None:
            return f"spark:{query}:{batch}:{ctx.partitionId()}"
        return f"spark:{self.job}:{uuid.uuid4().hex}:{ctx.partitionId()}"  # no ids: at-least-once

    def commit(self, messages: list, batchId: int) -> None:  # type: ignore[override]  # (the stream writer's)
        total = sum(m.count for m in messages if m is not None)
        log.info("pzq sink: batch %d: %d message(s) stored", batchId, total)

    def abort(self, messages: list, batchId: int) -> None:  # type: ignore[override]  # (the stream writer's)
        log.warning("pzq sink: batch %d aborted; messages its finished tasks stored stay in the queue", batchId)
