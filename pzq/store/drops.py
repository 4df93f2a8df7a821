"""Deleting a queue over turns: the queue is gone for every client at once, its records go a share per
call, and a restart goes on where the last commit left off.

``drop`` removes the queue's name (a new queue of that name starts empty, above the old seqs) and
keeps its counters under a name no client can give (``DROPPING``: longer than a queue name may be), so
that its records still count toward the store's size and a restart finds what is left to delete.
``share`` then deletes up to a share of its records (messages with their chunked bodies, dead
letters, delivery counts) and writes the counters left; the record under ``DROPPING`` goes with the last
share. Deleting 200,000 messages in one call had held the loop 634 ms. A pzq from before this module reads
such a record as a queue of that odd name, whose messages are all there: nothing is lost or orphaned.

``Drops`` is a part the store holds (``store.drops``), handed the core and the bodies: after the
counters are read (at open, after a rollback) it takes the queues being deleted out of the lookups.
"""

from __future__ import annotations

import time

from pzq.store.bodies import Bodies, ref_of
from pzq.store.core import Core
from pzq.store.layout import U64, QueueInfo, accounted

# A queue being deleted is kept under this prefix and its qid in hex: over 255 bytes, which no queue made
# by a client can be named (Catalog.create refuses it), and sorted first (its NUL)
DROPPING = "\x00" + "-" * 255 + "dropping "
SLICE = 64  # records deleted between two looks at the clock


class Drops:
    """Queues deleted at once for clients, their records a share at a time."""

    dropping: dict[int, QueueInfo]  # qid -> the counters left of a queue being deleted

    def __init__(self, core: Core, bodies: Bodies) -> None:
        self.core, self.bodies, self.env, self.catalog = core, bodies, core.env, core.catalog
        dbs = core.env.dbs
        self._queues_db, self._messages_db, self._dead_db = dbs["queues"], dbs["messages"], dbs["dead"]
        self._deliveries_db = dbs["deliveries"]
        core.on_load.append(self._load)
        self._load()

    def _load(self) -> None:
        self.dropping = {}
        for name in [name for name in self.catalog.by_name if name.startswith(DROPPING)]:
            info = self.catalog.forget(name)
            self.dropping[info.qid] = info

    def drop(self, name: str) -> int:
        """Delete a queue: its name at once (a later ``queue(name)`` makes a new, empty queue), its
        messages, delivery counts and dead letters by ``share``. Returns how many messages it had."""
        info = self.catalog.by_name.get(name)
        if info is None:
            return 0
        txn = self.env.write()
        self.core.forget_counts(U64.pack(info.qid))
        self.env.do(txn.delete, name.encode(), db=self._queues_db)
        self.catalog.forget(name)
        # A queue made again under this name starts above every seq it had (a Spark offset may name
        # one): one floor for every new queue, so the record stays one u64 however many names went.
        self.catalog.raise_floor(info.next_seq)
        self.core.wrote()
        counters = (info.next_seq, info.count, info.bytes, info.dead_count, info.dead_bytes)
        doomed = QueueInfo(f"{DROPPING}{info.qid:016x}", info.qid, *counters)
        self.dropping[info.qid] = doomed
        self.env.do(txn.put, doomed.name.encode(), doomed.pack(), db=self._queues_db)
        return info.count

    def share(self, most: int, deadline: float | None = None) -> int:
        """Delete up to ``most`` records of the queues being deleted, oldest deletion first, and none
        past ``deadline`` (time.monotonic(), looked at every ``SLICE`` records); returns how many went. A
        queue whose records are all gone is forgotten (its counters' record too)."""
        done = 0
        while done < most and self.dropping:
            done += self._drop_some(min(SLICE, most - done))
            if deadline is not None and time.monotonic() >= deadline:
                break
        return done

    def _drop_some(self, most: int) -> int:
        done = freed = 0
        txn = self.env.write()
        for qid, info in list(self.dropping.items()):
            prefix = U64.pack(qid)
            for db in (self._messages_db, self._dead_db, self._deliveries_db):
                cursor = txn.cursor(db=db)
                found = cursor.set_range(prefix)
                while found and done < most and cursor.key()[:8] == prefix:
                    key, value = bytes(cursor.key()), bytes(cursor.value())
                    if db is not self._deliveries_db:  # (a delivery count is part of its message's overhead)
                        dead = db is self._dead_db
                        size = accounted(key, value)
                        if (ref := ref_of(value, dead)) is not None:
                            size += self.bodies.delete(ref)
                        info.count -= not dead
                        info.bytes -= 0 if dead else size
                        info.dead_count -= dead
                        info.dead_bytes -= size if dead else 0
                        freed += size
                    done += 1
                    found = self.env.do(cursor.delete)
                if done >= most:
                    break
            else:  # (every table of it is empty: the queue is gone for good)
                del self.dropping[qid]
                self.env.do(txn.delete, info.name.encode(), db=self._queues_db)
                continue
            self.env.do(txn.put, info.name.encode(), info.pack(), db=self._queues_db)
            break
        self.core.charge(-freed)
        return done

    def left(self) -> tuple[int, int]:
        """Queues being deleted and the messages and dead letters they still hold."""
        return len(self.dropping), sum(info.count + info.dead_count for info in self.dropping.values())
