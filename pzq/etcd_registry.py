"""The etcd registry (docs/cluster.md): a helper thread, the only part of pzq that talks to etcd, and
never from the loop. It registers this server (its endpoints and store id, under ``PREFIX/shards/NAME``,
kept; ``PREFIX/alive/NAME`` under a lease it refreshes every second), places queues once
(``PREFIX/placements/QUEUE``, a create-if-absent transaction: pzq/placement.py) and keeps what it read
where the loop reads it without a lock: ``view`` (a new object each change) and ``placements`` (a dict
it only adds to, or replaces whole). What it has seen is also kept in a cache file beside the store, so a
server started while etcd is away still serves every queue it knew.

Each call has a second (``CALL_TIMEOUT_S``); a member that fails or is slow hands the next call to the
next member, so a stopped or killed leader costs a call or two, not a wedge. etcd never carries
messages: only these records, a few hundred bytes a queue.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
import time

from pzq import etcd_gateway as gw
from pzq import placement as records
from pzq import placement_cache as cache
from pzq.errors import ConfigError
from pzq.shards import MAX_SHARDS, Shard, ShardList

log = logging.getLogger("pzq.etcd")
CALL_TIMEOUT_S = 1.0  # each etcd call's most (connect and answer): a stopped member costs this, once
LEASE_TTL_S = 5  # a server silent this long (stopped, cut off, killed) is shown as gone
REFRESH_S = 1.0  # how often the lease is refreshed
POLL_S = 0.5  # how often the shards, who is alive and new placements are read (seen within 2 s of etcd's return)
PAGE = 64  # placement records a call asks for at most (halved after a call that failed: big junk)
READ_BUDGET_S = 0.5  # placement pages read a round at most (the lease is refreshed between rounds)
MAX_PLACEMENT_BYTES = 64 << 20  # and their records' bytes at most (what the server's memory holds of them)
PENDING_MOST = 1024  # placement requests waiting for the thread (more are refused as "being placed" again)
WRITTEN_BACK = 64  # lost placements written back a round at most (the lease is refreshed between rounds)
RETRY_S = 0.25  # after a failed round, the next one waits this long (etcd back: seen within a poll or two)
CONFLICT_RETRY_S = 10.0  # a name registered by another store is looked at again this often
SAVE_EVERY_S = 1.0  # the cache file is written at most this often, when something new was seen


class _Unreachable(Exception):
    pass


class EtcdRegistry(threading.Thread):
    """The registry's thread: ``start()`` it, ``place()`` from the loop, ``stop()`` at the end."""

    def __init__(self, urls: str, prefix: str, me: Shard, store_id: str, cache_path: str, max_placements: int, tls=()):
        """``tls``: (CA file, client certificate, its key) for https:// members ("" each: none given)."""
        super().__init__(name="pzq-etcd", daemon=True)
        import etcd3gw  # (etcd's JSON gateway client: only a server given --etcd loads it and requests)
        import requests

        session = gw.session(requests, *tls)
        self._errors: tuple[type[Exception], ...] = (
            etcd3gw.exceptions.Etcd3Exception,
            requests.RequestException,
            ValueError,
            KeyError,
            gw.CallTimeout,
        )
        self._deadlines = gw.Deadlines(CALL_TIMEOUT_S + 0.1)  # (each call's answer whole within its second)
        self._members = gw.parse_urls(urls)
        self._clients = [gw.client(etcd3gw, base, session, CALL_TIMEOUT_S) for base, _ in self._members]
        self._at = 0  # the member the next call goes to
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.me, self.store_id, self.cache_path = me, store_id, cache_path
        self.placements: dict[str, records.Placement] = {}
        self._encoded: dict[str, bytes] = {}  # queue -> its placement's record, as the cache file keeps it
        self.max_placements = max_placements  # (--max-queues: a cluster places no more queues than one holds)
        self._placement_bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # queue -> partitions, asked by the loop
        self._wake = threading.Event()
        self._stopping = False
        self._lease: str | None = None
        self._refresh_at = self._poll_at = self._register_at = 0.0
        self._rev = 0  # the store revision placements were read up to
        self._page = PAGE  # placement records the next call asks for
        self._members_read: dict[str, tuple[Shard, str]] = {}
        # (the records under shards/ and alive/ as last read: key -> (mod revision, value); etcd_gateway)
        self._members_held: dict[bytes, tuple[int, bytes]] = {}
        self._alive_held: dict[bytes, tuple[int, bytes]] = {}
        self._reading: tuple[bytes, int | None, set[str] | None] | None = None  # (a read of placements to go on)
        self._lost: list[str] = []  # known placements etcd does not have (restored from an older state)
        self._dirty = False
        self._said, self._said_at = "", 0.0  # (the last unexpected error logged, and when)
        self._contacted = False  # (etcd answered once: a later return is logged)
        self._saved_at = 0.0
        self.conflict = ""  # another store registered this shard's name: it neither registers nor places
        self.calls_total = self.failures_total = self.placed_total = 0
        self.view = records.View(None, frozenset(), False, time.monotonic(), "not contacted yet")
        self._load_cache()

    # -- the loop's side ------------------------------------------------------------------------
    def full(self, more: int = 0) -> bool:
        """True when no placement more is kept (``max_placements`` of them, or MAX_PLACEMENT_BYTES)."""
        return len(self.placements) >= self.max_placements or self._placement_bytes + more > MAX_PLACEMENT_BYTES

    def place(self, queue: str, partitions: int) -> None:
        """Ask for ``queue`` to be placed (with ``partitions``); the thread does it at its next round."""
        with self._lock:
            if len(self._pending) < PENDING_MOST:
                self._pending.setdefault(queue, partitions)
        self._wake.set()

    def stop(self, timeout: float = 3.0) -> None:
        """End the thread: its lease revoked (this server is gone at once), its cache written."""
        self._stopping = True
        self._wake.set()
        if self.is_alive():
            self.join(timeout)

    def stats(self) -> dict:
        view = self.view
        down = None if view.down_since is None else round(time.monotonic() - view.down_since, 3)
        return {
            "etcd": ",".join(shown for _, shown in self._members),
            "reachable": view.reachable,
            "down_s": down,
            "error": view.error,
            "conflict": self.conflict,
            "shards": [] if view.shards is None else view.shards.names(),
            "alive": sorted(view.alive),
            "placements": len(self.placements),
            "placement_bytes": self._placement_bytes,
            "placed_total": self.placed_total,
            "calls_total": self.calls_total,
            "call_failures_total": self.failures_total,
        }

    # -- the thread ---------------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping:
            now = time.monotonic()
            try:
                if self._lease is None and now >= self._register_at:
                    self._register()
                elif self._lease is not None and now >= self._refresh_at:
                    self._refresh()
                self._write_back()
                self._place_pending()
                if now >= self._poll_at:
                    self._poll()
                self._seen_ok()
            except _Unreachable as exc:
                self._seen_down(str(exc))
                self._poll_at = self._refresh_at = time.monotonic() + RETRY_S  # (not a call every few ms)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive a bug: logged, tried again next round
                self._unexpected(f"{type(exc).__name__}: {str(exc)[:200]}")
                self._poll_at = self._refresh_at = time.monotonic() + RETRY_S
            self._save_if_due(time.monotonic())
            due = min(self._poll_at, self._register_at if self._lease is None else self._refresh_at)
            self._wake.wait(max(0.05, due - time.monotonic()))
            self._wake.clear()
        self._revoke()
        self._save_if_due(float("inf"))

    def _call(self, path: str, body: dict) -> dict:
        """One call to the gateway's ``/v3/PATH``, to the current member; on a failure the next member has
        the next try, each member once (``_Unreachable`` when none answered)."""
        last = ""
        for _ in range(len(self._members)):
            client, shown = self._clients[self._at], self._members[self._at][1]
            self.calls_total += 1
            try:
                return self._deadlines.call(client.post, client.get_url(path), json=body)
            except self._errors as exc:
                said = getattr(exc, "detail_text", None) or str(exc)  # (etcd3gw's errors keep their text there)
                last = f"{shown}: {type(exc).__name__}: {said[:200]}"
            self.failures_total += 1
            self._at = (self._at + 1) % len(self._members)
            if self._stopping:
                break
        raise _Unreachable(last)

    def _unexpected(self, said: str) -> None:
        """A bug's error (its traceback logged when it changes, else once a minute: a round can repeat it
        20 times a second), shown as etcd's error."""
        now = time.monotonic()
        if said != self._said or now - self._said_at >= 60:
            log.exception("etcd registry: unexpected error; tried again (logged again once a minute)")
            self._said, self._said_at = said, now
        self._seen_down(f"unexpected error (logged): {said}")

    def _seen_ok(self) -> None:
        view = self.view
        if not view.reachable:
            if view.down_since is not None and self._contacted:
                log.info("etcd reachable again after %.1f s", time.monotonic() - view.down_since)
            self._publish(reachable=True, down_since=None, error="")
            self._contacted = True

    def _seen_down(self, error: str) -> None:
        view = self.view
        if view.reachable:
            log.warning("etcd unreachable: %s (known queues go on; new queues wait for it)", error)
        self._publish(reachable=False, down_since=view.down_since or time.monotonic(), error=error)

    def _publish(self, **changes) -> None:
        self.view = dataclasses.replace(self.view, **changes)

    def _register(self) -> None:
        """This server's records: its entry (created, or checked as its store's), then alive under a lease."""
        key = self.prefix + "shards/" + self.me.name
        self._register_at = time.monotonic() + RETRY_S
        said = gw.claim_entry(self._call, key, self.me, self.store_id)
        if said:  # (another store's name, or a record not pzq's: until the operator deletes it)
            if said != self.conflict:
                log.error("%s", said)
            self.conflict, self._register_at = said, time.monotonic() + CONFLICT_RETRY_S
            return
        if self.conflict:
            log.info("etcd: shard %r's entry is this store's now: registered", self.me.name)
            self.conflict = ""
        lease = self._call("lease/grant", {"TTL": LEASE_TTL_S})["ID"]
        alive = json.dumps({"store_id": self.store_id}).encode()
        alive_key = gw.key(self.prefix, "alive/", self.me.name)
        self._call("kv/put", {"key": alive_key, "value": gw.b64(alive), "lease": lease})
        self._lease, self._refresh_at = lease, time.monotonic() + REFRESH_S
        log.info("registered in etcd as shard %r (lease of %d s)", self.me.name, LEASE_TTL_S)

    def _refresh(self) -> None:
        answer = self._call("lease/keepalive", {"ID": self._lease})
        if int(answer.get("result", {}).get("TTL", -1)) <= 0:  # the lease lapsed (etcd away longer than it)
            self._lease = None
            self._register()
        self._refresh_at = time.monotonic() + REFRESH_S

    def _revoke(self) -> None:
        if self._lease is not None:
            try:
                self._call("kv/lease/revoke", {"ID": self._lease})
            except _Unreachable:
                pass  # (it lapses in LEASE_TTL_S)

    def _poll(self) -> None:
        """The shards and who is alive, and placements new since the last read (all of them if etcd's
        revision went back: a restored etcd)."""
        self._poll_at = time.monotonic() + POLL_S
        self._members_held = gw.read_changed(self._call, self.prefix + "shards/", MAX_SHARDS + 1, self._members_held)
        self._alive_held = gw.read_changed(self._call, self.prefix + "alive/", MAX_SHARDS + 1, self._alive_held)
        read: dict[str, tuple[Shard, str]] = {}
        for key, (_, value) in sorted(self._members_held.items())[:MAX_SHARDS]:
            try:
                shard, store_id = records.decode_member(value)
            except records.BadRecord:
                continue
            if key.decode("utf-8", "replace").rpartition("/")[2] == shard.name:  # (not one claiming another's)
                read[shard.name] = (shard, store_id)
        alive_names = set()
        for key, (_, value) in self._alive_held.items():
            name = key.decode("utf-8", "replace").rpartition("/")[2]
            try:
                found = records.loads(value)
            except records.BadRecord:
                continue
            said = found.get("store_id") if isinstance(found, dict) else None
            if name in read and read[name][1] == said:
                alive_names.add(name)
        if read != self._members_read:
            self._members_read, self._dirty = read, True
        shards = ShardList(tuple(shard for shard, _ in read.values())) if read else self.view.shards
        self._publish(shards=shards, alive=frozenset(alive_names))
        self._read_placements()

    def _read_placements(self) -> None:
        """Pages of placement records (PAGE a call: each within its second), each after the last key's
        bytes (a key that is not UTF-8 is skipped, read past). READ_BUDGET_S a round: a longer read goes
        on at the next round, where it stopped. A read of them all (the first, or etcd's revision went
        back: restored from a backup) finds the known placements etcd lost: they are written back."""
        prefix, deadline = (self.prefix + "placements/").encode(), time.monotonic() + READ_BUDGET_S
        start, first_rev, seen = self._reading or (b"", None, set() if self._rev == 0 else None)
        while not self._stopping:
            self._reading = (start, first_rev, seen)  # (a call failing here: the read goes on from here)
            if time.monotonic() >= deadline:
                return
            body = {"key": gw.b64(prefix + start), "limit": self._page, "min_mod_revision": self._rev + 1}
            try:
                answer = self._call("kv/range", {**body, "range_end": gw.next_key(prefix.decode())})
            except _Unreachable:  # (records too big to read within the second: fewer a call next time)
                self._page = max(1, self._page // 2)
                raise
            self._page = min(PAGE, self._page * 2)
            rev = int(answer["header"]["revision"])
            if rev < self._rev:  # (etcd restored from a backup: read everything again)
                log.warning("etcd's revision went back (%d < %d): placements read again", rev, self._rev)
                self._rev, start, first_rev, seen = 0, b"", None, set()
                continue
            first_rev, kvs = first_rev or rev, answer.get("kvs", [])
            for kv in kvs:
                name = base64.b64decode(kv["key"])[len(prefix) :]
                try:
                    self._adopt(name.decode(), gw.value_of(kv))
                except UnicodeDecodeError:
                    log.warning("etcd: a placement key that is not UTF-8 (%r): ignored", name[:80])
                else:
                    if seen is not None:
                        seen.add(name.decode())
            if not answer.get("more") or not kvs:
                break
            start = base64.b64decode(kvs[-1]["key"])[len(prefix) :] + b"\0"
        self._reading = None
        if first_rev is not None and not self._stopping:
            self._rev = max(self._rev, first_rev)
            if seen is not None:
                self._lost = [queue for queue in list(self.placements) if queue not in seen]

    def _write_back(self) -> None:
        """Known placements etcd lost (restored from an older state), written back a few a round, each
        create-if-absent: a queue placed again since then by a server that never knew it is logged."""
        for _ in range(min(len(self._lost), WRITTEN_BACK)):
            queue = self._lost[-1]
            mine = self.placements[queue]
            answer = self._call("kv/txn", gw.create_or_read(self.prefix + "placements/" + queue, mine.encode()))
            self._lost.pop()
            found = answer["responses"][0]["response_range"].get("kvs", []) if not answer.get("succeeded") else []
            if found and gw.value_of(found[0]) != mine.encode():
                log.error("etcd: %r was placed again after etcd lost its placement; this server keeps its own", queue)

    def _adopt(self, queue: str, data: bytes) -> None:
        """A placement read from etcd kept (a bad record, or one past the bounds, logged and left)."""
        if queue in self.placements:
            return  # (placed once: a record is never changed by pzq)
        try:
            found = records.decode(queue, data)
        except records.BadRecord as exc:
            log.warning("etcd: the placement of %r is not pzq's (%s): ignored", queue[:80], exc)
            return
        if self.full(len(data)):
            log.warning("etcd: %d placements held (the most): %r not kept", len(self.placements), queue[:80])
            return
        self.placements[queue] = found
        self._encoded[queue] = found.encode()  # (the cache file is written from these: no encoding a save)
        self._placement_bytes += len(data) + len(queue)
        self._dirty = True

    def _place_pending(self) -> None:
        """Place what the loop asked for, a transaction each: ours made, or the one already there read."""
        while not self._stopping:
            with self._lock:
                if not self._pending:
                    return
                queue, partitions = next(iter(self._pending.items()))
            if queue not in self.placements and not self.conflict and not self.full(1024):
                self._place(queue, partitions)
            with self._lock:
                self._pending.pop(queue, None)

    def _place(self, queue: str, partitions: int) -> None:
        view = self.view
        if view.shards is None or not view.alive:
            self._poll()
            view = self.view
        alive = [shard for shard in (view.shards.shards if view.shards else ()) if shard.name in view.alive]
        if not alive:
            return  # (nobody alive: not even this server yet; asked again by the next request)
        try:
            chosen = records.choose(queue, partitions, alive)
        except ConfigError as exc:
            log.warning("placing %r: %s", queue[:80], exc)
            return
        key = self.prefix + "placements/" + queue
        answer = self._call("kv/txn", gw.create_or_read(key, chosen.encode()))
        if answer.get("succeeded"):
            self.placed_total += 1
            log.info("placed %r: %s", queue[:80], ", ".join(f"{n} on {s}" for n, s in chosen.places[:8]))
            self._adopt(queue, chosen.encode())
            return
        found = answer["responses"][0]["response_range"].get("kvs", [])
        if found:
            self._adopt(queue, gw.value_of(found[0]))

    # -- the cache file (pzq/placement_cache.py) -------------------------------------------------------
    def _save_if_due(self, now: float) -> None:
        if not self._dirty or now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at, self._dirty = now if now != float("inf") else 0.0, False
        cache.save(self.cache_path, self.prefix, list(self._members_read.values()), list(self._encoded.items()))

    def _load_cache(self) -> None:
        """What an earlier run saw (a missing or damaged cache is only a cache: etcd has the records)."""
        found = cache.load(self.cache_path, 2 * MAX_PLACEMENT_BYTES, self.prefix)
        if found is None:
            return
        shards, placed = found
        for queue, data in placed:
            self._adopt(queue, data)
        self._members_read = {shard.name: (shard, store_id) for shard, store_id in shards}
        self._dirty = False
        if shards:
            self._publish(shards=ShardList(tuple(shard for shard, _ in shards)))
        log.info("etcd: %d placements and %d shards from the cache", len(self.placements), len(shards))
