"""The native producer over a cluster's shards (docs/cluster.md): ``ShardedProducer``, a batched
``Producer`` per shard, each fed from a thread of its own (a lane), so that a shard that stops answering
holds only the batches it has (the others take the rest). The consumer is in ``cluster_consume``.

A shard's native sockets serve one queue, its ``--queue`` (docs/protocols.md), the same on every shard of
a cluster: these clients move that queue's messages, spread over the shards of its places (a shard
holding two of its partitions takes two shares); what the API (``ClusterApi``) stores in ``Q#i`` is read
by the API and Spark, not here.

    cluster = Cluster.from_file("shards.toml")
    with ShardedProducer(cluster, "default") as producer:
        results = producer.send_many([[b"one"], [b"two"]])          # per message, in order
"""

from __future__ import annotations

import contextvars
import itertools
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import cast

import zmq

from pzq.clients.cluster import Cluster, spread
from pzq.clients.native import Producer, ProduceResult
from pzq.errors import ClientError
from pzq.shards import Shard

RETRY_S = 3.0  # a shard that failed is left out (unkeyed messages; a consumer's turn) this long, then tried again
LANE_BATCHES = 2  # batches waiting for a shard's producer to take them (beyond its window in flight)
STALL_S = 0.2  # a lane full this long without taking a chunk is passed over by unkeyed batches until it takes one
HAND_WAIT_S = 0.05  # how often a hand-on that waits for a full lane looks whether it failed

Chunk = list[tuple[int, Sequence[bytes]]]  # (index in the caller's order, body)
_NONE: object = object()  # (a body or key missing: the two iterables differ in length)


class _Lane:
    """One shard's part of a ``send_many``: a thread hands its chunks to the shard's Producer as they
    come; ``sent`` is the indices in the order the producer took them (its results' order)."""

    def __init__(self, owner: ShardedProducer, shard: Shard):
        self.owner = owner
        self.shard = shard
        self.chunks: queue.Queue[Chunk | None] = queue.Queue(maxsize=LANE_BATCHES)
        self.sent: list[int] = []
        self.results: list[ProduceResult] = []
        self.error = ""
        self.crash: Exception | None = None
        self.full_since: float | None = None  # when a hand-on first found it full since it last took a chunk
        self.done = threading.Event()
        # (in a copy of this context: a `pzq` command's patience, reach.impatient, holds in the thread)
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(self._run,), daemon=True)
        self.thread.start()

    def _bodies(self) -> Iterator[Sequence[bytes]]:
        while (chunk := self.chunks.get()) is not None:
            self.full_since = None
            if self.chunks.empty():  # (a hand-on waiting is woken once the lane is empty, not at each chunk)
                self.owner.room.set()
            self.sent += [at for at, _ in chunk]  # (taken whole: on a failure, all of it is the shard's)
            for _, body in chunk:
                yield body

    def _run(self) -> None:
        try:
            producer = self.owner.producer(self.shard)
            self.results = producer.send_many(self._bodies(), batch=self.owner.batch, window=self.owner.window)
        except (ClientError, zmq.ZMQError) as exc:
            self.error = f"shard {self.shard.name}: {exc}"
            self.owner.lost(self.shard.name)
        except Exception as exc:  # (a ConfigError, or a fault of ours: raised again in the caller's thread)
            self.error = f"shard {self.shard.name}: {exc}"
            self.crash = exc
        finally:
            self.done.set()
            self.owner.room.set()

    def offer(self, chunk: Chunk, *, wait: bool) -> bool:
        """Hand ``chunk`` on: False if the lane failed, or is full and ``wait`` is False."""
        while not self.done.is_set():
            try:
                self.chunks.put(chunk, timeout=HAND_WAIT_S) if wait else self.chunks.put_nowait(chunk)
                return True
            except queue.Full:
                if self.full_since is None:
                    self.full_since = time.monotonic()
                if not wait:
                    return False
        return False

    def stalled(self, now: float) -> bool:
        """Full for the producer's ``stall_s`` without taking a chunk: its shard stopped answering (or is
        slower than the rest)."""
        return self.full_since is not None and now - self.full_since >= self.owner.stall_s

    def finish(self) -> list[tuple[int, ProduceResult]]:
        """End the lane, wait for its acks: (index, result) of every message handed to it."""
        while not self.done.is_set():
            try:
                self.chunks.put(None, timeout=HAND_WAIT_S)
                break
            except queue.Full:
                continue
        self.thread.join()
        if not self.error:
            return list(zip(self.sent, self.results, strict=True))
        unsent = []  # (handed on, never taken: a failed lane's queue)
        while not self.chunks.empty():
            unsent += [at for at, _ in self.chunks.get_nowait() or ()]
        return [(at, ProduceResult(b"", False, self.error)) for at in [*self.sent, *unsent]]


