"""The native producer and consumer over a cluster's shards (docs/cluster.md): ``ShardedProducer``, a
batched ``Producer`` per shard, and ``ShardedConsumer``, a ``BatchConsumer`` per shard, read in turn.

A shard's native sockets serve one queue, its ``--queue`` (docs/protocols.md), the same on every shard of
a cluster: these clients move that queue's messages, spread over the shards of its places (a shard
holding two of its partitions takes two shares); what the API (``ClusterApi``) stores in ``Q#i`` is read
by the API and Spark, not here.

    cluster = Cluster.from_file("shards.toml")
    with ShardedProducer(cluster, "default") as producer:
        results = producer.send_many([[b"one"], [b"two"]])          # per message, in order
    with ShardedConsumer(cluster, "default") as consumer:
        while batch := consumer.receive(100, timeout_s=5):
            consumer.ack([key for key, _ in batch])                  # each to the shard it came from
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import time
from collections.abc import Iterable, Sequence

import zmq

from pzq.clients.cluster import Cluster, spread
from pzq.clients.native import BatchConsumer, Producer, ProduceResult
from pzq.clients.native_consume import Message
from pzq.errors import ClientError, NotListening
from pzq.protocols.native_consume import Settled
from pzq.shards import Shard

# A call's messages go in rounds of this many windows a place: each shard's pipe is full through a round
# and drains at its end, where the input is read on and the placement looked at again (issue 43)
ROUND_WINDOWS = 8
RETRY_S = 3.0  # a shard that failed is left out (unkeyed messages; a consumer's turn) this long, then tried again


class ShardedProducer:
    """Sends a queue's messages over the shards of its places: each batch of ``batch`` messages to the
    next place in turn, or each message to the place its key hashes to. A shard's messages go through
    that shard's own batched ``Producer``, every shard at once: a batch sent again after a lost ack goes
    again to the shard it went to (batch ids are per shard), and a shard that fails fails only its own
    messages (their results say so) and takes no unkeyed messages for ``RETRY_S``."""

    def __init__(
        self,
        cluster: Cluster,
        queue: str = "default",
        *,
        timeout_s: float = 10.0,
        batch: int = 100,
        window: int = 4,
        partitions: int = 0,
    ):
        self.cluster = cluster
        self.queue = queue
        self.timeout_s = timeout_s
        self.batch = max(1, batch)
        self.window = max(1, window)
        self.partitions = partitions
        self._producers: dict[str, Producer] = {}
        self._down: dict[str, float] = {}  # shard name -> when it last failed
        self._turn = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(cluster.shards.shards)))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for producer in self._producers.values():
            producer.close()
        self._producers.clear()

    def __enter__(self) -> ShardedProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def resent(self) -> dict[str, int]:
        """Batches sent again after a lost ack, by shard (each to the shard it went to first)."""
        return {name: producer.batches.resent for name, producer in self._producers.items()}

    def send_many(
        self, bodies: Iterable[Sequence[bytes]], *, keys: Iterable[bytes | str] | None = None
    ) -> list[ProduceResult]:
        """Send every body (a list of frames) and wait for every ack; results in sending order (a failed
        shard's messages: ``ok`` False, the error naming the shard). ``keys``: one per body, each message
        to the place its key hashes to (the same key, the same place, while the list and K stay)."""
        results: list[ProduceResult] = []
        messages = iter(bodies)
        named = iter(keys) if keys is not None else None
        while True:  # (in rounds of a few batches a shard, so that a long input is not held whole)
            where = self.cluster.locate(self.queue, partitions=self.partitions)
            round_size = self.batch * self.window * ROUND_WINDOWS * len(where.produce_to)
            chunk = list(itertools.islice(messages, round_size))
            if not chunk:
                return results
            given = None if named is None else list(itertools.islice(named, len(chunk)))
            if given is not None and len(given) != len(chunk):
                raise ValueError("send_many: give one key per body")
            results += self._round(chunk, self._assign(len(chunk), where.produce_to, given))

    def _assign(self, count: int, places: Sequence[tuple[str, Shard]], keys: list | None) -> list[Shard]:
        """Each message's shard: by its key's place, else its batch's turn among the places on shards
        that have not failed lately (all of them if every one has)."""
        if keys is not None:
            return [places[spread(key, len(places))][1] for key in keys]
        now = time.monotonic()
        live = [shard for _, shard in places if now - self._down.get(shard.name, -RETRY_S) >= RETRY_S]
        live = live or [shard for _, shard in places]
        shards = []
        for start in range(0, count, self.batch):
            shard = live[self._turn % len(live)]
            self._turn += 1
            shards += [shard] * min(self.batch, count - start)
        return shards

    def _round(self, chunk: list[Sequence[bytes]], shards: list[Shard]) -> list[ProduceResult]:
        by_shard: dict[str, list[int]] = {}
        for at, shard in enumerate(shards):
            by_shard.setdefault(shard.name, []).append(at)
        # (each in a copy of this context: a `pzq` command's patience, reach.impatient, holds in the threads)
        futures = {
            name: self._pool.submit(
                contextvars.copy_context().run, self._send, self.cluster.shards.named(name), [chunk[i] for i in at]
            )
            for name, at in by_shard.items()
        }
        out: list[ProduceResult | None] = [None] * len(chunk)
        for name, future in futures.items():
            for i, result in zip(by_shard[name], future.result(), strict=True):
                out[i] = result
        return [r for r in out if r is not None]

    def _send(self, shard: Shard, bodies: list[Sequence[bytes]]) -> list[ProduceResult]:
        """One shard's part (in a pool thread: only this shard's Producer is used here)."""
        try:
            if not shard.receive_dsn:
                raise ClientError("the shard list gives it no receive_dsn")
            producer = self._producers.get(shard.name)
            if producer is None:
                producer = self._producers[shard.name] = Producer(
                    shard.receive_dsn, timeout_s=self.timeout_s, curve=self.cluster.curve
                )
            return producer.send_many(bodies, batch=self.batch, window=self.window)
        except (ClientError, zmq.ZMQError) as exc:
            self._down[shard.name] = time.monotonic()
            lost = self._producers.pop(shard.name, None)  # (a new one next time: this one's pipe holds the dead)
            if lost is not None:
                lost.close()
            return [ProduceResult(b"", False, f"shard {shard.name}: {exc}") for _ in bodies]


class ShardedConsumer:
    """Reads a queue from every shard that has some of it (the shards of ``consume_from``), in turn: a
    ``BatchConsumer`` per shard on its consume_dsn (the send_dsn where it has none), acks and nacks each
    to the shard its message came from. A shard that cannot be reached is left out and tried again every
    ``RETRY_S``; it blocks none of the others.

    ``receive(most)`` grants each shard's consumer credit for up to ``most`` (and ``prefetch`` more): a
    round takes at most that many from each shard; what is not returned yet is returned by the next calls
    (or goes back to its queue at ``close``)."""

    def __init__(
        self,
        cluster: Cluster,
        queue: str = "default",
        *,
        prefetch: int = 0,
        hello_timeout_s: float = 1.0,
        partitions: int = 0,
    ):
        self.cluster = cluster
        self.queue = queue
        self.prefetch = prefetch
        self.hello_timeout_s = hello_timeout_s
        self.partitions = partitions
        self.consumers: dict[str, BatchConsumer] = {}
        self.errors: dict[str, str] = {}  # shard name -> why it is left out, for now
        self.sent_us: dict[bytes, int] = {}  # when the server sent each message the last receive returned
        self._down: dict[str, float] = {}
        self._why: dict[str, Exception] = {}
        self._from: dict[bytes, str] = {}  # each key returned and not yet settled -> its shard's name
        self._turn = 0
        self._refresh()
        if not self.consumers and self.errors:
            # (nothing listens at any of them: said as such, the exit status a `pzq` command gives it)
            kind = NotListening if all(isinstance(e, NotListening) for e in self._why.values()) else ClientError
            raise kind(f"no shard of {queue!r} could be reached: " + "; ".join(self.errors.values()))

    def close(self) -> None:
        for consumer in self.consumers.values():
            consumer.close()
        self.consumers.clear()

    def __enter__(self) -> ShardedConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def shard_of(self, key: bytes) -> str | None:
        """The shard a message returned (and not yet settled) came from."""
        return self._from.get(key)

    def _refresh(self) -> None:
        """A consumer for each shard of the queue that has none (unless it failed within RETRY_S)."""
        now = time.monotonic()
        for shard in self.cluster.locate(self.queue, partitions=self.partitions).shards("consume_from"):
            if shard.name in self.consumers or now - self._down.get(shard.name, -RETRY_S) < RETRY_S:
                continue
            try:
                self.consumers[shard.name] = BatchConsumer(
                    shard.consume_dsn or None,
                    fallback=None if shard.consume_dsn else shard.send_dsn or None,
                    hello_timeout_s=self.hello_timeout_s,
                    curve=self.cluster.curve,
                    prefetch=self.prefetch,
                )
                self.errors.pop(shard.name, None)
            except (ClientError, zmq.ZMQError) as exc:
                self._fail(shard.name, exc)

    def _fail(self, name: str, exc: Exception) -> None:
        self._down[name] = time.monotonic()
        self._why[name] = exc
        self.errors[name] = f"shard {name}: {exc}"
        lost = self.consumers.pop(name, None)
        if lost is not None:
            try:
                lost.close()
            except zmq.ZMQError:
                pass

    def receive(self, most: int = 100, *, timeout_s: float = 10.0) -> list[Message]:
        """Up to ``most`` messages as (key, body frames), all from one shard, the shards in turn; [] if
        none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._refresh()
            names = list(self.consumers)
            start = self._turn % max(1, len(names))
            order = names[start:] + names[:start]
            # (what is already here first, then the sockets the poll finds with something to read)
            got = self._first(names, order, most, 0.0)
            if not got and order:
                ready = self._poll(order, deadline)
                # (nothing ready: each still waits a millisecond, in which it says "still here" when that is
                # due, or its server takes its credit back and forgets it while the queue is empty)
                got = self._first(names, [n for n in order if n in ready] or order, most, 0.05 if ready else 0.001)
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            if not names:
                time.sleep(min(left, RETRY_S / 10))  # (every shard is left out: ask for them again soon)

    def _first(self, names: list[str], order: list[str], most: int, wait: float) -> list[Message]:
        """The first of ``order`` that has messages, its turn taken (the next receive starts after it)."""
        for name in order:
            got = self._take(name, most, wait)
            if got:
                self._turn = names.index(name) + 1
                return got
        return []

    def _poll(self, names: list[str], deadline: float) -> set[str]:
        """The shards whose sockets have something to read, waiting until ``deadline`` (or RETRY_S:
        then shards left out are tried again; or a third of a server's idle time)."""
        poller = zmq.Poller()
        socks = {}
        for name in names:
            socks[self.consumers[name].sock] = name
            poller.register(self.consumers[name].sock, zmq.POLLIN)
        # (back at least every third of the shortest idle time a server allows, to say "still here")
        idle = [c.limits.idle_us / 3e6 for c in self.consumers.values() if c.limits is not None]
        wait = max(0.0, min(deadline - time.monotonic(), RETRY_S, *idle))
        return {socks[sock] for sock, _ in poller.poll(round(wait * 1000))}

    def _take(self, name: str, most: int, wait: float) -> list[Message]:
        consumer = self.consumers[name]
        try:
            got = consumer.receive(most, timeout_s=wait)
        except (ClientError, zmq.ZMQError) as exc:
            self._fail(name, exc)
            return []
        if got:
            self.sent_us = dict(consumer.sent_us)
            self._from.update((key, name) for key, _ in got)
        return got

    def ack(self, keys: Sequence[bytes], *, timeout_s: float = 10.0) -> Settled:
        """Delete these messages, each on its shard (every shard's ACK sent first, then their answers
        awaited): how many were, and the keys refused (a shard that failed: all its keys)."""
        return self._settle(keys, timeout_s, ok=True)

    def nack(self, keys: Sequence[bytes], *, timeout_s: float = 10.0) -> Settled:
        """Put these messages back at the head of their queues, each on its shard."""
        return self._settle(keys, timeout_s, ok=False)

    def _settle(self, keys: Sequence[bytes], timeout_s: float, *, ok: bool) -> Settled:
        by_shard: dict[str, list[bytes]] = {}
        refused: list[bytes] = []
        for key in keys:
            name = self._from.pop(key, None)
            if name is None or name not in self.consumers:
                refused.append(key)
            else:
                by_shard.setdefault(name, []).append(key)
        count = 0
        if ok:
            for name, part in list(by_shard.items()):
                try:
                    self.consumers[name].ack_async(part, timeout_s=timeout_s)
                except (ClientError, zmq.ZMQError) as exc:
                    self._fail(name, exc)
        for name, part in by_shard.items():
            try:
                if name not in self.consumers:
                    raise ClientError("left out")
                consumer = self.consumers[name]
                done = consumer.settle(timeout_s=timeout_s) if ok else consumer.nack(part, timeout_s=timeout_s)
            except (ClientError, zmq.ZMQError) as exc:
                if name in self.consumers:
                    self._fail(name, exc)
                refused += part
                continue
            count += done.count
            refused += done.refused
        return Settled(count, refused)
