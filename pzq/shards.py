"""Shards: the shard list (a TOML file of named servers and their endpoints) and where a queue lives on
it, by a stable hash (docs/cluster.md). Pure: no socket, no store; the server, the clients and the Spark
connector all place a queue with these functions, so all of them agree while they read the same list.

A queue is placed by rendezvous hashing (highest random weight): each shard's weight for a queue is a
hash of the pair, the queue lives on the heaviest, and a list with one shard more or less moves only the
queues whose heaviest shard changed (about 1/n of them). A queue made of ``k`` partitions is ``k`` queues
``Q#0 .. Q#k-1``; partition ``i`` lives on the ``i mod n``-th shard of the queue's ranking, so that its
partitions spread evenly over the shards and ``Q#0`` is where ``Q`` alone would be.

The shard list::

    [[shard]]
    name = "a"
    receive_dsn = "tcp://10.0.0.1:11131"   # the endpoints clients use; those a shard does not serve
    send_dsn = "tcp://10.0.0.1:11132"      # are left out
    consume_dsn = "tcp://10.0.0.1:11135"
    api_dsn = "tcp://10.0.0.1:11133"
    monitor_dsn = "tcp://10.0.0.1:11134"
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterable

from pzq.errors import ConfigError
from pzq.toml_file import read_toml

PARTITION_SEP = "#"
ENDPOINTS = ("receive_dsn", "send_dsn", "consume_dsn", "api_dsn", "monitor_dsn")
MAX_SHARDS = 1024  # a list longer than this is a mistake, not a cluster (each is a line of every answer)
MAX_PARTITIONS = 1024  # a queue's partitions at most (each is a queue, on some shard)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")  # a shard's name: a systemd instance name, a file name
_PARTITION = re.compile(r"(.+)#(0|[1-9][0-9]{0,3})\Z")


@dataclasses.dataclass(frozen=True)
class Shard:
    """One server of the list: its name and the endpoints clients reach it at ("" where it serves none)."""

    name: str
    receive_dsn: str = ""
    send_dsn: str = ""
    consume_dsn: str = ""
    api_dsn: str = ""
    monitor_dsn: str = ""

    def endpoints(self) -> dict[str, str]:
        """The endpoints it serves, by setting name (those it serves none of are left out)."""
        return {key: getattr(self, key) for key in ENDPOINTS if getattr(self, key)}


def check_name(name: str, what: str = "shard name") -> str:
    """``name`` if it is a shard's name (1-63 letters, digits, ``_ . -``, not starting with a sign)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"{what} {name!r}: 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return name


def partition_name(queue: str, index: int) -> str:
    """The name of partition ``index`` of ``queue``: ``queue#index``."""
    return f"{queue}{PARTITION_SEP}{index}"


def partition_of(name: str) -> tuple[str, int] | None:
    """(queue, index) when ``name`` is a partition's name (``Q#3``), else None."""
    found = _PARTITION.match(name)
    return (found.group(1), int(found.group(2))) if found else None


