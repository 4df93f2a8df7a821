"""The Spark data source's options, checked once on the driver, and the schema of the rows it reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

SCHEMA = "queue string, key string, seq long, body binary, enqueued_at timestamp, deliveries int"
# Messages of one micro-batch at most. Leases are ranges on the server (one record and one held range
# per run of consecutive seqs), so a big batch costs it no memory; what it costs is replay time when a
# batch fails, and rows Spark holds at once if the query caches them.
MAX_BATCH = 1_000_000


@dataclasses.dataclass(frozen=True)
class Options:
    """The data source's options, checked once on the driver."""

    endpoint: str = "tcp://127.0.0.1:11133"
    queue: str = "default"
    group: str = "spark"
    max_per_batch: int = 500_000
    partitions: int = 2
    fetch_size: int = 2000
    timeout_s: float = 120.0
    dedup_key: str = ""
    cluster: str = ""  # the shard list's file, read on the driver ("": ask the endpoint's WHERE)
    shard_timeout_s: float = 5.0  # a shard's answer while a batch is planned; past it, its offset is kept
    queue_partitions: int = 0  # the queue's partitions where its servers do not say (they predate WHERE)
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
            cluster=options.get("cluster") or "",
            shard_timeout_s=number("shardTimeout", cls.shard_timeout_s, float),
            queue_partitions=number("queuePartitions", 0) if options.get("queuePartitions") else 0,
            curve=_curve(options.get("curveClientKey"), options.get("curveServerKey")),
        )

    def client(self, endpoint: str = "", timeout_s: float = 0.0):
        """An API client of ``endpoint`` (else the option's) waiting ``timeout_s`` (else ``timeout``)."""
        from pzq.clients.api import ApiClient  # imported where it runs: executors import pzq lazily

        timeout_s = timeout_s or self.timeout_s
        return ApiClient(
            endpoint or self.endpoint, timeout_s=timeout_s, attempt_s=min(5.0, timeout_s), curve=self.curve
        )


def _curve(client_key: str | None, server_key: str | None) -> tuple[str, str] | None:
    if bool(client_key) != bool(server_key):
        raise ValueError("pzq options curveClientKey and curveServerKey: give both or neither")
    return (client_key, server_key) if client_key and server_key else None
