"""The streaming reader: micro-batches over a consumer group's leases (docs/spark.md, "Delivery guarantee")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceStreamReader

from pzq.spark.options import MAX_BATCH, Options
from pzq.spark.read import SeqRange, arrow_schema, page, split

try:  # admission control (latestOffset(start, limit)) came with pyspark 4.2
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
except ImportError:  # pragma: no cover - older pyspark calls latestOffset() without arguments
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

log = logging.getLogger("pzq.spark")

# Messages of a batch leased while Spark waits (no lease ahead made it ready: a query's first batch, or
# the first after batches that were not full): about 0.1 s of the server's work, so that Spark reads them
# while the rest of a backlog is leased ahead, rather than waiting for a whole maxMessagesPerBatch.
FIRST_BATCH = 100_000
FETCHES = 2  # FETCH requests a partition's reader has in flight (the API's memory bound admits two big replies)


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
        return read_leases(self.options, partition.lo, partition.hi, self.arrow)

    def commit(self, end: dict) -> None:
        self._api().ack_upto(self.options.queue, self.options.group, end["seq"])

    def stop(self) -> None:
        if self._stopping is not None:  # (None in a copy made for an executor)
            self._stopping.set()
        self._wait_ahead(5.0)  # (between two calls it stops at once; a daemon thread cannot outlive the driver)
        if self._client is not None:
            self._client.close()
            self._client = None


def read_leases(opts: Options, lo: int, hi: int, arrow: bool) -> Iterator:
    """The rows of the group's leases ``lo .. hi-1`` of ``opts.queue`` at ``opts.endpoint`` (an executor's
    part of a batch; replayable: a re-run gets the same rows)."""
    schema = arrow_schema() if arrow else None
    if lo >= hi:
        return
    with opts.client() as api:
        # (the next page is read on the server while this one is turned into rows)
        for messages, gone in api.fetch_pages(opts.queue, opts.group, lo, hi, opts.fetch_size, FETCHES):
            if gone:
                log.warning(
                    "pzq group %r: %d message(s) of leases %d..%d are gone (their lease expired "
                    "and they went back to queue %r)",
                    opts.group,
                    gone,
                    lo,
                    hi - 1,
                    opts.queue,
                )
            yield from page(opts.queue, messages, schema)