def _weight(shard: str, queue: str) -> int:
    digest = hashlib.blake2b(f"{shard}\0{queue}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclasses.dataclass(frozen=True)
class ShardList:
    """The shards of a cluster, in the order of their file; the placement of queues over them."""

    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        if not self.shards:
            raise ConfigError("the shard list names no shard")
        if len(self.shards) > MAX_SHARDS:
            raise ConfigError(f"the shard list names {len(self.shards)} shards, more than {MAX_SHARDS}")
        seen: set[str] = set()
        for shard in self.shards:
            if shard.name in seen:
                raise ConfigError(f"the shard list names shard {shard.name!r} twice")
            seen.add(shard.name)

    def names(self) -> list[str]:
        return [shard.name for shard in self.shards]

    def named(self, name: str) -> Shard:
        """The shard called ``name``; ConfigError if the list has none."""
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise ConfigError(f"shard {name!r} is not in the shard list (it names {', '.join(self.names())})")

    def ranking(self, queue: str) -> list[Shard]:
        """Every shard, heaviest first for ``queue`` (ties, which a 64-bit hash all but never makes, by name)."""
        return sorted(self.shards, key=lambda shard: (-_weight(shard.name, queue), shard.name))

    def home(self, queue: str) -> Shard:
        """The shard a queue of one partition lives on."""
        return max(self.shards, key=lambda shard: (_weight(shard.name, queue), shard.name))

    def place(self, queue: str, partitions: int = 0) -> list[tuple[str, Shard]]:
        """Where ``queue``'s messages go: [(queue name, shard)], one pair for a queue without partitions
        (``partitions`` 0 or 1: the queue itself on its home), else one a partition, in partition order."""
        if partitions <= 1:
            return [(queue, self.home(queue))]
        if partitions > MAX_PARTITIONS:
            raise ConfigError(f"{partitions} partitions: at most {MAX_PARTITIONS}")
        ranking = self.ranking(queue)
        return [(partition_name(queue, i), ranking[i % len(ranking)]) for i in range(partitions)]

    def to_dict(self) -> list[dict[str, str]]:
        """The list as plain data (an API answer carries it): [{"name": ..., endpoint: dsn, ...}]."""
        return [{"name": shard.name, **shard.endpoints()} for shard in self.shards]

    @classmethod
    def from_dict(cls, entries: object, source: str = "the shard list") -> ShardList:
        """The list from plain data (a TOML file's ``shard`` array, or an API answer's ``shards``)."""
        if not isinstance(entries, list):
            raise ConfigError(f"{source}: expected a list of shards ([[shard]] tables)")
        shards = []
        for at, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise ConfigError(f"{source}: shard {at + 1} is not a table")
            unknown = set(entry) - {"name", *ENDPOINTS}
            if unknown:
                known = ", ".join(("name", *ENDPOINTS))
                raise ConfigError(f"{source}: shard {at + 1} has unknown keys {sorted(unknown)} (known: {known})")
            values = {key: entry.get(key, "") for key in ENDPOINTS}
            if not all(isinstance(value, str) for value in values.values()):
                raise ConfigError(f"{source}: shard {at + 1}: every endpoint is a string")
            shards.append(Shard(check_name(entry.get("name", ""), f"{source}: shard {at + 1}'s name"), **values))
        return cls(tuple(shards))


def load(path: str) -> ShardList:
    """The shard list in the TOML file at ``path`` (ConfigError, in one line, for any fault of it)."""
    data = read_toml(path, "shard list")
    unknown = set(data) - {"shard"}
    if unknown:
        raise ConfigError(f"shard list {path}: unknown keys {sorted(unknown)} (it holds [[shard]] tables)")
    return ShardList.from_dict(data.get("shard", []), f"shard list {path}")


_SUFFIXES = tuple(f"{PARTITION_SEP}{i}" for i in range(MAX_PARTITIONS))  # (made once: WHERE looks up all)


def where_answer(
    queue: str,
    shard: str,
    shards: ShardList | None,
    partitions: int,
    depth: Callable[[str], int | None],
    listed: list[dict[str, str]] | None = None,
    places: list[list[str]] | None = None,
    family: Iterable[str] | None = None,
) -> dict:
    """The answer to WHERE ``queue`` (the API's and the monitor's, the same dict): this server's shard
    name ("" when it is none), the list it reads ([] without one), the partitions it keeps for ``queue``
    (0: none kept), where the list places them ([[queue name, shard name], ...]; [] without a list) and
    the queues of ``queue`` it holds ([[name, depth], ...]: ``queue`` itself and ``queue#i``, found with
    ``depth(name)``, None for a queue it does not hold). A seed-protocol client's queue made on a shard
    that is not its home shows in that shard's ``held``: clients add it to the places they read.
    ``listed``: ``shards.to_dict()``, and ``places`` the places of ``queue``'s ``partitions``, if the caller
    keeps them (a list of 1,024 shards: 0.65 ms, and 0.8 to 1.7 ms, a call); ``family`` the names of the
    partitions of ``queue`` the server holds, in order, if it knows them (else ``Q#0`` to ``Q#1023`` are
    looked up: 0.09 ms)."""
    if family is None:
        room = 255 - len(queue.encode())  # (a partition's name past 255 bytes is no queue's: not looked up)
        suffixes = _SUFFIXES if room >= 5 else [suffix for suffix in _SUFFIXES if len(suffix) <= room]
        family = [queue + suffix for suffix in suffixes]
    held = [[queue, found]] if (found := depth(queue)) is not None else []
    held += [[name, found] for name in family if (found := depth(name)) is not None]
    if shards is None:
        return {"shard": shard, "shards": [], "partitions": partitions, "places": [], "held": held}
    return {
        "shard": shard,
        "shards": shards.to_dict() if listed is None else listed,
        "partitions": partitions,
        "places": [[name, home.name] for name, home in shards.place(queue, partitions)] if places is None else places,
        "held": held,
    }