class ShardedProducer:
    """Sends a queue's messages over the shards of its places: each batch of ``batch`` messages to the
    next place in turn whose shard has room for it, or each message to the place its key hashes to. A
    shard's messages go through that shard's own batched ``Producer``, every shard at once: a batch sent
    again after a lost ack goes again to the shard it went to (batch ids are per shard). A shard that
    stops answering holds only the batches it was handed (``window`` in flight and ``LANE_BATCHES``
    waiting): the next unkeyed batches go to the others; if it fails (no ack within ``timeout_s``, twice)
    its messages' results say so, and it takes no unkeyed batch for ``RETRY_S``. Not thread-safe."""

    def __init__(
        self,
        cluster: Cluster,
        queue: str = "default",
        *,
        timeout_s: float = 10.0,
        batch: int = 100,
        window: int = 4,
        partitions: int = 0,
        stall_s: float = STALL_S,
    ):
        """``stall_s``: how long the next shard in turn may take no batch before unkeyed batches go on to
        the others (a shard slower than that for a moment takes fewer of them meanwhile)."""
        self.cluster = cluster
        self.queue = queue
        self.timeout_s = timeout_s
        self.stall_s = stall_s
        self.batch = max(1, batch)
        self.window = max(1, window)
        self.partitions = partitions
        self._producers: dict[str, Producer] = {}
        self._down: dict[str, float] = {}  # shard name -> when it last failed
        self._turn = 0
        self.room = threading.Event()  # a lane took a chunk (or ended): a hand-on waiting may look again

    def close(self) -> None:
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

    def producer(self, shard: Shard) -> Producer:
        """(A lane's thread, the only one using it meanwhile.) The shard's Producer, made when first needed."""
        self.cluster.check(shard)  # (a server that answered as another shard: nothing goes to it)
        producer = self._producers.get(shard.name)
        if producer is None:
            if not shard.receive_dsn:
                raise ClientError("the shard list gives it no receive_dsn")
            producer = Producer(shard.receive_dsn, timeout_s=self.timeout_s, curve=self.cluster.curve)
            self._producers[shard.name] = producer
        return producer

    def lost(self, name: str) -> None:
        """(A lane's thread.) The shard failed: left out of unkeyed turns for a while, its Producer closed
        (a new one next time: this one's pipe holds what the dead shard never took)."""
        self._down[name] = time.monotonic()
        producer = self._producers.pop(name, None)
        if producer is not None:
            producer.close()

    def send_many(
        self, bodies: Iterable[Sequence[bytes]], *, keys: Iterable[bytes | str] | None = None
    ) -> list[ProduceResult]:
        """Send every body (a list of frames) and wait for every ack; results in sending order (a failed
        shard's messages: ``ok`` False, the error naming the shard). ``keys``: one per body, each message
        to the place its key hashes to (the same key, the same place, while the list and K stay)."""
        places = self.cluster.locate(self.queue, partitions=self.partitions, place=True).places()
        if keys is None and len(places) == 1:  # (one place: its Producer alone, in this thread, as with one server)
            return self._send_to(places[0][1], bodies)
        lanes: dict[str, _Lane] = {}
        failed: list[tuple[int, ProduceResult]] = []
        count = 0
        try:
            if keys is None:
                for chunk in _chunks(enumerate(bodies), self.batch):
                    count += len(chunk)
                    failed += self._hand_in_turn(chunk, lanes)
            else:
                count = self._hand_by_key(bodies, keys, lanes, failed)
        finally:
            done = [pair for lane in lanes.values() for pair in lane.finish()]
        crashed = [lane.crash for lane in lanes.values() if lane.crash is not None]
        if crashed:
            raise crashed[0]
        out: list[ProduceResult | None] = [None] * count
        for at, result in [*done, *failed]:
            out[at] = result
        return [r if r is not None else ProduceResult(b"", False, "not sent") for r in out]

    def _send_to(self, shard: Shard, bodies: Iterable[Sequence[bytes]]) -> list[ProduceResult]:
        """Every body to ``shard``; if it fails, every one (those not sent yet too) refused naming it."""
        taken = 0
        left = iter(bodies)

        def counted() -> Iterator[Sequence[bytes]]:
            nonlocal taken
            for body in left:
                taken += 1
                yield body

        try:
            return self.producer(shard).send_many(counted(), batch=self.batch, window=self.window)
        except (ClientError, zmq.ZMQError) as exc:
            self.lost(shard.name)
            rest = sum(1 for _ in left)  # (read on, and refused: the caller gets a result for each)
            return [ProduceResult(b"", False, f"shard {shard.name}: {exc}")] * (taken + rest)

    def _lane(self, shard: Shard, lanes: dict[str, _Lane]) -> _Lane:
        if shard.name not in lanes:
            lanes[shard.name] = _Lane(self, shard)
        return lanes[shard.name]

    def _hand_in_turn(self, chunk: Chunk, lanes: dict[str, _Lane]) -> list[tuple[int, ProduceResult]]:
        """Hand an unkeyed chunk to the next place in turn, waiting for its room unless it stalled (then
        to any with room); a failed one is passed. Past every shard failing: the chunk's results."""
        places = self.cluster.locate(self.queue, partitions=self.partitions, place=True).places()
        now = time.monotonic()
        order = [places[(self._turn + i) % len(places)][1] for i in range(len(places))]
        live = [s for s in order if now - self._down.get(s.name, -RETRY_S) >= RETRY_S] or order
        while True:
            self.room.clear()  # (set by a lane taking a chunk, or ending: then look again)
            now = time.monotonic()
            moving = [s for s in live if not self._lane(s, lanes).done.is_set()]
            if not moving:
                break
            # (the next in turn that is not stalled waits for room, as one producer's window does; a stalled
            # one is passed: then any lane with room takes the chunk)
            turn = [s for s in moving if not lanes[s.name].stalled(now)][:1]
            for shard in turn or moving:
                if lanes[shard.name].offer(chunk, wait=False):
                    self._turn += order.index(shard) + 1
                    return []
            self.room.wait(HAND_WAIT_S)
        errors = "; ".join(lanes[s.name].error for s in live if lanes[s.name].error)
        return [(at, ProduceResult(b"", False, errors or "no shard took it")) for at, _ in chunk]

    def _hand_by_key(self, bodies, keys, lanes: dict[str, _Lane], failed: list[tuple[int, ProduceResult]]) -> int:
        """Hand each message to its key's place, a batch a shard at a time; the count handed."""
        waiting: dict[str, Chunk] = {}
        count = 0
        for at, (body, key) in enumerate(itertools.zip_longest(bodies, keys, fillvalue=_NONE)):
            if body is _NONE or not isinstance(key, str | bytes):
                raise ValueError("send_many: give one key (str or bytes) per body")
            places = self.cluster.locate(self.queue, partitions=self.partitions, place=True).places()
            shard = places[spread(key, len(places))][1]
            waiting.setdefault(shard.name, []).append((at, cast(Sequence[bytes], body)))
            count += 1
            if len(waiting[shard.name]) >= self.batch:
                self._hand_to(shard, waiting.pop(shard.name), lanes, failed)
        for name, chunk in waiting.items():
            self._hand_to(self.cluster.shards.named(name), chunk, lanes, failed)
        return count

    def _hand_to(
        self, shard: Shard, chunk: Chunk, lanes: dict[str, _Lane], failed: list[tuple[int, ProduceResult]]
    ) -> None:
        lane = self._lane(shard, lanes)
        if not lane.offer(chunk, wait=True):
            failed += [(at, ProduceResult(b"", False, lane.error)) for at, _ in chunk]


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk
