"""Writing into queues from Spark: each task stores its rows in chunks under keys that make a re-run
batch store nothing twice."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from pzq.spark.options import Options

log = logging.getLogger("pzq.spark")


@dataclasses.dataclass
class Written(WriterCommitMessage):
    """What one task stored: messages, and chunks the server already had (a re-run task)."""

    count: int
    duplicate_chunks: int


CHUNK_ROWS = 1000
CHUNK_BYTES = 4 << 20


class _Shards:
    """A task's PRODUCEs over a shard list (pzq.clients.cluster_api's ClusterApi): a chunk's rows of a queue
    go round its partitions from one its key picks, each shard's part stored under the chunk's key and
    the shard's name; a re-run chunk (same key, same rows) goes to the same places and is stored once."""

    def __init__(self, options: Options, shards):
        from pzq.clients.cluster_api import ClusterApi
        from pzq.spark.streams import cluster

        self.api = ClusterApi(cluster(options, shards), timeout_s=options.timeout_s)

    def produce(self, chunk: list[tuple[str, bytes]], key: str) -> dict:
        return self.api.produce(chunk, key=key)

    def close(self) -> None:
        self.api.close()


class QueueWriter(DataSourceWriter):
    """Stores every row as a message; a task returns once its rows are durable. With a shard list (the
    ``cluster`` option, else the endpoint's WHERE, found on the driver) each chunk's rows of a queue go
    to one of its partitions chosen by the chunk's key: a re-run writes the same places."""

    def __init__(self, options: Options, job: str):
        from pzq.spark.streams import shard_list

        self.options = options
        self.job = job  # made on the driver: every task of this write shares it
        self.shards = shard_list(options)  # (the file is read here, on the driver; executors get the list)

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
        target = self.options.client() if self.shards is None else _Shards(self.options, self.shards)
        try:

            def flush():
                nonlocal count, duplicates, chunk_no, size
                if chunk:
                    result = target.produce(chunk, key=f"{prefix}:{chunk_no}")
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
        finally:
            target.close()
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
