"""A cluster of shards as clients see it (docs/cluster.md): the shard list, where a queue lives on it
(``Cluster.locate``), and the API's PRODUCE routed by queue (``ClusterApi``). The native producer over
every shard is in ``cluster_native``, the consumer in ``cluster_consume``.

    cluster = Cluster.from_file("/etc/pzq/shards.toml")      # or Cluster.from_server("tcp://host:11133")
    where = cluster.locate("orders")                          # asked of every shard, cached a few seconds
    where.produce_to   # [(queue name, Shard)]: its places (Q, or Q#0 .. Q#K-1) on the list
    where.consume_from # the places, and every queue of Q some shard reports it holds (a seed client's)

Where a queue lives is the list's placement (pzq.shards: rendezvous hashing) for its partition count
K, and K is what the shards keep: each is asked WHERE on its API socket, all at once, with a second to
answer; K is the largest any reports (0 or 1: the queue alone on its home). A shard that does not answer
keeps its places (a producer's messages for them wait or fail there: they are never moved elsewhere by
the locator) and is asked again once the answer's cache (``cache_s``) runs out. A server without WHERE
(older than the shards) answers an error, taken as "keeps no count, holds nothing": placement then
follows the list and the caller's ``partitions`` alone. A server whose WHERE names another shard than
the list's entry it was reached by (an entry copied from another's, a shard of another cluster) is
``wrong``: its answer is not believed, and no client of the cluster produces to it or reads it (the
error names both), since what it stored would be on a shard the queue does not live on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import time
import uuid

import zmq

from pzq.clients.sockets import Curve, connect
from pzq.errors import ClientError, ConfigError, PzqError
from pzq.protocols import api
from pzq.shards import MAX_PARTITIONS, Shard, ShardList, load, partition_of

WHERE_TIMEOUT_S = 1.0  # each shard's time to answer WHERE (asked all at once: the whole locate's wait)
CACHE_S = 3.0  # how long a located queue is used before the shards are asked again
# WHEREs in flight to one shard: a server's pipe to a client holds 2 replies (Limits.api_replies_unread),
# and it drops unanswered the requests of a client that has more coming than it reads
WHERE_WINDOW = 2
PLACE_POLL_S = 0.05  # how often a producer asks again while etcd places a new queue (a few ms, usually)
BEING_PLACED = "being placed in etcd"
WHERE_SHARDS = 256  # shards asked at once (a socket each: libzmq has 1,023 a context, a process 1,024 files often)


@dataclasses.dataclass(frozen=True)
class Location:
    """Where ``queue`` lives: ``produce_to`` (its places), ``consume_from`` (the places, and what shards
    hold of it beyond them), its ``partitions`` count, and the shards that did not answer."""

    queue: str
    partitions: int
    produce_to: tuple[tuple[str, Shard], ...]
    consume_from: tuple[tuple[str, Shard], ...]
    unreachable: tuple[str, ...] = ()
    wrong: tuple[str, ...] = ()  # the shards whose server answered as another (``Cluster.wrong`` says why;
    # in ``unreachable`` too)
    unplaced: str = ""  # a cluster kept in etcd with no placement of the queue yet: why (no ``produce_to``)

    def places(self) -> tuple[tuple[str, Shard], ...]:
        """``produce_to``, or ClientError naming why the queue has no places (etcd has not placed it)."""
        if not self.produce_to:
            raise ClientError(f"queue {self.queue!r} has no place to produce to: {self.unplaced or 'no shard'}")
        return self.produce_to

    def shards(self, which: str = "consume_from") -> list[Shard]:
        """The distinct shards of ``produce_to`` or ``consume_from``, in their first place's order."""
        seen: dict[str, Shard] = {}
        for _, shard in getattr(self, which):
            seen.setdefault(shard.name, shard)
        return list(seen.values())


