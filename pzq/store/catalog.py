"""The queues' metadata: each queue's record (name, qid, counters) and the store's meta records (its
format version, the next qid, the seq floor, the shard it is, each partitioned queue's count of
partitions), read at open and written with a commit.

Start-up reads one small record per queue and never scans the messages: the per-queue counters (count,
bytes) live in the ``queues`` record and are written once per commit, only for the queues that
changed. The core (``core.Core``) holds this part and looks queues up in its dicts (``by_name``,
``by_id``) directly; making, naming and forgetting a queue are done here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from pzq.errors import StoreDamaged, StoreError, StoreFull, StoreTooNew, WrongShard
from pzq.store.environment import Environment
from pzq.store.layout import FORMAT, U64, UNREADABLE, QueueInfo, parse_message_id
from pzq.store.pages import ADVICE

SHARD = b"shard"  # meta: the shard's name (utf-8)
STORE_ID = b"store_id"  # meta: a random id made with the shard's name (etcd tells two stores of one name apart)
PARTITIONS = b"partitions\0"  # meta: + a queue's name -> u64, its count of partitions
MOST_PARTITIONS = 1024  # the most a count kept may be (pzq.shards.MAX_PARTITIONS: the store imports no shards)
log = logging.getLogger("pzq.store")


class Catalog:
    """The records of the queues and the store's meta records (see the module's text)."""

    def __init__(self, env: Environment, *, max_queues: int, max_implicit: int | None) -> None:
        self.env = env
        self.path = env.path
        self.max_queues = max_queues
        # Queues made by clients' requests at most (None: --max-queues); the rest is kept for named ones
        self.max_implicit = max_queues if max_implicit is None else max_implicit
        self.implicit_count = 0
        # The server's --queue: made explicit whoever makes it (a produce after an operator's DELETE had
        # made it a client's implicit queue, which expired unused). Configuration, not data: kept on load.
        self.configured: set[str] = set()
        self.seq_floor = 1  # a new queue's first seq (meta b"seq_floor")
        self.format = FORMAT  # the store's format version (read by load)
        self.by_name: dict[str, QueueInfo] = {}
        self.by_id: dict[int, QueueInfo] = {}
        self.dirty: set[str] = set()  # queues whose record the next commit writes
        self.meta_dirty = False  # the meta records too
        self._next_qid = 1
        self._queues_db, self._meta_db = env.dbs["queues"], env.dbs["meta"]
        self.shard = ""  # the shard this store is (meta b"shard"): "" until a start names one
        self.store_id = ""  # meta b"store_id": made with the shard's name
        self.partitions: dict[str, int] = {}  # queue -> its partitions (meta b"partitions\0" + name)
        # queue -> the names of its partitions this store holds (Q#i: WHERE looks up these, not 1,024 names)
        self.families: dict[str, set[str]] = {}
        self.wrote: Callable[[], None] = lambda: None  # (the core's: a record written, the next commit has work)

    def load(self) -> None:
        """Read every queue's record and the meta records (at open, and after a rollback)."""
        self.by_name.clear()
        self.by_id.clear()
        with self.env.reading() as txn:
            raw = txn.get(b"format", db=self._meta_db)
            self.format = self._format(raw)
            # An older format (or none written) is marked as this one with the next write. (Format 1 is
            # the first: when a layout changes, the conversion of the older records goes here.)
            self.meta_dirty = (raw is None or self.format < FORMAT) and not self.env.readonly
            raw = txn.get(b"next_qid", db=self._meta_db)
            self._next_qid = U64.unpack(raw)[0] if raw else 1
            raw = txn.get(b"seq_floor", db=self._meta_db)
            if raw is not None and len(raw) != U64.size:  # (guessing low could hand out seqs again)
                raise StoreDamaged(f"{self.path}/data.mdb: its seq floor record {raw[:16]!r} cannot be read; " + ADVICE)
            self.seq_floor = U64.unpack(raw)[0] if raw else 1
            self._load_cluster(txn)
            for name, value in txn.cursor(db=self._queues_db):
                try:
                    info = QueueInfo.unpack(name.decode(), value)
                except UNREADABLE as exc:  # the counters of a queue: nothing of it can be served without
                    raise StoreError(
                        f"{self.path}/data.mdb: the record of queue {name[:60]!r} cannot be read "
                        f"({exc}): the store is damaged; run `pzq check`, restore it from a backup, "
                        "or `pzq dump` what is readable"
                    ) from None
                self.by_name[info.name] = info
                self.by_id[info.qid] = info
        self.dirty.clear()
        self.implicit_count = sum(q.implicit for q in self.by_name.values())
        self.families.clear()
        for name in self.by_name:
            self._family(name, True)

    def _load_cluster(self, txn) -> None:
        """The shard name and the partition counts (a record each: one per partitioned queue, at most)."""
        raw = txn.get(SHARD, db=self._meta_db)
        self.shard = raw.decode("utf-8", "replace") if raw else ""
        raw = txn.get(STORE_ID, db=self._meta_db)
        self.store_id = raw.decode("ascii", "replace") if raw else ""
        self.partitions.clear()
        cursor = txn.cursor(db=self._meta_db)
        if cursor.set_range(PARTITIONS):
            for key, value in cursor:
                if not key.startswith(PARTITIONS):
                    break
                if len(value) != U64.size:
                    raise StoreDamaged(f"{self.path}/data.mdb: partition count {value[:16]!r} unreadable; {ADVICE}")
                queue, count = key[len(PARTITIONS) :].decode("utf-8", "replace"), U64.unpack(value)[0]
                if not 2 <= count <= MOST_PARTITIONS:  # (no place follows from it: every WHERE of it failed)
                    log.warning("%s: queue %r's %d partitions: no count pzq keeps, set aside", self.path, queue, count)
                    continue
                self.partitions[queue] = count

    def claim_shard(self, name: str) -> str:
        """The shard this store is, ``name`` kept (in the open transaction) if it keeps none yet; the name
        it keeps if ``name`` is ""; WrongShard if it keeps another: a store never serves as two shards."""
        if name and self.shard and name != self.shard:
            raise WrongShard(
                f"{self.path} is the store of shard {self.shard!r} (kept in it since its first start), not "
                f"{name!r}: start it as --shard {self.shard}, or give shard {name} a store of its own (--database)"
            )
        if name and not self.shard:
            self.env.do(self.env.write().put, SHARD, name.encode(), db=self._meta_db)
            self.shard = name
            self.wrote()
        if self.shard and not self.store_id:  # (a store named before ids were kept gets one too)
            self.store_id = uuid.uuid4().hex
            self.env.do(self.env.write().put, STORE_ID, self.store_id.encode(), db=self._meta_db)
            self.wrote()
        return self.shard

    def keep_partitions(self, queue: str, count: int) -> bool:
        """Keep "``queue`` has ``count`` partitions" (in the open transaction); False if it was kept
        already. StoreError if another count is kept: partitions are never changed (a message's place
        follows from the count, and a consumer reading ``Q#0..k`` would miss those placed past it)."""
        kept = self.partitions.get(queue)
        if kept == count:
            return False
        if kept is not None:
            raise StoreError(
                f"queue {queue!r} has {kept} partitions, not {count}: a queue's partitions are never changed "
                "(make a queue of another name and move its consumers)"
            )
        if len(self.partitions) >= self.max_queues:  # (each is a partitioned queue: at least a queue somewhere)
            raise StoreFull(f"queue full: {len(self.partitions)} queues of partitions kept, as many as --max-queues")
        self.env.do(self.env.write().put, PARTITIONS + queue.encode(), U64.pack(count), db=self._meta_db)
        self.partitions[queue] = count
        self.wrote()
        return True

    def _format(self, raw: bytes | None) -> int:
        """The store's format version from its meta record: 1 without one (pzq wrote none before it
        was needed), StoreTooNew past what this pzq reads."""
        if raw is None:
            return 1
        if len(raw) != U64.size or not 1 <= U64.unpack(raw)[0]:
            raise StoreDamaged(f"{self.path}/data.mdb: its format record {raw[:16]!r} cannot be read; " + ADVICE)
        stored = U64.unpack(raw)[0]
        if stored > FORMAT:
            raise StoreTooNew(
                f"{self.path} has store format {stored}, newer than format {FORMAT}, the newest this pzq reads: "
                f"run the newer pzq that wrote it (or restore a backup of format {FORMAT})"
            )
        return stored

    def write(self, txn) -> None:
        """Write the records that changed into the commit's transaction: only those, since every extra
        record written is another B-tree path copied and synced."""
        for name in self.dirty:
            self.env.do(txn.put, name.encode(), self.by_name[name].pack(), db=self._queues_db)
        if self.meta_dirty:
            self.env.do(txn.put, b"next_qid", U64.pack(self._next_qid), db=self._meta_db)
            self.env.do(txn.put, b"seq_floor", U64.pack(self.seq_floor), db=self._meta_db)
            self.env.do(txn.put, b"format", U64.pack(FORMAT), db=self._meta_db)
            self.format = FORMAT

    def committed(self) -> None:
        """What ``write`` wrote is durable."""
        self.dirty.clear()
        self.meta_dirty = False

    # -- making, naming, forgetting -----------------------------------------------------------------

    def create(self, name: str, *, implicit: bool) -> QueueInfo:
        """A new, empty queue ``name`` (``Core.queue`` makes one on first use); StoreFull past
        --max-queues, or past ``max_implicit`` for one a client's request makes."""
        if not name or len(name.encode()) > 255:
            raise StoreError(f"queue name must be 1 to 255 bytes: {name!r}")
        implicit = implicit and name not in self.configured  # (before the room kept for named queues is weighed)
        if len(self.by_name) >= self.max_queues:  # every queue costs memory and a line of figures
            raise StoreFull(f"queue full: there are {len(self.by_name)} queues, the most --max-queues allows")
        if implicit and self.implicit_count >= self.max_implicit:  # (the rest is kept for named queues)
            raise StoreFull(
                f"queue full: {self.implicit_count} queues made by clients' requests, the most of "
                "--max-queues they may take (the rest is kept for configured queues)"
            )
        info = QueueInfo(name, self._next_qid, self.seq_floor, implicit=implicit)
        self.implicit_count += implicit
        self._next_qid += 1
        self.by_name[name] = info
        self.by_id[info.qid] = info
        self._family(name, True)
        self.env.write()
        self.meta_dirty = True
        self.dirty.add(name)
        return info

    def name_queue(self, name: str) -> QueueInfo:
        """Queue ``name`` as the operator names it (``--queue``): made explicit, or made so if a
        client's request made it, so that it never expires."""
        info = self.by_name.get(name) or self.create(name, implicit=False)
        if info.implicit:
            self.implicit_count -= 1
            info.implicit = False
            self.env.write()
            self.dirty.add(info.name)
        return info

    def forget(self, name: str) -> QueueInfo:
        """Take queue ``name`` out of the lookups (its record stays until its owner deletes it: a queue
        being deleted, ``drops.py``)."""
        info = self.by_name.pop(name)
        del self.by_id[info.qid]
        self._family(name, False)
        self.dirty.discard(name)
        self.implicit_count -= info.implicit
        return info

    def _family(self, name: str, held: bool) -> None:
        """``name`` held or no longer, in its queue's family if it is a partition's (``Q#0`` to ``Q#9999``,
        as pzq/shards.py names them: the digits without a leading zero)."""
        base, sep, index = name.rpartition("#")
        digits = index.isascii() and index.isdigit() and len(index) <= 4 and (index == "0" or index[0] != "0")
        if not (sep and base and digits):
            return
        if held:
            self.families.setdefault(base, set()).add(name)
        elif base in self.families:
            family = self.families[base]
            family.discard(name)
            if not family:
                del self.families[base]

    def raise_floor(self, seq: int) -> None:
        """Every queue made from now on starts at ``seq`` or above (a queue deleted: one made again under
        its name must not hand out its seqs again, which a Spark offset may name)."""
        self.seq_floor = max(self.seq_floor, seq)
        self.meta_dirty = True

    def implicit_names(self) -> list[str]:
        """The names of every implicit queue (the broker's sweep walks them a share per turn)."""
        return [info.name for info in self.by_name.values() if info.implicit]

    def ref_in(self, queue: str, message_id: str | bytes) -> tuple[int, int] | None:
        """(qid, seq) of ``message_id`` if it names a message (or dead letter) of ``queue``: a client's
        id of another queue, or no id at all, gets None."""
        ref = parse_message_id(message_id)
        info = self.by_name.get(queue)
        return ref if ref is not None and info is not None and ref[0] == info.qid else None
