"""The native consumer over a cluster's shards (docs/cluster.md): ``ShardedConsumer``, a ``BatchConsumer``
per shard that has some of the queue, read in turn; each consumer is made in a thread of its own, so
that a shard that does not answer its HELLO keeps none of the others waiting.

    with ShardedConsumer(Cluster.from_file("shards.toml"), "default") as consumer:
        while batch := consumer.receive(100, timeout_s=5):
            consumer.ack([key for key, _ in batch])                  # each to the shard it came from
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import time
from collections.abc import Sequence

import zmq

from pzq.clients.cluster import Cluster
from pzq.clients.cluster_native import RETRY_S
from pzq.clients.native import BatchConsumer
from pzq.clients.native_consume import Message
from pzq.errors import AnswerLost, ClientError, NotListening
from pzq.protocols.native_consume import Settled
from pzq.shards import Shard

READ_S = 0.05  # a consumer whose socket has something: the most its receive waits for a whole DELIVER
MADE_LOOK_S = 0.05  # how often a receive looks whether a shard's consumer being made (its HELLO) is there


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
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="pzq-hello")
        self._making: dict[str, concurrent.futures.Future[BatchConsumer]] = {}
        self._poller = zmq.Poller()
        self._polled: dict[zmq.Socket, str] = {}  # the sockets ``_poller`` has, by shard name
        self._refresh(wait=True)
        if not self.consumers and self.errors:
            # (nothing listens at any of them: said as such, the exit status a `pzq` command gives it)
            kind = NotListening if all(isinstance(e, NotListening) for e in self._why.values()) else ClientError
            self._pool.shutdown()
            raise kind(f"no shard of {queue!r} could be reached: " + "; ".join(self.errors.values()))

    def close(self) -> None:
        """Close every shard's consumer (what each holds goes back to its queue at once)."""
        self._pool.shutdown(wait=True)
        self._take_made()
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

    def _refresh(self, *, wait: bool = False) -> None:
        """A consumer for each shard of the queue that has none (unless it failed within RETRY_S), each
        made in a thread (its HELLO waits up to ``hello_timeout_s``); those made since are taken in
        (``wait``: once every one being made is)."""
        now = time.monotonic()
        for shard in self.cluster.locate(self.queue, partitions=self.partitions).shards("consume_from"):
            name = shard.name
            if name in self.consumers or name in self._making or now - self._down.get(name, -RETRY_S) < RETRY_S:
                continue
            # (in a copy of this context: a `pzq` command's patience, reach.impatient, holds in the thread)
            self._making[name] = self._pool.submit(contextvars.copy_context().run, self._make, shard)
        if wait:
            concurrent.futures.wait(self._making.values())
        self._take_made()

    def _take_made(self) -> None:
        for name, future in list(self._making.items()):
            if future.done():
                del self._making[name]
                try:
                    self.consumers[name] = future.result()
                    self.errors.pop(name, None)
                except (ClientError, zmq.ZMQError) as exc:
                    self._fail(name, exc)

    def _make(self, shard: Shard) -> BatchConsumer:
        self.cluster.check(shard)  # (a server that answered as another shard: not read as this one)
        return BatchConsumer(
            shard.consume_dsn or None,
            fallback=None if shard.consume_dsn else shard.send_dsn or None,
            hello_timeout_s=self.hello_timeout_s,
            curve=self.cluster.curve,
            prefetch=self.prefetch,
        )

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
            # (in turn, the first with messages here or on its socket; then wait for a socket)
            ready = self._poll(order, 0.0)  # (a deadline past: no wait)
            got = self._first(names, order, most, 0.0, ready)
            if not got and order:
                ready = self._poll(order, deadline)
                # (nothing ready: each still waits a millisecond, in which it says "still here" when that is
                # due, or its server takes its credit back and forgets it while the queue is empty)
                got = self._first(names, [n for n in order if n in ready] or order, most, 0.001, ready)
            if got:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            if not names:
                time.sleep(min(left, RETRY_S / 10))  # (every shard is left out: ask for them again soon)

    def _first(self, names: list[str], order: list[str], most: int, wait: float, ready: set[str]) -> list[Message]:
        """The first of ``order`` that has messages (read from its socket if ``ready``, else waiting
        ``wait``), its turn taken (the next receive starts after it)."""
        for name in order:
            got = self._take(name, most, READ_S if name in ready else wait)
            if got:
                self._turn = names.index(name) + 1
                return got
        return []

    def _poll(self, names: list[str], deadline: float) -> set[str]:
        """The shards whose sockets have something to read, waiting until ``deadline`` (or RETRY_S:
        then shards left out are tried again; or a third of a server's idle time)."""
        # (each consumer's socket and its monitor: a dropped connection wakes it, to start afresh at once)
        socks = {sock: name for name in names for sock in self.consumers[name].sockets()}
        if self._polled != socks:  # (made again only when the sockets change: a receive polls twice)
            self._poller = zmq.Poller()
            for sock in socks:
                self._poller.register(sock, zmq.POLLIN)
            self._polled = socks
        wait = 0.0
        if deadline > 0:
            # (back at least every third of the shortest idle time a server allows, to say "still here")
            idle = [c.limits.idle_us / 3e6 for c in self.consumers.values() if c.limits is not None]
            # (and soon while a shard's consumer is being made: it is read as soon as it is there)
            making = [MADE_LOOK_S] if self._making else []
            wait = max(0.0, min(deadline - time.monotonic(), RETRY_S, *idle, *making))
        return {socks[sock] for sock, _ in self._poller.poll(round(wait * 1000))}

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
        awaited): how many were, and the keys refused (a shard that failed, or whose connection dropped
        before it answered: all its keys, settled or not)."""
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
            except AnswerLost:  # (its connection dropped: the consumer started afresh, the keys in doubt)
                refused += part
                continue
            except (ClientError, zmq.ZMQError) as exc:
                if name in self.consumers:
                    self._fail(name, exc)
                refused += part
                continue
            count += done.count
            refused += done.refused
        return Settled(count, refused)
