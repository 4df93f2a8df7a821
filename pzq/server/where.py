"""This server's place in a cluster (docs/cluster.md): the answer to WHERE a queue, the partitions of a
CREATE that are this shard's, and, in a cluster kept in etcd, the check that a PRODUCE's queues are
placed here. The shards come from a shard list (pzq/shards.py) or from etcd (pzq/etcd_registry.py,
whose thread this owns); the loop reads the registry's view, never etcd itself."""

from __future__ import annotations

import collections
import socket
import time
import urllib.parse
from typing import TYPE_CHECKING

from pzq import shards as shards_
from pzq.errors import ProtocolError
from pzq.placement import base_queue
from pzq.store.catalog import Catalog

if TYPE_CHECKING:
    from pzq.config import Config
    from pzq.etcd_registry import EtcdRegistry

PLACES_CACHED = 8_192  # places (queue name, shard name) Where keeps: 1 to 3 MB at most (names of 255 bytes)


class Where:
    """This server's shard name ("" when it is none), the shard list it read (None without one) or the
    etcd registry it keeps, and the answer to WHERE a queue (called by the API and the monitor)."""

    def __init__(
        self, shard: str, shards: shards_.ShardList | None, catalog: Catalog, registry: EtcdRegistry | None = None
    ) -> None:
        self.shard, self.shards, self._catalog, self.registry = shard, shards, catalog, registry
        self._listed = shards.to_dict() if shards is not None else None  # (the same in every answer)
        # (queue, partitions) -> its places, the latest asked last: a list of 1,024 shards took 0.8 ms to
        # place a queue and 1.7 ms one of partitions, each WHERE; bounded by the places it holds in all
        self._places: collections.OrderedDict[tuple[str, int], list[list[str]]] = collections.OrderedDict()
        self._places_held = 0

    def __call__(self, queue: str, place: bool = False) -> dict:
        """WHERE ``queue``; ``place``: a producer's, which places a queue etcd has no placement of."""
        by_name = self._catalog.by_name

        def depth(name: str) -> int | None:
            info = by_name.get(name)
            return None if info is None else info.count

        family = _partitions_held(self._catalog.families.get(queue, set()), queue)
        if self.registry is not None:
            return self._from_registry(self.registry, queue, depth, family, place)
        partitions = self._catalog.partitions.get(queue, 0)
        places = self._placed(self.shards, queue, partitions) if self.shards is not None else None
        return shards_.where_answer(queue, self.shard, self.shards, partitions, depth, self._listed, places, family)

    def _from_registry(self, registry: EtcdRegistry, queue: str, depth, family: list[str], place: bool) -> dict:
        """WHERE from etcd's records: ``placed`` the queue's places (None: not placed yet; with ``place``, it
        is being placed if etcd is reachable: ask again), ``alive`` the shards whose lease holds."""
        view, found = registry.view, registry.placements.get(queue)
        partitions = found.partitions if found is not None else self._catalog.partitions.get(queue, 0)
        answer = shards_.where_answer(queue, self.shard, None, partitions, depth, family=family)
        answer["shards"] = view.listed or []
        answer["placed"] = [list(p) for p in found.places] if found is not None else None
        answer["places"] = answer["placed"] or []
        answer["alive"], answer["reachable"] = sorted(view.alive), view.reachable
        if found is None and place and base_queue(queue) == queue:  # (Q#i is placed with Q, never alone)
            registry.place(queue, partitions)
        return answer

    def here(self, queue: str, count: int) -> list[str]:
        """The partitions of ``queue`` (``count`` of them) that are this shard's to make (a CREATE's):
        where the list or etcd places them; all of them on a server alone. ProtocolError when etcd has no
        placement yet (being placed: ask again, or etcd unreachable) or one of another count."""
        if self.registry is not None:
            found = self.registry.placements.get(queue)
            if found is None:
                raise self._unplaced(self.registry, queue, count)
            if max(found.partitions, 1) != count:
                raise ProtocolError(
                    "wrong-partitions", f"queue {queue!r} is placed with {found.partitions} partitions, not {count}"
                )
            return [name for name, shard in found.places if shard == self.shard]
        if self.shards is not None:
            return [name for name, shard in self.shards.place(queue, count) if shard.name == self.shard]
        return [shards_.partition_name(queue, i) for i in range(count)]

    def check_produce(self, queues: list[str]) -> None:
        """In a cluster kept in etcd: ProtocolError unless each of ``queues`` is held here or placed here
        (``wrong-shard`` naming its shard; ``placing`` while etcd places a new one: ask again; ``unplaced``
        while etcd is away: a new queue waits for it, the known ones go on)."""
        registry = self.registry
        if registry is None:
            return
        for name in queues:
            if name in self._catalog.by_name:
                continue  # (held here: a known queue goes on, whatever etcd says or does not)
            found = registry.placements.get(base_queue(name))
            if found is None:
                raise self._unplaced(registry, name, 0)
            shard = found.shard_of(name)
            if shard != self.shard:
                where = f"lives on shard {shard!r}" if shard else f"is no place of {found.queue!r}'s"
                raise ProtocolError("wrong-shard", f"queue {name!r} {where}, not {self.shard!r}: ask WHERE")

    def _unplaced(self, registry: EtcdRegistry, queue: str, count: int) -> ProtocolError:
        view = registry.view
        if registry.conflict:
            return ProtocolError("unplaced", f"queue {queue!r} is not placed: {registry.conflict}")
        if not view.reachable:
            down = time.monotonic() - (view.down_since or time.monotonic())
            return ProtocolError(
                "unplaced",
                f"queue {queue!r} is not placed and etcd has been unreachable for {down:.0f} s ({view.error}): "
                "a new queue waits for etcd; the known ones go on",
            )
        if registry.full(1024):
            most = registry.max_placements
            return ProtocolError(
                "unplaced", f"queue {queue!r} is not placed: {most} queues are (--max-queues), no more"
            )
        if base_queue(queue) != queue:
            return ProtocolError("unplaced", f"{queue!r}: its queue is not placed: create it with its partitions")
        registry.place(queue, count)
        return ProtocolError("placing", f"queue {queue!r} is being placed in etcd: ask again")

    def start(self) -> None:
        if self.registry is not None:
            self.registry.start()

    def stop(self) -> None:
        if self.registry is not None:
            self.registry.stop()

    def stats(self) -> dict | None:
        """STATS's ``registry`` figures (None without etcd)."""
        return None if self.registry is None else self.registry.stats()

    def _placed(self, listed: shards_.ShardList, queue: str, partitions: int) -> list[list[str]]:
        """Where the list places ``queue``'s ``partitions``, from the cache (PLACES_CACHED places in all)."""
        key = (queue, partitions)
        found = self._places.get(key)
        if found is not None:
            self._places.move_to_end(key)
            return found
        found = [[name, home.name] for name, home in listed.place(queue, partitions)]
        self._places[key] = found
        self._places_held += len(found)
        while self._places_held > PLACES_CACHED:
            _, gone = self._places.popitem(last=False)
            self._places_held -= len(gone)
        return found


