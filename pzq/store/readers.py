"""The store's readers in other processes (`pzq backup`, `pzq check`), seen from the server: those that
died in a transaction are cleared, and one that holds a single snapshot for long is named in the log.

While any reader holds a snapshot, LMDB reuses no page freed after it: the store's file grows by all
that is written until it ends. A reader that died is found by LMDB (``reader_check``); one that is alive
but stopped (^Z, ``kill -STOP``) or stuck (a stalled disk at its destination) is not: it can only be
named, so that an operator sees why the store grows."""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("pzq.store")

HELD_S = 300  # a snapshot held this long (seconds) is named (a backup of 1 GB takes seconds)


def sweep(env: Any, path: str, seen: dict[tuple[str, str], float | None], now: float) -> None:
    """Clear the slots of readers that died; name each reader whose snapshot ``seen`` (kept by the
    caller between sweeps) first met at least HELD_S before ``now``, once."""
    if cleared := env.reader_check():
        log.warning("%s: %d reader(s) died in a transaction; the pages they held are reused again", path, cleared)
    for pid in held_snapshots(env.readers(), seen, now):
        log.warning(
            "%s: process %s has read the store at one snapshot for over %d s (a pzq backup or check stopped "
            "with ^Z or kill -STOP, or stuck?): until it ends, no page freed since is reused and the store "
            "grows by all that is written",
            path,
            pid,
            HELD_S,
        )


def held_snapshots(listing: str, seen: dict[tuple[str, str], float | None], now: float) -> list[str]:
    """The pids, in LMDB's reader list ``listing`` ("pid thread txnid" lines; txnid "-" when idle), whose
    snapshot was first seen HELD_S or more before ``now`` and not named yet. This process's own are left
    out (its reads last a turn)."""
    current = set()
    for line in listing.splitlines()[1:]:
        fields = line.split()
        if len(fields) == 3 and fields[2] != "-" and fields[0] != str(os.getpid()):
            current.add((fields[0], fields[2]))
    for gone in set(seen) - current:
        del seen[gone]
    named = []
    for key in sorted(current):
        first = seen.setdefault(key, now)
        if first is not None and now - first >= HELD_S:
            named.append(key[0])
            seen[key] = None  # (named once)
    return named
