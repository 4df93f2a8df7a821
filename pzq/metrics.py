"""Prometheus metrics (``--metrics-dsn http://127.0.0.1:9108``), with the prometheus-client library.

The event loop publishes a snapshot of its figures once a second (``update``) and observes every commit
(``observe_commit``); prometheus-client's HTTP thread only reads the last snapshot, so a scrape never
touches the store or the loop's state.

Metrics: per queue depth, in-flight, dead letters, bytes, age of the oldest message, and produced /
acked / redelivered counters; totals of the broker's counters; per protocol the gateway figures
(``pzq_protocol_figure{protocol, figure}``); the commit (fsync) latency and the group-commit batch size
(messages stored per commit) as histograms; the permissions' refusals per client and right.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from pzq.config import parse_endpoint
from pzq.errors import ConfigError

COMMIT_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_TOTALS = (
    "produced_total",
    "acked_total",
    "nacked_total",
    "redelivered_total",
    "dead_lettered_total",
    "refused_full_total",
    "refused_not_held_total",
    "expired_messages",
)


class Metrics:
    """The registry, the HTTP endpoint and the loop's last snapshot."""

    def __init__(self, dsn: str):
        try:
            import prometheus_client
            from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        except ImportError:
            raise ConfigError("--metrics-dsn needs prometheus-client: pip install 'pzq[metrics]'") from None
        self._gauge, self._counter = GaugeMetricFamily, CounterMetricFamily
        self.host, self.port = parse_endpoint(dsn)
        self.registry = prometheus_client.CollectorRegistry()
        self.commit_seconds = prometheus_client.Histogram(
            "pzq_commit_seconds", "Durable commit (fsync) latency", buckets=COMMIT_SECONDS, registry=self.registry
        )
        self.commit_messages = prometheus_client.Histogram(
            "pzq_commit_messages", "Messages stored per group commit", buckets=BATCH_SIZES, registry=self.registry
        )
        self._snapshot: dict = {}
        self._lock = threading.Lock()
        self.registry.register(self)
        try:
            self.server, self.thread = prometheus_client.start_http_server(self.port, self.host, self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-dsn {dsn}: cannot listen: {exc}") from None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def observe_commit(self, seconds: float, messages: int) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_messages.observe(messages)

    def update(self, stats: dict, oldest_age: dict[str, float], per_queue: dict[str, dict[str, int]]) -> None:
        """Publish the loop's figures for the next scrapes (called from the loop, about once a second)."""
        with self._lock:
            self._snapshot = {"stats": stats, "oldest": oldest_age, "per_queue": per_queue}

    def collect(self) -> Iterator:
        """prometheus-client's collector protocol (runs in its HTTP thread)."""
        with self._lock:
            snap = self._snapshot
        if not snap:
            return
        stats, g, c = snap["stats"], self._gauge, self._counter
        queue_gauges = {
            "depth": g("pzq_queue_depth", "Messages stored in the queue", labels=["queue"]),
            "inflight": g("pzq_queue_inflight", "Messages delivered and not yet acknowledged", labels=["queue"]),
            "dead_letters": g("pzq_queue_dead_letters", "Messages in the queue's dead letters", labels=["queue"]),
            "bytes": g("pzq_queue_bytes", "Bytes of the queue's stored messages", labels=["queue"]),
        }
        oldest = g("pzq_queue_oldest_message_age_seconds", "Age of the oldest stored message", labels=["queue"])
        for queue, figures in stats.get("queues", {}).items():
            for name, family in queue_gauges.items():
                family.add_metric([queue], figures.get(name, 0))
            if queue in snap["oldest"]:
                oldest.add_metric([queue], snap["oldest"][queue])
        yield from queue_gauges.values()
        yield oldest
        per_queue: dict[str, Any] = {
            name: c(f"pzq_queue_{name}", f"Messages {name} in the queue", labels=["queue"])
            for name in ("produced", "acked", "redelivered")
        }
        for queue, counts in snap["per_queue"].items():
            for name, family in per_queue.items():
                family.add_metric([queue], counts.get(name, 0))
        yield from per_queue.values()
        for name in _TOTALS:
            base = name.removesuffix("_total").removesuffix("_messages")
            yield c(f"pzq_{base}", f"Messages {base.replace('_', ' ')} since start", value=stats.get(name, 0))
        yield g("pzq_inflight", "Deliveries awaiting an acknowledgement", value=stats.get("messages_inflight", 0))
        yield g("pzq_store_bytes", "Bytes of the store's pages in use", value=stats.get("db_size", 0))
        yield g("pzq_store_limit_bytes", "The configured store limit", value=stats.get("store_limit_bytes", 0))
        yield c("pzq_commits", "Durable commits since start", value=stats.get("syncs", 0))
        yield g("pzq_uptime_seconds", "Seconds since start", value=stats.get("uptime_seconds", 0))
        memory = stats.get("memory") or {}
        yield g("pzq_memory_alarm", "1 while the memory alarm refuses producers", value=memory.get("alarm", 0))
        yield g("pzq_memory_counted_bytes", "Bytes pzq holds for its clients", value=memory.get("counted_bytes", 0))
        figure = g("pzq_protocol_figure", "A gateway's own figures, per protocol", labels=["protocol", "figure"])
        for protocol in ("phpmq", "emqp", "mqks", "api"):
            for name, value in (stats.get(protocol) or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    figure.add_metric([protocol, name], value)
        yield figure
        refusals = c("pzq_permission_refusals", "Requests refused by the permissions", labels=["client", "right"])
        for client, rights in ((stats.get("permissions") or {}).get("refused") or {}).items():
            for right, count in rights.items():
                refusals.add_metric([client, right], count)
        yield refusals
