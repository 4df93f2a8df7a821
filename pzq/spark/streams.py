"""Where a queue's streams are: every (queue, shard) pair that a Spark query reads as one source or a sink
writes to, found from the shard list (the ``cluster`` option's file, else the ``endpoint`` server's
WHERE) and every shard's WHERE (docs/spark.md, "Shards")."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging

from pzq.errors import ClientError, PzqError
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


def ask_every(options: Options, shards: ShardList, queue: str) -> dict[str, dict | None | Exception]:
    """Every shard's WHERE for ``queue``, in parallel, each within ``shardTimeout``: shard name -> the
    answer (None: it predates WHERE), or the exception of one that did not answer."""
    answers: dict[str, dict | None | Exception] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(shards.shards))) as pool:
        asked = {
            shard.name: pool.submit(where, options, _endpoint(shard), queue, options.shard_timeout_s)
            for shard in shards.shards
        }
        for name, future in asked.items():
            try:
                answers[name] = future.result()
            except (ClientError, OSError) as exc:
                answers[name] = exc
    return answers


def partitions(options: Options, queue: str, answers: dict[str, dict | None | Exception]) -> int:
    """The queue's partition count: the largest any shard keeps, at least ``queuePartitions`` for the
    option's own queue (servers that predate WHERE cannot say)."""
    kept = [a.get("partitions", 0) for a in answers.values() if isinstance(a, dict)]
    floor = options.queue_partitions if queue == options.queue else 0
    return max([floor, *(k for k in kept if isinstance(k, int))])


def locate(options: Options, shards: ShardList) -> tuple[list[Stream], list[str]]:
    """The streams of the ``queue`` option: its places on the list (a partition a stream) and every
    (queue, shard) a shard holds (a seed-protocol client made it there); and the shards that did not
    answer (their places are kept: a partition is read where the list puts it)."""
    answers = ask_every(options, shards, options.queue)
    k = partitions(options, options.queue, answers)
    found = {(name, shard.name) for name, shard in shards.place(options.queue, k)}
    for shard_name, answer in answers.items():
        if isinstance(answer, dict):
            for held in answer.get("held") or []:
                if isinstance(held, list) and held and isinstance(held[0], str):
                    found.add((held[0], shard_name))
    streams = [Stream(s, _endpoint(shards.named(s)), q) for q, s in found if s in shards.names()]
    missing = [name for name, answer in answers.items() if isinstance(answer, Exception)]
    return sorted(streams, key=lambda stream: stream.key), missing


class Placer:
    """Where a sink puts a chunk's rows: each queue's places on the list (its partitions, K learned once
    per task from the shards' WHERE), one chosen by a hash of the chunk's key and the queue, so that a
    re-run chunk (same key) goes where it went and is stored once there."""

    def __init__(self, options: Options, shards: ShardList):
        self.options, self.shards = options, shards
        self._places: dict[str, list[tuple[str, Shard]]] = {}

    def place(self, queue: str, chunk_key: str) -> tuple[str, Shard]:
        places = self._places.get(queue)
        if places is None:
            answers = ask_every(self.options, self.shards, queue)
            if not any(isinstance(a, dict) or a is None for a in answers.values()):
                raise ClientError(f"no shard answered WHERE {queue!r} within {self.options.shard_timeout_s} s")
            places = self._places[queue] = self.shards.place(queue, partitions(self.options, queue, answers))
        digest = hashlib.blake2b(f"{chunk_key}\0{queue}".encode(), digest_size=8).digest()
        return places[int.from_bytes(digest, "big") % len(places)]
