"""The durable store: named FIFO queues and the side tables beside them, in one LMDB environment.

``Store`` is one small core and the parts it holds. The core, what every hot path calls:

- ``environment.py``: the LMDB boundary (lmdb is imported only in this package): the write transaction
  the loop commits, reads in ``with`` blocks, the lock, the disk watch; ``opening.py``: the checks of a
  store's files before LMDB maps them; ``pages.py``: the page walk that refuses a damaged file before a
  server opens it.
- ``layout.py``: the key layout, the record types and the store's format version.
- ``core.py``: the environment opened, the commit and its rollback, each queue's counters, room;
  ``pending.py``: the delivery counts that wait for a commit. Drawn on the core, the verbs (the only
  inheritance here: ``Store(Records, Runs)``, each over ``Core``): ``records.py`` (a message at a
  time: put, get, scan, delete, requeue) and ``runs.py`` (runs of messages in one call: a producer's
  puts, a take's counts, an ack run's deletes, a lease's headers; ``plain_runs.py`` reads a take's
  run as columns).

The parts, each handed the core (or its records) as the side-table owners are, and held by the store:

- ``store.catalog`` (``catalog.py``): the queues' metadata, the queue records and the meta records.
- ``store.bodies`` (``bodies.py``): big bodies written in chunks over turns.
- ``store.drops`` (``drops.py``): a queue deleted over turns.
- ``store.dead_letters`` (``dead_letters.py``): dead letters moved, read, requeued, deleted.
- ``store.previews`` (``previews.py``): the console's previews and the audit ``pzq check`` reads.
- ``side_table.py``: what the side tables share; one owner per table draws its key layout at its top:
  ``schedules.py``, ``groups.py`` (groups and leases), ``dedup_keys.py``, ``bindings.py``, ``emqp_jobs.py``.
"""

import logging
import os

from pzq.store.bindings import Bindings
from pzq.store.bodies import Bodies, Upload
from pzq.store.dead_letters import DeadLetters
from pzq.store.dedup_keys import DedupKeys
from pzq.store.drops import Drops
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.groups import Groups, LeaseRecords
from pzq.store.layout import (
    FORMAT,
    SIDE_TABLES,
    UNREADABLE,
    DeadLetter,
    Message,
    QueueInfo,
    message_id,
    parse_message_id,
)
from pzq.store.pages import ADVICE
from pzq.store.previews import Preview, Previews
from pzq.store.records import Records
from pzq.store.runs import Runs
from pzq.store.schedules import Schedules
from pzq.store.side_table import SideTable

log = logging.getLogger("pzq.store")


class Store(Records, Runs):
    """Named durable FIFO queues. Single-threaded: one owner calls every method.

    Open with ``Store(path, max_size=..., readonly=..., verify=...)``; see ``core.Core`` for the
    environment and counters, ``records``/``runs`` for the verbs, and the parts it holds for the rest
    (the package's text)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        max_size: int = 4 << 30,
        sync: bool = True,
        readonly: bool = False,
        min_disk_free: int = 0,
        disk_reserve: int = 0,
        max_queues: int = 1_000_000,
        max_implicit: int | None = None,
        verify: bool = False,
    ) -> None:
        super().__init__(
            path,
            max_size=max_size,
            sync=sync,
            readonly=readonly,
            min_disk_free=min_disk_free,
            disk_reserve=disk_reserve,
            max_queues=max_queues,
            max_implicit=max_implicit,
            verify=verify,
        )
        try:
            self.bodies = Bodies(self)
            self.drops = Drops(self, self.bodies)
            self.dead_letters = DeadLetters(self)
            self.previews = Previews(self, self.dead_letters)
        except BaseException:
            self.env.close()
            raise
        if self.env.verified:
            log.info("%s", self.env.verified)


OWNERS: tuple[type[SideTable], ...] = (Schedules, Groups, LeaseRecords, DedupKeys, Bindings, EmqpJobs)


def side_tables(store: Store) -> list[SideTable]:
    """An owner of every side table of ``store`` (for ``pzq check`` and the contract test)."""
    return [owner(store) for owner in OWNERS]


__all__ = [
    "ADVICE",
    "FORMAT",
    "OWNERS",
    "side_tables",
    "SIDE_TABLES",
    "UNREADABLE",
    "DeadLetter",
    "Message",
    "Preview",
    "QueueInfo",
    "SideTable",
    "Store",
    "Upload",
    "message_id",
    "parse_message_id",
]