class Cluster:
    """The shards a client talks to, and where queues live on them (``locate``)."""

    def __init__(
        self,
        shards: ShardList,
        *,
        curve: Curve | None = None,
        where_timeout_s: float = WHERE_TIMEOUT_S,
        cache_s: float = CACHE_S,
    ):
        self.shards = shards
        self.curve = curve
        self.where_timeout_s = where_timeout_s
        self.cache_s = cache_s
        self._cache: dict[tuple[str, int], tuple[float, Location]] = {}
        self._asking: set[tuple[str, int]] = set()  # entries being asked again in the background
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.wrong: dict[str, str] = {}  # shard name -> why its server is not it (its WHERE named another)

    def check(self, shard: Shard) -> None:
        """ClientError if ``shard``'s server answered WHERE as another shard: nothing is sent to it."""
        why = self.wrong.get(shard.name)
        if why is not None:
            raise ClientError(why)

    @classmethod
    def from_file(cls, path: str, **kwargs) -> Cluster:
        """The cluster of the shard list at ``path`` (TOML ``[[shard]]`` tables; ConfigError in one line)."""
        return cls(load(path), **kwargs)

    @classmethod
    def from_server(cls, api_dsn: str, *, queue: str = "default", **kwargs) -> Cluster:
        """The cluster a server's WHERE names (any shard's API endpoint will do); ClientError if it does
        not answer, ConfigError if it is no shard of a list."""
        probe = cls(ShardList((Shard("-", api_dsn=api_dsn),)), **kwargs)
        answer = probe._ask_where([queue], probe=True)[queue]["-"]
        if answer is None:
            raise ClientError(f"no answer to WHERE from {api_dsn} within {probe.where_timeout_s:g} s")
        if not answer.get("shards"):
            raise ConfigError(f"the server at {api_dsn} names no shard list: it is not a shard of a cluster")
        listed = ShardList.from_dict(answer["shards"], f"the shard list of {api_dsn}")
        if answer.get("shard") not in listed.names():
            raise ConfigError(f"the server at {api_dsn} is shard {answer.get('shard')!r}, not in the list it gives")
        return cls(listed, **kwargs)

    def locate(self, queue: str, *, partitions: int = 0, fresh: bool = False, place: bool = False) -> Location:
        """Where ``queue`` lives. ``partitions``: a count the caller knows (the larger of it and the
        shards' is used: a server without WHERE reports none). Asked once, then for ``cache_s`` the answer
        is used as it is; past that it is still used while the shards are asked again in the background
        (a shard that is down costs a locate its second only once, not every ``cache_s``); ``fresh``
        asks now and waits. ``place``: a producer's, in a cluster kept in etcd: a queue not placed yet is
        placed (waiting up to ``where_timeout_s``; ``Location.places()`` says why when it could not be)."""
        cached = self._cache.get((queue, partitions))
        if cached is None or fresh or (place and cached[1].unplaced):
            return self.locate_many([queue], partitions=partitions, place=place)[queue]
        if time.monotonic() - cached[0] >= self.cache_s and (queue, partitions) not in self._asking:
            self._asking.add((queue, partitions))
            self._background().submit(self._ask_again, queue, partitions)
        return cached[1]

    def known(self, queue: str, partitions: int = 0) -> bool:
        """True when ``queue`` was located (``locate`` answers it at once)."""
        return (queue, partitions) in self._cache

    def locate_many(self, queues: list[str], *, partitions: int = 0, place: bool = False) -> dict[str, Location]:
        """``locate`` for several queues at once, asking now (every queue's WHERE in one round; with
        ``place``, the queues etcd has not placed asked again every PLACE_POLL_S while it places them)."""
        wanted = list(dict.fromkeys(queues))
        deadline = time.monotonic() + self.where_timeout_s
        out: dict[str, Location] = {}
        while wanted:
            answers = self._ask_where(wanted, place=place)
            now = time.monotonic()
            for queue in wanted:
                out[queue] = self._location(queue, partitions, answers[queue])
                self._cache[(queue, partitions)] = (now, out[queue])
            wanted = [q for q in wanted if place and out[q].unplaced.startswith(BEING_PLACED)]
            if wanted and now + PLACE_POLL_S >= deadline:
                break
            time.sleep(PLACE_POLL_S if wanted else 0)
        return out

    def close(self) -> None:
        """Wait for a locate asking in the background (at most ``where_timeout_s``)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _background(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pzq-locate")
        return self._pool

    def _ask_again(self, queue: str, partitions: int) -> None:
        """(In the background thread: its own sockets.) The cache's entry for ``queue`` asked again; on a
        failure the old one stays, asked again next time."""
        try:
            self.locate_many([queue], partitions=partitions)
        except (PzqError, zmq.ZMQError):
            pass
        finally:
            self._asking.discard((queue, partitions))

    def _location(self, queue: str, partitions: int, answers: dict[str, dict | None]) -> Location:
        counts = [a.get("partitions") for a in answers.values() if a is not None]
        k = max([partitions, *(c for c in counts if isinstance(c, int) and 0 <= c <= MAX_PARTITIONS)])
        unplaced = ""
        if any(a is not None and "placed" in a for a in answers.values()):  # (a cluster kept in etcd)
            places, unplaced = self._placed(queue, [a for a in answers.values() if a is not None])
            k = len(places) if len(places) > 1 else 0
        else:
            places = tuple(self.shards.place(queue, k))
        consume = list(places)
        for name, answer in answers.items():
            kept = (answer or {}).get("held")
            for held in kept if isinstance(kept, list) else ():  # (anything else: not pzq's answer, ignored)
                held_name = held[0] if isinstance(held, list | tuple) and held else None
                if not isinstance(held_name, str) or not _of(held_name, queue):
                    continue  # (not a queue of Q: an answer from a server we did not mean)
                here = (held_name, self.shards.named(name))
                if here not in consume:
                    consume.append(here)
        # (a wrong shard's answer is None: it is in ``unreachable`` too, so a reader that knows only that
        # field, as the Spark source, takes it as down: its offsets kept, nothing read from it)
        wrong = tuple(name for name in answers if name in self.wrong)
        missing = tuple(name for name, answer in answers.items() if answer is None)
        return Location(queue, k, places, tuple(consume), missing, wrong, unplaced)

    def _placed(self, queue: str, answers: list[dict]) -> tuple[tuple[tuple[str, Shard], ...], str]:
        """The places etcd's placement gives (the shards' WHERE carry it), and "" ; or () and why none."""
        for answer in answers:
            placed = answer.get("placed")
            if not isinstance(placed, list) or not placed:
                continue
            pairs = [p for p in placed if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)]
            if len(pairs) != len(placed) or not all(_of(name, queue) for name, _ in pairs):
                continue  # (not pzq's answer)
            if any(shard not in self.shards.names() for _, shard in pairs):
                self._relist()  # (a shard registered since this client read the list)
            known = set(self.shards.names())
            return tuple((name, self.shards.named(shard)) for name, shard in pairs if shard in known), ""
        if any(answer.get("reachable") for answer in answers):
            return (), f"{BEING_PLACED} (ask again)"
        return (), "not placed yet, and etcd is unreachable from every shard that answered: a new queue waits for it"

    def _relist(self) -> None:
        """The registered shards again, from the first shard whose WHERE answers (etcd's list grows)."""
        for shard in self.shards.shards:
            if shard.api_dsn and shard.name not in self.wrong:
                try:
                    self.shards = Cluster.from_server(
                        shard.api_dsn, curve=self.curve, where_timeout_s=self.where_timeout_s
                    ).shards
                    return
                except PzqError:
                    continue

    def _ask_where(
        self, queues: list[str], *, probe: bool = False, place: bool = False
    ) -> dict[str, dict[str, dict | None]]:
        """Every shard's WHERE answer for each queue (None: no answer in time, or no API endpoint), the
        shards asked at once on one DEALER each, ``WHERE_SHARDS`` at a time (libzmq's sockets and the
        process's files are few: a list of 1,024 at once had failed with "Too many open files"), each a
        second to answer, ``WHERE_WINDOW`` requests in flight on each, as the API lets a client have (a
        round of many queues: a round trip for every two, each shard in parallel; one answered ``busy``
        is asked again). Another error answer (a server without WHERE) is an empty dict."""
        prefix = uuid.uuid4().hex
        ids = {f"{prefix}-{i}".encode(): queue for i, queue in enumerate(queues)}
        # (brief: the list and the places are left out, the client has its own; a ``probe`` of from_server asks
        # for the server's list, and is not judged: its name is the answer's)
        args = ({} if probe else {"brief": 1}) | ({"place": 1} if place else {})
        answers: dict[str, dict[str, dict | None]] = {q: dict.fromkeys(self.shards.names()) for q in queues}
        listed = [shard for shard in self.shards.shards if shard.api_dsn]
        for at in range(0, len(listed), WHERE_SHARDS):
            self._ask_some(listed[at : at + WHERE_SHARDS], ids, args, answers)
        if not probe:
            self._judge(answers)
        return answers

    def _ask_some(self, shards: list[Shard], ids: dict[bytes, str], args: dict, answers: dict) -> None:
        """``_ask_where`` for some of the shards, their answers put in ``answers``."""
        socks: dict[zmq.Socket, str] = {}
        unsent: dict[zmq.Socket, list[bytes]] = {}  # each socket's requests not sent yet, the next last
        try:
            for shard in shards:
                try:
                    sock = connect(zmq.DEALER, shard.api_dsn, curve=self.curve)
                except ClientError:  # (an ipc socket file that is not there: that shard is down)
                    continue
                socks[sock], unsent[sock] = shard.name, list(reversed(ids))
                _send_where(sock, unsent[sock], ids, WHERE_WINDOW, args)
            poller = zmq.Poller()
            for sock in socks:
                poller.register(sock, zmq.POLLIN)
            deadline = time.monotonic() + self.where_timeout_s
            waiting = len(socks) * len(ids)
            while waiting and (left := deadline - time.monotonic()) > 0:
                for sock, _ in poller.poll(max(1, round(left * 1000))):
                    reply = api.parse_reply(sock.recv_multipart())
                    asked = None if reply is None else ids.get(reply[0])
                    if reply is None or asked is None or answers[asked][socks[sock]] is not None:
                        continue
                    if not reply[1] and reply[2].get("code") == "busy":
                        unsent[sock].append(reply[0])  # (asked again, when one of those in flight is answered)
                    else:
                        answers[asked][socks[sock]] = reply[2] if reply[1] else {}
                        waiting -= 1
                    _send_where(sock, unsent[sock], ids, 1, args)
        finally:
            for sock in socks:
                sock.close(linger=0)

    def _judge(self, answers: dict[str, dict[str, dict | None]]) -> None:
        """Each shard whose answers name another shard is ``wrong`` and its answers dropped; one answering
        as itself is right again. (An error answer, a server without WHERE, and one that is no shard,
        naming "", as a list of plain servers has, say nothing either way: the name is only the list's.)"""
        for name in self.shards.names():
            said = {a.get("shard") for q in answers if (a := answers[q][name]) and a.get("shard")}
            if not said:
                continue
            if said == {name}:
                self.wrong.pop(name, None)
                continue
            other = ", ".join(repr(one) for one in sorted(map(str, said - {name})))
            dsn = self.shards.named(name).api_dsn
            self.wrong[name] = (
                f"the shard list's entry {name!r} reaches a server that is shard {other} (WHERE at {dsn}), "
                "not sent to: correct the list"
            )
            for by_shard in answers.values():
                by_shard[name] = None


def _send_where(sock: zmq.Socket, unsent: list[bytes], ids: dict[bytes, str], most: int, args: dict) -> None:
    """Send up to ``most`` of ``unsent`` (taken from its end), each with ``args`` and its queue; a full pipe
    or none: the rest wait (that shard is not answering: its answers stay None)."""
    for _ in range(min(most, len(unsent))):
        request_id = unsent[-1]
        try:
            sock.send_multipart(api.request(request_id, "WHERE", args | {"queue": ids[request_id]}), zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        unsent.pop()


def _of(name: str, queue: str) -> bool:
    """True when ``name`` is ``queue`` or one of its partitions."""
    parted = partition_of(name)
    return name == queue or (parted is not None and parted[0] == queue)


def spread(key: str | bytes, count: int) -> int:
    """A stable index in ``range(count)`` for ``key`` (the same in every process: not Python's hash)."""
    data = key.encode() if isinstance(key, str) else key
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") % max(1, count)
