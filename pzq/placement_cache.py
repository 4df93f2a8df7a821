"""The placement cache file (docs/cluster.md): what the etcd registry (pzq/etcd_registry.py) has seen of
the shards and placements, kept beside the store so that a server started while etcd is away still
serves every queue it knew. Only a cache: a missing or damaged file (nested past json's depth too) is
logged and etcd's records read."""

from __future__ import annotations

import json
import logging
import os

from pzq import placement as records
from pzq.shards import MAX_SHARDS, Shard

log = logging.getLogger("pzq.etcd")


def save(path: str, prefix: str, members: list[tuple[Shard, str]], placements: list[tuple[str, bytes]]) -> None:
    """Write the cache at ``path`` whole (a temporary file, fsynced, then renamed over it); logged if not.
    ``prefix`` is the cluster's (--etcd-prefix): a server started with another does not read it.
    ``placements``: (queue, its record's JSON), written as they are (100,000 placements encoded again
    at each save had taken 2.3 s of the thread, the loop waiting up to 85 ms for the GIL)."""
    head = {"prefix": prefix, "shards": [json.loads(records.encode_member(s, i)) for s, i in members]}
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as out:
            out.write(json.dumps(head).encode()[:-1] + b', "placements": {')
            for at in range(0, len(placements), 1024):  # (a chunk at a time: the GIL is let go between)
                chunk = placements[at : at + 1024]
                out.write((b"," if at else b"") + b",".join(json.dumps(q).encode() + b":" + r for q, r in chunk))
            out.write(b"}}")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("etcd: the placement cache %s was not written: %s", path, exc)


def load(path: str, max_bytes: int, prefix: str) -> tuple[list[tuple[Shard, str]], list[tuple[str, bytes]]] | None:
    """The shards (with their store ids) and the placement records (queue, its record's bytes) of the
    cache at ``path``; None when there is none, it is damaged, or of another prefix (logged)."""
    try:
        if os.path.getsize(path) > max_bytes:
            raise ValueError("too big")
        with open(path, encoding="utf-8") as cached:
            data = json.load(cached)
        if data["prefix"] != prefix:
            log.warning("etcd: placement cache %s is of prefix %.80r, not %r: not read", path, data["prefix"], prefix)
            return None
        shards = [records.decode_member(json.dumps(entry).encode()) for entry in data["shards"][:MAX_SHARDS]]
        placed = [(queue, json.dumps(record).encode()) for queue, record in data["placements"].items()]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, records.BadRecord) as exc:
        log.warning("etcd: placement cache %s unreadable (%s): etcd's records are read", path, exc)
        return None
    return shards, placed
