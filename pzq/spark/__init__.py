"""pzq as a Spark data source (format ``pzq``): queues as sources and sinks of Spark pipelines.

The only package of pzq that imports pyspark (``pip install pzq[spark]``). Register it once per session::

    from pzq.spark import register
    register(spark)
    events = (spark.readStream.format("pzq").option("endpoint", "tcp://127.0.0.1:11133")
              .option("queue", "events").option("group", "hourly-report").load())

Reading (streaming, ``stream``): each micro-batch is a range of the group's *lease seqs* (pzq/leases/).
``latestOffset`` leases the next messages on the server (durably, idempotently), ``read`` fetches a
leased range on an executor (replayable: a re-run batch gets the same rows), and ``commit`` - which
Spark calls once the batch is in its checkpoint, when it plans the next one - acknowledges them, which
deletes them from the queue. So the guarantee is at-least-once: a message leaves the queue only after
the batch that used it was committed; a batch that failed or was never committed is read again. A full
batch's plan leases the next batch ahead while Spark reads it; a batch Spark waits for is at most
FIRST_BATCH, the rest of a backlog leased ahead meanwhile (docs/spark.md, "Delivery guarantee").

Reading (batch, ``read``): ``spark.read.format("pzq")`` is a snapshot of what a queue stores, read without
changing anything (no lease, no delivery count).

Writing (batch and streaming, ``sink``): rows with a ``body`` column (binary or string) and an optional
``queue`` column (else the ``queue`` option). Each task stores its rows in chunks and returns only
when the server has them on disk. Each chunk carries a key made of the query id, batch id, partition
and chunk number, and the server stores a key once (within ``--api-dedup-window``), so a batch Spark
runs again is not stored twice: exactly-once into the queue when the re-run produces the same rows.

Rows read: queue string, key string (the 32-hex message id, stable across redeliveries), seq long
(the lease seq when streaming, the queue seq in a snapshot), body binary (the message's frames
joined), enqueued_at timestamp, deliveries int (deliveries including this one; 0 in a snapshot).

Options (``options``): endpoint (tcp://127.0.0.1:11133), queue (default), group (spark), maxMessagesPerBatch (500000),
numPartitions (2), fetchSize (2000), timeout (seconds a call may take, server restarts included: 120);
for a batch write, dedupKey names the write so that writing it again stores nothing (use the batch id
inside ``foreachBatch``: ``.option("dedupKey", f"my-job:{batch_id}")``); for a CURVE server,
curveClientKey and curveServerKey (key files present on every node); across shards, cluster (the shard
list file, read on the driver; else the endpoint's WHERE says), shardTimeout (5 s: a shard slower than
this while a batch is planned keeps its offset) and queuePartitions (where servers predate WHERE).

Across shards (``sharded``, ``streams``): every (queue, shard) of a queue is a stream with offsets of its
own (``{"streams": {"shard/queue": seq}}``), read as one source; the sink routes each chunk round its
queue's partitions from one its dedup key picks, so a re-run writes the same places (docs/spark.md, "Shards").
"""

from __future__ import annotations

import uuid

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from pzq.spark.options import MAX_BATCH, SCHEMA, Options
from pzq.spark.read import SeqRange, SnapshotReader, StreamRange, columnar, split
from pzq.spark.sharded import SourceReader
from pzq.spark.sink import QueueStreamWriter, QueueWriter, Written
from pzq.spark.stream import LeaseStreamReader

__all__ = [
    "MAX_BATCH",
    "SCHEMA",
    "LeaseStreamReader",
    "Options",
    "PzqDataSource",
    "QueueStreamWriter",
    "QueueWriter",
    "SeqRange",
    "SnapshotReader",
    "SourceReader",
    "StreamRange",
    "Written",
    "columnar",
    "register",
    "split",
]


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
        return SourceReader(Options.parse(self.options), columnar(schema))

    def writer(self, schema, overwrite: bool) -> DataSourceWriter:
        return QueueWriter(Options.parse(self.options), uuid.uuid4().hex)

    def streamWriter(self, schema, overwrite: bool) -> DataSourceStreamWriter:
        return QueueStreamWriter(Options.parse(self.options), uuid.uuid4().hex)


def register(spark) -> None:
    """Make ``format("pzq")`` known to ``spark`` (a SparkSession)."""
    spark.dataSource.register(PzqDataSource)
