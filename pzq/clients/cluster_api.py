"""The API's PRODUCE routed by queue over a cluster (docs/cluster.md): ``ClusterApi``, each message to
one of its queue's places, a shard's part with its own dedup key ``KEY@SHARD``."""

from __future__ import annotations

import concurrent.futures
import uuid

from pzq.clients.api import ApiClient
from pzq.clients.cluster import Cluster, spread
from pzq.errors import ClientError, ConfigError
from pzq.shards import Shard


class ClusterApi:
    """The API's PRODUCE routed by queue over a cluster: each message to one of its queue's places, one
    ``ApiClient`` per shard (made when first needed), the shards asked at once. Not thread-safe."""

    def __init__(self, cluster: Cluster, *, timeout_s: float = 60.0, attempt_s: float = 5.0):
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.attempt_s = attempt_s
        self._clients: dict[str, ApiClient] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(cluster.shards.shards)))

    def client(self, shard: Shard) -> ApiClient:
        """The API client of ``shard`` (ConfigError if the list gives it no API endpoint)."""
        self.cluster.check(shard)
        if shard.name not in self._clients:
            if not shard.api_dsn:
                raise ConfigError(f"shard {shard.name!r} has no api_dsn in the shard list")
            self._clients[shard.name] = ApiClient(
                shard.api_dsn, timeout_s=self.timeout_s, attempt_s=self.attempt_s, curve=self.cluster.curve
            )
        return self._clients[shard.name]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for one in self._clients.values():
            one.close()
        self._clients.clear()

    def __enter__(self) -> ClusterApi:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _produce_on(self, name: str, part: list[tuple[str, bytes]], key: str) -> dict:
        return self.client(self.cluster.shards.named(name)).produce(part, f"{key}@{name}")

    def route(self, messages: list[tuple[str, bytes]], key: str) -> dict[str, list[tuple[str, bytes]]]:
        """Each message's place, by shard name, in order: the messages of a queue of K partitions go
        round the partitions from one the ``key`` picks, so the same call (same key, same messages, same
        list and K) always makes the same places, and a call again stores on each shard what it lacks."""
        routed: dict[str, list[tuple[str, bytes]]] = {}
        turn: dict[str, int] = {}
        fresh = [queue for queue in dict.fromkeys(q for q, _ in messages) if not self.cluster.known(queue)]
        if fresh:  # (the queues not located yet, asked in one round: one second for a shard that is down)
            self.cluster.locate_many(fresh, place=True)
        for queue, body in messages:
            places = self.cluster.locate(queue, place=True).places()
            if queue not in turn:
                turn[queue] = spread(f"{key}\0{queue}", len(places))
            name, shard = places[turn[queue] % len(places)]
            turn[queue] += 1
            routed.setdefault(shard.name, []).append((name, body))
        return routed

    def produce(self, messages: list[tuple[str, bytes]], key: str | None = None) -> dict:
        """Store ``[(queue, body), ...]`` on their shards, each shard's part with the key ``KEY@SHARD``
        (the server's dedup is per shard). Returns ``count`` (stored, or found stored), ``duplicate``
        (every shard's part was) and ``shards`` (the count each shard took). A shard that fails does not
        stop the others: ClientError after them, naming it and the key; call again with that ``key``
        (what some shards stored, they store once)."""
        key = key or uuid.uuid4().hex
        routed = self.route(messages, key)
        futures = {name: self._pool.submit(self._produce_on, name, part, key) for name, part in routed.items()}
        done: dict[str, dict] = {}
        failed: list[str] = []
        for name, future in futures.items():
            try:
                done[name] = future.result()
            except ClientError as exc:
                failed.append(f"shard {name}: {exc}")
        if failed:
            stored = sum(r["count"] for r in done.values())
            again = f"{stored} stored elsewhere: call again with key {key}"
            raise ClientError(f"PRODUCE {key}: {'; '.join(failed)} ({again})")
        return {
            "count": sum(r["count"] for r in done.values()),
            "duplicate": all(r["duplicate"] for r in done.values()),
            "shards": {name: r["count"] for name, r in done.items()},
        }
