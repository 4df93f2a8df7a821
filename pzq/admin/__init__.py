"""What the monitor socket answers: the figures (with rates), dead letters, and the admin requests the
console and the CLI use (reads in reads.py, writes in writes.py).

No sockets: the server passes each parsed request in and sends the text back.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from pzq.admin.reads import Listed, Reads
from pzq.admin.writes import Writes
from pzq.broker import Broker
from pzq.config import Config
from pzq.logs import warn_bad
from pzq.protocols import monitor as monitor_proto
from pzq.store import Store

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
        self.oldest: dict[str, float] = {}  # queue -> its head message's age (s), as of the last tick
        self._heads: dict[str, int] = {}  # queue -> when its head message was stored (µs), as last read
        self._next_head = 0  # where the next tick's share of queues begins
        self._purges = {}

    def attach(self, endpoints: Callable[[], Sequence[Listed]], commit_ms: Callable[[], float], config: Config) -> None:
        """What the server adds once it runs: its endpoints (their clients and consumers), the last
        commit's duration, and its limits."""
        self.endpoints, self.commit_ms = endpoints, commit_ms
        self.limits, self.max_body = config.limits, config.max_message_size

    def tick(self, now: float) -> None:
        """Take a sample of the counters and the queues' head ages (the server calls this about once a
        second)."""
        counters = self.broker.counters
        self._samples.append((now, type(counters)(**vars(counters))))
        self._read_heads()
        now_us = time.time_ns() // 1000
        self.oldest = {q: max(0.0, (now_us - at) / 1e6) for q, at in self._heads.items()}

    def _read_heads(self) -> None:
        """Read the head message's time of a share of the queues (all of them up to
        ``limits.admin_heads_per_tick``; past it, in turn over the next ticks)."""
        names = [info.name for info in self.store.queues()]
        share = self.limits.admin_heads_per_tick
        if len(names) > share:
            start = self._next_head % len(names)
            self._next_head = start + share
            names = (names + names)[start : start + share]
            gone = self._heads.keys() - {info.name for info in self.store.queues()}
        else:
            gone = self._heads.keys() - set(names)
        heads = self.store.oldest_enqueued(names)
        for name in [*gone, *(n for n in names if n not in heads)]:  # (gone, or empty now)
            self._heads.pop(name, None)
        self._heads.update(heads)

    def _rate(self, name: str) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return round((getattr(c1, name) - getattr(c0, name)) / max(t1 - t0, 1e-9), 1)

    def stats(self) -> dict:
        """Every figure the monitor reports, the six PZQ fields first."""
        stats = self.broker.stats()
        for name, figures in stats["queues"].items():
            figures["oldest_age_s"] = round(self.oldest.get(name, 0.0), 3)
        counters = self.broker.counters
        stats.update(
            {
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
                "queues_implicit": self.store.implicit_count,  # made by clients' requests: they expire unused
                "queues_expired_total": self.broker.implicit_expired,
                "delivered_total": counters.delivered,
                "commit_ms_last": round(self.commit_ms(), 3),
                "server_time_us": time.time_ns() // 1000,
            }
        )
        stats.update(self.gateways())
        return stats

    def answer(self, request: monitor_proto.Request) -> str:
        """The reply to a request that only reads."""
        if request.command == "MONITOR":
            return monitor_proto.render_text(self.stats())
        if request.command == "STATS":
            return monitor_proto.render_json(self.stats())
        if request.command == "DEADLETTERS" and 1 <= len(request.args) <= 2:
            return self._dead_letters(request.args)
        answer = self.read(request)
        if answer is not None:
            return answer
        if request.command:
            warn_bad("monitor", "unknown", f"request {request.command[:40]!r}")
        return monitor_proto.unknown_request(request)

    def _dead_letters(self, args: list[str]) -> str:
        queue = args[0]
        try:
            limit = int(args[1]) if len(args) > 1 else 100
        except ValueError:
            return monitor_proto.error_text(f"limit must be a number, got {args[1]!r}")
        # (bodies are listed whole: at most DEAD_LIST_BYTES of them, the first always; 10,000 dead letters of
        # 16 MiB were read and rendered in one turn, gigabytes, the loop stalled for seconds a hundred MiB)
        letters = self.store.dead_letters(queue, 0, max(1, min(limit, 10_000)), max_bytes=DEAD_LIST_BYTES)
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
