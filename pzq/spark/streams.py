"""Where a queue's streams are: every (queue, shard) pair that a Spark query reads as one source or a sink
writes to, found from the shard list (the ``cluster`` option's file, else the ``endpoint`` server's
WHERE) and every shard's WHERE (docs/spark.md, "Shards")."""

from __future__ import annotations

import dataclasses
import logging

from pzq.errors import PzqError
from pzq.shards import Shard, ShardList, load
from pzq.spark.options import Options

log = logging.getLogger("pzq.spark")


@dataclasses.dataclass(frozen=True)
class Stream:
    """One queue on one shard: the unit with offsets of its own (a consumer group's leases are per shard)."""

    shard: str
    endpoint: str  # the shard's API endpoint
    queue: str

    @property
    def key(self) -> str:
        """Its name in a batch's offsets: ``shard/queue`` (a shard's name has no ``/``)."""
        return f"{self.shard}/{self.queue}"


def split_key(key: str) -> tuple[str, str]:
    """(shard, queue) of a stream's offsets key."""
    shard, sep, queue = key.partition("/")
    if not sep or not shard:
        raise PzqError(f"pzq offsets: {key!r} is not shard/queue")
    return shard, queue


def where(options: Options, endpoint: str, queue: str, timeout_s: float) -> dict | None:
    """The WHERE answer of the server at ``endpoint`` for ``queue``; None from a server that predates WHERE.
    ClientError when it does not answer within ``timeout_s``."""
    from pzq.clients.api import ApiError

    with options.client(endpoint, timeout_s) as api:
        try:
            return api.call("WHERE", queue=queue)
        except ApiError as exc:
            if exc.code == "unknown-command":
                return None
            raise


def shard_list(options: Options) -> ShardList | None:
    """The shard list the query reads: the ``cluster`` file, else the one the ``endpoint`` server reads
    (its WHERE, waiting up to ``timeout`` as any first call does); None for a server without one (a
    single server: the query reads and writes as it always did)."""
    if options.cluster:
        return load(options.cluster)
    answer = where(options, options.endpoint, options.queue, options.timeout_s)
    if not answer or not answer.get("shards"):
        return None
    return ShardList.from_dict(answer["shards"], f"the shard list of {options.endpoint}")


def _endpoint(shard: Shard) -> str:
    if not shard.api_dsn:
        raise PzqError(f"shard {shard.name!r} has no api_dsn in the shard list: Spark reads and writes through it")
    return shard.api_dsn


def cluster(options: Options, shards: ShardList):
    """The clients' view of the list (pzq.clients.cluster): every shard asked WHERE at once, each given
    ``shardTimeout`` to answer."""
    from pzq.clients.cluster import Cluster  # imported where it runs: executors import pzq lazily

    return Cluster(shards, curve=options.curve, where_timeout_s=options.shard_timeout_s)


def locate(options: Options, shards: ShardList) -> tuple[list[Stream], list[str]]:
    """The streams of the ``queue`` option: its places on the list (a partition a stream: K is the largest
    count any shard keeps, at least ``queuePartitions``) and every (queue, shard) a shard holds (a
    seed-protocol client made it there); and the shards that did not answer (their places are kept: a
    partition is read where the list puts it)."""
    where = cluster(options, shards).locate(options.queue, partitions=options.queue_partitions, fresh=True)
    streams = {Stream(shard.name, _endpoint(shard), name) for name, shard in where.consume_from}
    return sorted(streams, key=lambda stream: stream.key), list(where.unreachable)
