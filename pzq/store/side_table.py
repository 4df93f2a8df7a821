"""What every side table shares: one LMDB database of small records a feature keeps beside the queues.

Each table has one owner (a subclass in this package) that draws its key layout at its top and is the
only code that packs or reads its records. Writes join the loop's open transaction and are durable
with its next commit. A record that cannot be read (a damaged page, a bug) is skipped, logged and
counted: one bad record must not stop the server from starting, nor fail every turn that meets it.

Side records count toward the store limit like messages do. A new record past that limit, or while
the disk is short, raises StoreFull, writing nothing; a replacement is always written (a schedule's
next run never fails for room). A table whose records let consumers drain a full store (groups,
leases, eMQP jobs) has ``COUNTED = False``: its records count, but are never refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pzq.store.layout import UNREADABLE

if TYPE_CHECKING:
    from pzq.store.core import Core

log = logging.getLogger("pzq.store")

K = TypeVar("K")
V = TypeVar("V")

OVERHEAD = 64  # bytes per record beyond key and value (LMDB's node header, page slack), as for messages


class SideTable(Generic[K, V]):
    """The records of table ``NAME``: ``K`` keys to ``V`` values."""

    NAME: ClassVar[str]
    COUNTED: ClassVar[bool] = True

    def __init__(self, store: Core):
        self.store = store
        self._env = store.env
        self._db = store.env.dbs[self.NAME]

    # -- the layout: every owner draws its own ---------------------------------------------------

    def key(self, k: K) -> bytes:
        raise NotImplementedError

    def pack(self, v: V) -> bytes:
        raise NotImplementedError

    def unpack(self, key: bytes, value: bytes) -> tuple[K, V]:
        """The record as (key, value); raises one of UNREADABLE when it is damaged."""
        raise NotImplementedError

    # -- records ----------------------------------------------------------------------------------

    def put(self, k: K, v: V) -> None:
        """Store (or replace) the record of ``k``, durable with the next commit; StoreFull if a new
        one does not fit (see the module's text)."""
        self.put_raw(self.key(k), self.pack(v))

    def put_raw(self, key: bytes, value: bytes) -> None:
        """As ``put``, for bytes read from this table (to restore a record as it was)."""
        txn = self._env.write()
        if self.COUNTED and txn.get(key, db=self._db) is None:
            self.store.check_room(len(key) + len(value) + OVERHEAD)
        self._env.do(txn.put, key, value, db=self._db)
        self.store.side_changed(self.NAME)

    def get(self, k: K) -> V | None:
        """The value of ``k``; None when there is none or it cannot be read."""
        raw = self.get_raw(self.key(k))
        if raw is None:
            return None
        try:
            return self.unpack(self.key(k), raw)[1]
        except UNREADABLE:
            return None

    def get_raw(self, key: bytes) -> bytes | None:
        with self._env.reading() as txn:
            return txn.get(key, db=self._db)

    def delete(self, k: K) -> bool:
        """Remove the record of ``k``; False if there was none."""
        return self.delete_raw(self.key(k))

    def delete_raw(self, key: bytes) -> bool:
        found = bool(self._env.do(self._env.write().delete, key, db=self._db))
        if found:
            self.store.side_changed(self.NAME)
        return found

    def raw(self, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        """Every record whose key starts with ``prefix``, as stored, in key order."""
        out: list[tuple[bytes, bytes]] = []
        with self._env.reading() as txn:
            cursor = txn.cursor(db=self._db)
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    out.append((key, value))
        return out

    def items(self, prefix: bytes = b"") -> list[tuple[K, V]]:
        """Every readable record under ``prefix``, in key order; damaged ones are skipped, logged and
        counted in the store's ``unreadable_records``."""
        out = []
        for key, value in self.raw(prefix):
            try:
                out.append(self.unpack(key, value))
            except UNREADABLE as exc:
                self.store.unreadable_records += 1
                log.error(
                    "a record of the store's %s table cannot be read and is skipped (key %r): %s: %s",
                    self.NAME,
                    key[:60],
                    type(exc).__name__,
                    exc,
                )
        return out
