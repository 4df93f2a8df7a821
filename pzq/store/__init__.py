"""The durable store: named FIFO queues and the side tables beside them, in one LMDB environment.

- ``environment.py``: the LMDB boundary (the only module that imports lmdb): the write transaction the
  loop commits, reads in ``with`` blocks, the lock, the disk watch.
- ``queues.py``: the queue model (``Store``): queues, messages, delivery counts, dead letters, limits.
- ``side_table.py``: what the side tables share; one owner per table draws its key layout at its top:
  ``schedules.py``, ``groups.py`` (groups and leases), ``dedup_keys.py``, ``bindings.py``, ``emqp_jobs.py``.
"""

from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.groups import Groups, LeaseRecords
from pzq.store.queues import (
    SIDE_TABLES,
    DeadLetter,
    Message,
    Preview,
    QueueInfo,
    Store,
    message_id,
    parse_message_id,
)
from pzq.store.schedules import Schedules
from pzq.store.side_table import UNREADABLE, SideTable

OWNERS: tuple[type[SideTable], ...] = (Schedules, Groups, LeaseRecords, DedupKeys, Bindings, EmqpJobs)


def side_tables(store: Store) -> list[SideTable]:
    """An owner of every side table of ``store`` (for ``pzq check`` and the contract test)."""
    return [owner(store) for owner in OWNERS]


__all__ = [
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
    "message_id",
    "parse_message_id",
]
