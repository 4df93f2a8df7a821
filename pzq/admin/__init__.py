"""What the monitor socket answers: the figures (with rates), dead letters, and the admin requests the
console and the CLI use (reads in reads.py, writes in writes.py).

No sockets: the server passes each parsed request in and sends the text back.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from pzq.admin.figures import KINDS, Figures
from pzq.admin.rates import QueueRates
from pzq.admin.reads import Listed, Reads
from pzq.admin.writes import Writes
from pzq.broker import Broker
from pzq.config import Config
from pzq.logs import warn_bad
from pzq.protocols import monitor as monitor_proto
from pzq.shards import where_answer
from pzq.store import QueueInfo, Store

RATE_WINDOW = 11  # one-second samples: rates are over the last ten seconds
DEAD_LIST_BYTES = 4 << 20  # bodies of dead letters one DEADLETTERS answer lists at most (the first always)


class Admin(Reads, Writes):
    """Answers every monitor request over a broker and its store (see pzq/protocols/monitor.py)."""

    def __init__(self, broker: Broker, store: Store, *, store_limit: int, gateways: Callable[[], dict]):
        self.broker = broker
        self.store = store  # (handed in: the broker's store is the broker's)
        self.store_limit = store_limit
        self.gateways = gateways  # () -> {"phpmq": {...}, "emqp": {...}} for the gateways that run
        self.endpoints: Callable[[], Sequence[Listed]] = list  # (set by attach: the server's endpoints)
        self.commit_ms: Callable[[], float] = float  # the last commit's duration
        self.started = time.monotonic()
        self._samples: collections.deque = collections.deque(maxlen=RATE_WINDOW)
        self._heads: dict[str, int] = {}  # queue -> when its head message was stored (µs), as last read
        self._next_head = 0  # where the next tick's share of queues begins
        self._unchecked: list[str] = []  # names sampled, still to look at this round (gone: forgotten)
        self.rates = QueueRates()  # each queue's in_per_s and out_per_s, sampled with its head
        self._purges = {}
        self.figures = Figures(self)  # STATS and MONITOR over turns (the monitor endpoint's)
        self.where: Callable[[str], dict] = self._where_alone  # WHERE's answer (the server's: attach)
        self.shard = ""  # this server's shard name, among the figures when it has one

    def attach(
        self,
        endpoints: Callable[[], Sequence[Listed]],
        commit_ms: Callable[[], float],
        config: Config,
        where: Callable[[str], dict] | None = None,
    ) -> None:
        """What the server adds once it runs: its endpoints (their clients and consumers), the last
        commit's duration, its limits, and its answer to WHERE a queue (pzq/server/wiring.py's Where)."""
        self.endpoints, self.commit_ms = endpoints, commit_ms
        if where is not None:
            self.where = where
            self.shard = getattr(where, "shard", "")  # (pzq/server/wiring.py's Where: this server's shard)
        self.limits, self.max_body = config.limits, config.max_message_size

    def tick(self, now: float) -> None:
        """Take a sample of the counters and the queues' head ages and rates (the server calls this
        about once a second, ``now`` its monotonic clock)."""
        counters = self.broker.counters
        self._samples.append((now, type(counters)(**vars(counters))))
        self._read_heads(now)

    def _read_heads(self, now: float) -> None:
        """Read when the head message of a share of the queues was stored (all of them up to
        ``limits.admin_heads_per_tick``; past it, in turn over the next ticks). A head's age is counted
        from it when the figures are made, so it grows between two reads; only a head that changed (its
        message consumed) waits for its queue's next read. (Each tick made every queue's age anew, and
        sets of every name: 3.6 ms a second with 9,000 queues.)"""
        infos = self.store.queues()
        share, count = self.limits.admin_heads_per_tick, len(infos)
        if count > share:
            start = self._next_head % count
            self._next_head = start + share
            # (the share alone: copying the whole list twice more was 1 ms a tick at 100,000 queues)
            infos = infos[start : start + share] + infos[: max(0, start + share - count)]
        self._forget_gone(share)
        sample = self.rates.sample
        for info in infos:
            sample(info, now)
        names = [info.name for info in infos]
        heads = self.store.previews.oldest_enqueued(names)
        for name in names:
            at = heads.get(name)
            if at is None:
                self._heads.pop(name, None)  # (empty now, or gone)
            else:
                self._heads[name] = at

    def _forget_gone(self, most: int) -> None:
        """Forget the head and the rates of queues that went, ``most`` names looked at a tick (the names
        sampled, a list taken once a round: a walk of every name at the end of each round held one tick
        55 ms at 100,000 queues). A queue's head is read only where its rates are sampled: one list."""
        if not self._unchecked:
            self._unchecked = self.rates.names()
        unchecked, queue = self._unchecked, self.store.queue
        for _ in range(min(most, len(unchecked))):
            name = unchecked.pop()
            if queue(name, create=False) is None:
                self._heads.pop(name, None)
                self.rates.drop(name)

    def oldest_age(self, info: QueueInfo, now_us: int) -> float:
        """Seconds since ``info``'s head message was stored (as last read; 0.0 for an empty queue)."""
        at = self._heads.get(info.name)
        return 0.0 if at is None or not info.count else round(max(0.0, (now_us - at) / 1e6), 3)

    @property
    def oldest(self) -> dict[str, float]:
        """Each queue's head age (the metrics' figures; see ``oldest_age``)."""
        now_us = time.time_ns() // 1000
        return {name: max(0.0, (now_us - at) / 1e6) for name, at in self._heads.items()}

    def _rate(self, name: str) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return round((getattr(c1, name) - getattr(c0, name)) / max(t1 - t0, 1e-9), 1)

    def stats(self) -> dict:
        """Every figure the monitor reports, the six PZQ fields first (all at once: the monitor's STATS
        builds the per-queue part over turns, ``figures``)."""
        rows = self.queue_rows(self.store.queues(), time.time_ns() // 1000)
        return {**self.totals(), "queues": rows, **self.around()}

    def totals(self) -> dict:
        """The figures before the queues': the six PZQ fields."""
        return self.broker.totals()

    def queue_rows(self, infos: Sequence[QueueInfo], now_us: int) -> dict[str, dict]:
        """The STATS figures of each queue of ``infos``, by name."""
        figures, age, rates = self.broker.queue_figures, self.oldest_age, self.rates.of
        rows = {}
        for info in infos:
            row = figures(info)
            row["oldest_age_s"] = age(info, now_us)
            row["in_per_s"], row["out_per_s"] = rates(info.name)  # (msg/s over the last 10 s, as last sampled)
            rows[info.name] = row
        return rows

    def around(self) -> dict:
        """The figures after the queues' (every other)."""
        counters = self.broker.counters
        rest: dict = {
            "uptime_seconds": round(time.monotonic() - self.started, 1),
            "produced_total": counters.produced,
            "acked_total": counters.acked,
            "nacked_total": counters.nacked,
            "redelivered_total": counters.redelivered,
            "dead_lettered_total": counters.dead_lettered,
            "refused_full_total": counters.refused_full,
            "refused_not_held_total": counters.refused_not_held,
            "damaged_total": self.store.damaged_total,
            "unreadable_records_total": self.store.unreadable_records,
            "produce_rate": self._rate("produced"),
            "ack_rate": self._rate("acked"),
            "store_limit_bytes": self.store_limit,
            "queues_implicit": self.store.catalog.implicit_count,  # made by clients' requests: they expire unused
            "queues_expired_total": self.broker.implicit_expired,
            "queues_refused_total": self.broker.implicit_refused,  # new names past a client's share
            "delivered_total": counters.delivered,
            "commit_ms_last": round(self.commit_ms(), 3),
            # (a commit's meta page synced on its own: no later commit came soon enough to carry it)
            "meta_syncs_total": self.store.meta_syncs,
            "server_time_us": time.time_ns() // 1000,
        }
        if self.shard:
            rest["shard"] = self.shard  # (text: `pzq monitor` says which shard it reads)
        rest.update(self.gateways())
        return rest

    def answer(self, request: monitor_proto.Request) -> str:
        """The reply to a request that only reads."""
        if request.command in KINDS:
            return self.figures.build(request.command).decode("utf-8")
        if request.command == "DEADLETTERS" and 1 <= len(request.args) <= 2:
            return self._dead_letters(request.args)
        if request.command == "ROUTES":
            return self.routes(request.args)
        if request.command == "WHERE":
            if len(request.args) != 1 or len(request.args[0].encode()) > 255:
                return monitor_proto.error_text("usage: WHERE <queue> (a name of 1 to 255 bytes)")
            return monitor_proto.render_json(self.where(request.args[0]))
        answer = self.read(request)
        if answer is not None:
            return answer
        if request.command:
            warn_bad("monitor", "unknown", f"request {request.command[:40]!r}")
        return monitor_proto.unknown_request(request)

    def _where_alone(self, queue: str) -> dict:
        """WHERE's answer of a server that is no shard (a test's, a tool's: the server hands its own)."""
        info = self.store.catalog.by_name.get
        kept = self.store.catalog.partitions.get(queue, 0)
        return where_answer(queue, "", None, kept, lambda name: getattr(info(name), "count", None))

    def _dead_letters(self, args: list[str]) -> str:
        queue = args[0]
        try:
            limit = int(args[1]) if len(args) > 1 else 100
        except ValueError:
            return monitor_proto.error_text(f"limit must be a number, got {args[1]!r}")
        # (bodies are listed whole: at most DEAD_LIST_BYTES of them, the first always; 10,000 dead letters of
        # 16 MiB were read and rendered in one turn, gigabytes, the loop stalled for seconds a hundred MiB)
        letters = self.store.dead_letters.read(queue, 0, max(1, min(limit, 10_000)), max_bytes=DEAD_LIST_BYTES)
        return monitor_proto.render_json(
            [
                {
                    "id": d.message.id,
                    "queue": queue,
                    "reason": d.reason,
                    "deliveries": d.message.deliveries,
                    "enqueued_us": d.message.enqueued_us,
                    "dead_at_us": d.dead_at_us,
                    "body": [f.decode("utf-8", "replace") for f in d.message.frames],
                }
                for d in letters
            ]
        )
