"""The stream reader of format ``pzq``: one server's leases as they always were (offsets ``{"seq": n}``),
or every stream of a queue on a shard list read as one (offsets ``{"streams": {"shard/queue": n}}``),
each stream a LeaseStreamReader of its own (docs/spark.md, "Shards")."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator

from pyspark.sql.datasource import DataSourceStreamReader

from pzq.errors import ClientError, PzqError
from pzq.shards import ShardList
from pzq.spark.options import Options
from pzq.spark.read import SeqRange, StreamRange, spread
from pzq.spark.stream import LeaseStreamReader, ReadAllAvailable, ReadMaxRows, read_leases
from pzq.spark.streams import Stream, locate, shard_list, split_key

log = logging.getLogger("pzq.spark")

LOCATE_S = 30.0  # how long the streams found stay the query's before every shard's WHERE is asked again
RETRY_S = 10.0  # a shard that did not answer is left alone this long (plans go on without waiting for it)


class SourceReader(DataSourceStreamReader):
    """Micro-batches over a consumer group's leases on one server, or on every (queue, shard) of a queue.
    Which is decided at the driver's first call: the ``cluster`` option, else the endpoint's WHERE."""

    def __init__(self, options: Options, arrow: bool = False):
        self.options = options
        self.arrow = arrow
        self._shards: ShardList | None = None
        self._single: LeaseStreamReader | None = None  # one server: every call is its
        self._readers: dict[str, LeaseStreamReader] = {}  # stream key -> its reader (driver side)
        self._streams: list[Stream] = []
        self._located = -math.inf  # when the streams were found (monotonic)
        self._down: dict[str, float] = {}  # shard -> until when it is left alone
        self._last_end: dict[str, int] | None = None
        self._unacked: dict[str, int] = {}  # stream -> the end a commit could not acknowledge yet

    def __getstate__(self) -> dict:  # executors read by partition: they need none of the driver's readers
        return {**self.__dict__, "_single": None, "_readers": {}, "_unacked": {}}

    def _mode(self) -> LeaseStreamReader | None:
        """The one server's reader, or None for a shard list (found once, on the driver's first call)."""
        if self._single is None and self._shards is None:
            self._shards = shard_list(self.options)
            if self._shards is None:
                self._single = LeaseStreamReader(self.options, self.arrow)
        return self._single

    # -- the streams ---------------------------------------------------------------------------------

    def _locate(self) -> list[Stream]:
        if time.monotonic() - self._located >= LOCATE_S:
            assert self._shards is not None  # (checked by _mode: a shard list)
            streams, missing = locate(self.options, self._shards)
            for name in missing:
                log.warning("pzq group %r: shard %s did not answer WHERE", self.options.group, name)
            self._streams, self._located = streams, time.monotonic()
        return self._streams

    def _reader(self, key: str) -> LeaseStreamReader:
        reader = self._readers.get(key)
        if reader is None:
            assert self._shards is not None
            shard, queue = split_key(key)
            endpoint = self._shards.named(shard).api_dsn
            share = max(1, math.ceil(self.options.max_per_batch / max(1, len(self._streams))))
            planning = self.options.shard_timeout_s  # (the driver's calls; executors read with ``timeout``)
            options = dataclasses.replace(
                self.options, endpoint=endpoint, queue=queue, timeout_s=planning, max_per_batch=share
            )
            reader = self._readers[key] = LeaseStreamReader(options, self.arrow)
        return reader

    def _home_key(self) -> str:
        """The stream a single server's offsets (``{"seq": n}``, a checkpoint made before the list) were of."""
        assert self._shards is not None
        by_endpoint = [s for s in self._shards.shards if s.api_dsn == self.options.endpoint]
        shard = by_endpoint[0] if by_endpoint else self._shards.home(self.options.queue)
        return f"{shard.name}/{self.options.queue}"

    def _positions(self, offset: dict | None) -> dict[str, int] | None:
        if offset is None:
            return None
        if "streams" in offset:
            return dict(offset["streams"])
        return {self._home_key(): offset["seq"]}

    def _each(self, keys: list[str], call: Callable[[str], int], what: str) -> dict[str, int]:
        """``call(key)`` for every stream in parallel, but those of a shard left alone; key -> result of
        those that answered. A shard that does not is left alone for RETRY_S (its offsets are kept)."""
        now = time.monotonic()
        asked = [k for k in keys if self._down.get(split_key(k)[0], 0.0) <= now]
        done: dict[str, int] = {}
        if not asked:
            return done
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(asked))) as pool:
            futures = {key: pool.submit(call, key) for key in asked}
            for key, future in futures.items():
                try:
                    done[key] = future.result()
                except (ClientError, OSError) as exc:
                    if getattr(exc, "code", "busy") != "busy":
                        raise  # (refused, not unreachable: e.g. not-permitted; the query fails saying so)
                    shard = split_key(key)[0]
                    self._down[shard] = time.monotonic() + RETRY_S
                    log.warning("pzq group %r: shard %s: %s %s: %s", self.options.group, shard, what, key, exc)
        return done

    # -- Spark's calls -------------------------------------------------------------------------------

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.options.max_per_batch) if ReadMaxRows is not None else None

    def initialOffset(self) -> dict:
        single = self._mode()
        if single is not None:
            return single.initialOffset()
        keys = [stream.key for stream in self._locate()]
        return {"streams": self._each(keys, lambda k: self._reader(k).initialOffset()["seq"], "left out of")}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        single = self._mode()
        if single is not None:
            return single.latestOffset(start, limit)
        if self._unacked:
            self._acknowledge()
        streams = self._locate()
        begin = self._positions(start) if start is not None else self._last_end
        if begin is None:
            begin = self.initialOffset()["streams"]
        share = limit
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            rows = getattr(limit, "max_rows", None) or getattr(limit, "maxRows", 0)  # (named both ways by version)
            share = ReadMaxRows(max(1, math.ceil(int(rows or 0) / max(1, len(streams)))))

        def plan(key: str) -> int:
            reader = self._reader(key)
            if key not in begin:  # a stream found since: it enters at its group's base (its next batch reads)
                return reader.initialOffset()["seq"]
            every = ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable)
            return reader.latestOffset({"seq": begin[key]}, limit if every else share)["seq"]

        # A shard that does not answer keeps its offsets, as does a stream no longer found (never skipped).
        end = {**begin, **self._each(sorted({s.key for s in streams} | set(begin)), plan, "offset kept for")}
        self._last_end = end
        return {"streams": end}

    def partitions(self, start: dict, end: dict) -> list[SeqRange] | list[StreamRange]:
        single = self._mode()
        if single is not None:
            return single.partitions(start, self._one(end))
        assert self._shards is not None
        begin, ends = self._positions(start) or {}, self._positions(end) or {}
        ranges = []
        for key, hi in sorted(ends.items()):
            shard, queue = split_key(key)
            ranges.append((self._shards.named(shard).api_dsn, queue, begin.get(key, hi), hi))
        return spread(ranges, self.options.partitions)

    @staticmethod
    def _one(offset: dict) -> dict:
        if "seq" not in offset:
            raise PzqError("pzq: this query's offsets are of shards, and its endpoint now reads no shard list")
        return offset

    def read(self, partition: SeqRange | StreamRange) -> Iterator[tuple]:  # type: ignore[override]
        opts = self.options
        if isinstance(partition, StreamRange):
            opts = dataclasses.replace(opts, endpoint=partition.endpoint, queue=partition.queue)
        return read_leases(opts, partition.lo, partition.hi, self.arrow)

    def commit(self, end: dict) -> None:
        single = self._mode()
        if single is not None:
            single.commit(self._one(end))
            return
        for key, seq in (self._positions(end) or {}).items():
            self._unacked[key] = max(seq, self._unacked.get(key, seq))
        self._acknowledge()

    def _acknowledge(self) -> None:
        """ACK_UPTO every stream's committed end not acknowledged yet: at a commit, and at each plan after
        one a shard did not answer (ACK_UPTO covers what is before its end; an idle query plans on, so
        its last batch is acknowledged once the shard is back, not at the next batch with rows)."""
        ends = dict(self._unacked)

        def ack(key: str) -> int:
            self._reader(key).commit({"seq": ends[key]})
            return ends[key]

        for key in self._each(sorted(ends), ack, "acknowledged later:"):
            if self._unacked.get(key) == ends[key]:
                del self._unacked[key]

    def stop(self) -> None:
        for reader in [*self._readers.values(), *([self._single] if self._single else [])]:
            reader.stop()