def registry_for(cfg: Config, shard: str, store_id: str) -> EtcdRegistry:
    """The etcd registry of this server (its thread not started): the endpoints it registers are its
    own, a wildcard host (``*``, 0.0.0.0) given as this host's name, which clients can reach."""
    from pzq.etcd_registry import EtcdRegistry

    me = shards_.Shard(shard, **{role: _reachable(getattr(cfg, role)) for role in shards_.ENDPOINTS})
    cache = f"{cfg.database.rstrip('/') or '/'}/placements.json"
    tls = (cfg.etcd_ca, cfg.etcd_cert, cfg.etcd_key)
    return EtcdRegistry(cfg.etcd, cfg.etcd_prefix, me, store_id, cache, cfg.max_queues, tls)


def _reachable(dsn: str) -> str:
    if not dsn.startswith("tcp://"):
        return dsn
    host = urllib.parse.urlsplit(dsn.replace("tcp://", "http://", 1)).hostname
    if host in ("*", "0.0.0.0", "::"):
        return dsn.replace(f"//{host}:", f"//{socket.getfqdn()}:", 1).replace("//[::]:", f"//{socket.getfqdn()}:")
    return dsn


def _index(name: str) -> int:
    return int(name.rpartition("#")[2])


def _partitions_held(members: set[str], queue: str) -> list[str]:
    """The names of ``members`` (the catalog's family of ``queue``: ``Q#0`` to ``Q#9999``) a placement can
    give, ``Q#0`` to ``Q#1023`` (shards.MAX_PARTITIONS), in order: at most 1,024 looked up. (A family of
    10,000 names of 255 bytes made a WHERE 8-31 ms of the loop and a 2.6 MB answer; ``Q#1500`` is a queue
    of its own name, which WHERE ``Q#1500`` finds.)"""
    if len(members) <= shards_.MAX_PARTITIONS:
        return sorted((name for name in members if _index(name) < shards_.MAX_PARTITIONS), key=_index)
    named = (shards_.partition_name(queue, i) for i in range(shards_.MAX_PARTITIONS))
    return [name for name in named if name in members]
