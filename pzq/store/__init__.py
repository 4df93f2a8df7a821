"""The durable store: named FIFO queues and the side tables beside them, in one LMDB environment.

- ``environment.py``: the LMDB boundary (lmdb is imported only in this package): the write transaction
  the loop commits, reads in ``with`` blocks, the lock, the disk watch; ``pages.py``: the page walk that
  refuses a damaged file before a server opens it.
- ``layout.py``: the key layout, the record types and the store's format version.
- The queue model, ``Store``, one role per module, each drawn on the one before: ``queues.py`` (the
  environment, the commit, each queue's counters, room), ``bodies.py`` (big bodies in chunks written over
  turns), ``messages.py`` (put, scan, delivery
  counts, deletes), ``runs.py`` (the counts and deletes of a run in one call, a lease's headers by
  runs), ``dead_letters.py``,
  ``previews.py`` (the console's previews, the audit), ``drops.py`` (a queue deleted over turns).
- ``side_table.py``: what the side tables share; one owner per table draws its key layout at its top:
  ``schedules.py``, ``groups.py`` (groups and leases), ``dedup_keys.py``, ``bindings.py``, ``emqp_jobs.py``.
"""

from pzq.store.bindings import Bindings
from pzq.store.bodies import Upload
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
from pzq.store.schedules import Schedules
from pzq.store.side_table import SideTable


class Store(Drops, Previews):
    """Named durable FIFO queues. Single-threaded: one owner calls every method.

    Open with ``Store(path, max_size=..., readonly=..., verify=...)``; see ``queues.Queues`` for the
    environment and counters and the modules drawn on it for the rest."""


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
