"""Placement records: where a queue of a cluster kept in etcd lives (docs/cluster.md). Pure: no socket,
no etcd; the registry thread (pzq/etcd_registry.py) reads and writes these records, the server answers
WHERE and checks PRODUCE from them.

A queue is placed once, by the first server asked to (a producer's WHERE ``place``, a CREATE with its
partitions, a PRODUCE of a queue nobody placed), with a create-if-absent transaction: two servers
placing one queue at once write two records and etcd keeps exactly one, which both then read. The
shards are those registered and alive at that moment, ranked by the shard list's rendezvous hash
(pzq/shards.py), so a placement made again on the same shards is the same. It never changes after: a
shard that is gone keeps its queues (they wait on its disk, as with a static list).
"""

from __future__ import annotations

import dataclasses
import json

from pzq.shards import MAX_PARTITIONS, NAME, Shard, ShardList, partition_of

RECORD_MAX_BYTES = 384 * 1024  # a placement of 1,024 partitions of 255-byte names is ~330 KB
MEMBER_MAX_BYTES = 8 << 10  # a shard's record: five endpoints of under 1,024 bytes, its name and store id
ENDPOINT_KEYS = ("receive_dsn", "send_dsn", "consume_dsn", "api_dsn", "monitor_dsn")


class BadRecord(ValueError):
    """A record read from etcd that is not pzq's (ignored, and logged once by the registry)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """Queue ``queue``: ``partitions`` (0: the queue alone) and its ``places``, ((queue name, shard), ...)."""

    queue: str
    partitions: int
    places: tuple[tuple[str, str], ...]

    def shard_of(self, name: str) -> str | None:
        """The shard that holds ``name`` (the queue, or one of its partitions ``Q#i``), None if not one."""
        for place, shard in self.places:
            if place == name:
                return shard
        return None

    def encode(self) -> bytes:
        return json.dumps({"partitions": self.partitions, "places": [list(p) for p in self.places]}).encode()


def loads(data: bytes) -> object:
    """A record's JSON (BadRecord if it is not JSON, or nested past what json reads: RecursionError)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadRecord(f"not JSON: {str(exc)[:80]}") from None


def decode(queue: str, data: bytes) -> Placement:
    """The placement of ``queue`` in a record's bytes (BadRecord if it is not one)."""
    if len(data) > RECORD_MAX_BYTES:
        raise BadRecord(f"{len(data)} bytes, over {RECORD_MAX_BYTES}")
    raw = loads(data)
    if not isinstance(raw, dict):
        raise BadRecord("not a JSON object")
    count, places = raw.get("partitions"), raw.get("places")
    if not isinstance(count, int) or not 0 <= count <= MAX_PARTITIONS or not isinstance(places, list):
        raise BadRecord("no partitions count or places")
    if len(places) != max(count, 1):
        raise BadRecord(f"{len(places)} places for {count} partitions")
    out = []
    for place in places:
        ok = isinstance(place, list) and len(place) == 2 and all(isinstance(p, str) for p in place)
        if not ok or not NAME.match(place[1]) or not _of(place[0], queue):
            raise BadRecord(f"a place that is not one of {queue!r}'s: {place!r:.80}")
        out.append((place[0], place[1]))
    return Placement(queue, count, tuple(out))


def choose(queue: str, partitions: int, alive: list[Shard]) -> Placement:
    """Where ``queue`` goes on the shards ``alive`` now (ConfigError if none is, or past MAX_PARTITIONS)."""
    places = ShardList(tuple(sorted(alive, key=lambda s: s.name))).place(queue, partitions)
    return Placement(queue, partitions if partitions > 1 else 0, tuple((name, s.name) for name, s in places))


def base_queue(name: str) -> str:
    """The queue a name is of: ``Q`` for ``Q#3``, else the name itself."""
    parted = partition_of(name)
    return parted[0] if parted else name


def _of(name: str, queue: str) -> bool:
    parted = partition_of(name)
    return name == queue or (parted is not None and parted[0] == queue)


def encode_member(shard: Shard, store_id: str) -> bytes:
    """A registered shard's record: its endpoints and the id of the store it serves."""
    return json.dumps({"name": shard.name, **shard.endpoints(), "store_id": store_id}).encode()


def decode_member(data: bytes) -> tuple[Shard, str]:
    """(shard, store id) from a member's record (BadRecord if it is not one)."""
    if len(data) > MEMBER_MAX_BYTES:
        raise BadRecord(f"{len(data)} bytes, over {MEMBER_MAX_BYTES}")
    raw = loads(data)
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not NAME.match(raw["name"]):
        raise BadRecord("no shard name")
    endpoints = {key: raw.get(key, "") for key in ENDPOINT_KEYS}
    if not all(isinstance(value, str) and len(value) < 1024 for value in endpoints.values()):
        raise BadRecord("an endpoint that is not a string")
    store_id = raw.get("store_id", "")
    return Shard(raw["name"], **endpoints), store_id if isinstance(store_id, str) else ""


@dataclasses.dataclass(frozen=True)
class View:
    """What the registry knows (the thread replaces it whole): every registered shard (``shards``: gone
    ones too, their queues still live there), those ``alive``, whether etcd answered the last call
    (``reachable``), since when it has not (``down_since``, monotonic), and why (``error``)."""

    shards: ShardList | None
    alive: frozenset[str]
    reachable: bool
    down_since: float | None
    error: str
    listed: list[dict[str, str]] | None = None  # ``shards.to_dict()``: the same in every WHERE

    def __post_init__(self) -> None:
        object.__setattr__(self, "listed", self.shards.to_dict() if self.shards is not None else None)
