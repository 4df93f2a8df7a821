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
import os
import threading
import time
import urllib.parse

from pzq import placement as records
from pzq.errors import ConfigError
from pzq.shards import MAX_SHARDS, Shard, ShardList

log = logging.getLogger("pzq.etcd")
CALL_TIMEOUT_S = 1.0  # each etcd call's most (connect and answer): a stopped member costs this, once
LEASE_TTL_S = 5  # a server silent this long (stopped, cut off, killed) is shown as gone
REFRESH_S = 1.0  # how often the lease is refreshed
RETRY_S = 0.25  # while etcd does not answer, a round at most this often (not a spin; its return seen soon)
POLL_S = 0.5  # how often the shards, who is alive and new placements are read (seen within 2 s of etcd's return)
PAGE = 256  # placement records a read asks for at once (each up to 384 KiB: etcd's request limit is 1.5 MiB)
MAX_PLACEMENTS = 100_000  # queues placed at most (past it a new queue is refused, named)
MAX_PLACEMENT_BYTES = 64 << 20  # and their records' bytes at most (what the server's memory holds of them)
PENDING_MOST = 1024  # placement requests waiting for the thread (more are refused as "being placed" again)
SAVE_EVERY_S = 1.0  # the cache file is written at most this often, when something new was seen


@dataclasses.dataclass(frozen=True)
class View:
    """What the registry knows (the thread replaces it whole): every registered shard (``shards``: gone
    ones too, their queues still live there), those ``alive``, whether etcd answered the last call
    (``reachable``), since when it has not (``down_since``, monotonic), and why (``error``)."""

    shards: ShardList | None
    alive: frozenset[str]
    reachable: bool
    down_since: float | None
    error: str
    listed: list[dict[str, str]] | None = None  # ``shards.to_dict()``: the same in every WHERE

    def __post_init__(self) -> None:
        object.__setattr__(self, "listed", self.shards.to_dict() if self.shards is not None else None)


class _Unreachable(Exception):
    pass


def _key(*parts: str) -> str:
    return base64.b64encode("".join(parts).encode()).decode()


def _next_key(prefix: str) -> str:
    """The end of the range of every key starting with ``prefix`` (its last byte plus one)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def _value(kv: dict) -> bytes:
    return base64.b64decode(kv.get("value", ""))


def parse_urls(text: str) -> list[tuple[str, str]]:
    """``http://host:port,...`` as [(base url, shown)]; ConfigError for anything else."""
    out = []
    for url in (part.strip() for part in text.split(",")):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
            raise ConfigError(f"--etcd {url!r}: give etcd's client URLs, http://host:2379 (comma-separated)")
        out.append((f"{parsed.scheme}://{parsed.netloc}", url))
    if not out:
        raise ConfigError("--etcd: no URL given")
    return out


class EtcdRegistry(threading.Thread):
    """The registry's thread: ``start()`` it, ``place()`` from the loop, ``stop()`` at the end."""

    def __init__(self, urls: str, prefix: str, me: Shard, store_id: str, cache_path: str):
        super().__init__(name="pzq-etcd", daemon=True)
        import etcd3gw  # (etcd's JSON gateway client: only a server given --etcd loads it and requests)
        import requests

        session = requests.Session()
        session.trust_env = False  # (a proxy from the environment must not stand between pzq and etcd)
        self._errors: tuple[type[Exception], ...] = (
            etcd3gw.exceptions.Etcd3Exception,
            requests.RequestException,
            ValueError,
            KeyError,
        )
        self._members = parse_urls(urls)
        self._clients = [_client(etcd3gw, base, session) for base, _ in self._members]
        self._at = 0  # the member the next call goes to
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.me, self.store_id, self.cache_path = me, store_id, cache_path
        self.placements: dict[str, records.Placement] = {}
        self._placement_bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # queue -> partitions, asked by the loop
        self._wake = threading.Event()
        self._stopping = False
        self._lease: str | None = None
        self._refresh_at = self._poll_at = 0.0
        self._rev = 0  # the store revision placements were read up to
        self._members_read: dict[str, tuple[Shard, str]] = {}
        self._dirty = False
        self._contacted = False  # (etcd answered once: a later return is logged)
        self._saved_at = 0.0
        self.conflict = ""  # another store registered this shard's name: it neither registers nor places
        self.calls_total = self.failures_total = self.placed_total = 0
        self.view = View(None, frozenset(), False, time.monotonic(), "not contacted yet")
        self._load_cache()

    # -- the loop's side ------------------------------------------------------------------------
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
                if self._lease is None and not self.conflict:
                    self._register()
                elif self._lease is not None and now >= self._refresh_at:
                    self._refresh()
                self._place_pending()
                if now >= self._poll_at or self._lease is None:
                    self._poll()
                self._seen_ok()
            except _Unreachable as exc:
                self._seen_down(str(exc))
            except Exception:  # noqa: BLE001 - the thread must outlive a bug: logged, tried again next round
                log.exception("etcd registry: unexpected error; tried again")
                self._seen_down("unexpected error (logged)")
            self._save_if_due(time.monotonic())
            pause = max(0.05, min(self._refresh_at, self._poll_at) - time.monotonic())  # (past due after a failure)
            self._wake.wait(pause if self.view.reachable else max(pause, RETRY_S))
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
                return client.post(client.get_url(path), json=body)
            except self._errors as exc:
                last = f"{shown}: {type(exc).__name__}: {str(exc)[:200]}"
            self.failures_total += 1
            self._at = (self._at + 1) % len(self._members)
            if self._stopping:
                break
        raise _Unreachable(last)

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
        mine = records.encode_member(self.me, self.store_id)
        answer = self._call("kv/txn", _create_or_read(key, mine))
        if not answer.get("succeeded"):
            found = answer["responses"][0]["response_range"].get("kvs", [])
            if found:
                shard, store_id = records.decode_member(_value(found[0]))
                if store_id != self.store_id:
                    self.conflict = (
                        f"shard {self.me.name!r} is registered in etcd by another store (id {store_id}, this "
                        f"store's {self.store_id}): two servers with one name? this one neither registers nor "
                        f"places; if that store is gone for good, delete {key} (etcdctl del)"
                    )
                    log.error("%s", self.conflict)
                    return
                if shard != self.me:  # (its endpoints moved: the entry follows)
                    self._call("kv/put", {"key": _key(key), "value": base64.b64encode(mine).decode()})
        lease = self._call("lease/grant", {"TTL": LEASE_TTL_S})["ID"]
        alive = json.dumps({"store_id": self.store_id}).encode()
        self._call("kv/put", {"key": _key(self.prefix, "alive/", self.me.name), "value": _b64(alive), "lease": lease})
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
        members = self._range(self.prefix + "shards/", MAX_SHARDS + 1)["kvs"]
        alive = self._range(self.prefix + "alive/", MAX_SHARDS + 1)["kvs"]
        read: dict[str, tuple[Shard, str]] = {}
        for kv in members[:MAX_SHARDS]:
            try:
                shard, store_id = records.decode_member(_value(kv))
            except records.BadRecord:
                continue
            read[shard.name] = (shard, store_id)
        alive_names = set()
        for kv in alive:
            name = base64.b64decode(kv["key"]).decode("utf-8", "replace").rpartition("/")[2]
            try:
                store_id = json.loads(_value(kv)).get("store_id")
            except (ValueError, AttributeError):
                continue
            if name in read and read[name][1] == store_id:
                alive_names.add(name)
        if read != self._members_read:
            self._members_read, self._dirty = read, True
        shards = ShardList(tuple(shard for shard, _ in read.values())) if read else self.view.shards
        self._publish(shards=shards, alive=frozenset(alive_names))
        self._read_placements()

    def _read_placements(self) -> None:
        start, prefix, first_rev = "", self.prefix + "placements/", None
        while not self._stopping:
            body = {
                "key": _key(prefix, start),
                "range_end": _next_key(prefix),
                "limit": PAGE,
                "min_mod_revision": self._rev + 1,
            }
            answer = self._call("kv/range", body)
            rev = int(answer["header"]["revision"])
            if rev < self._rev:  # (etcd restored from a backup: read everything again)
                log.warning("etcd's revision went back (%d < %d): placements read again", rev, self._rev)
                self._rev = 0
                continue
            first_rev = first_rev or rev
            kvs = answer.get("kvs", [])
            for kv in kvs:
                self._adopt(base64.b64decode(kv["key"]).decode("utf-8", "replace")[len(prefix) :], _value(kv))
            if not answer.get("more") or not kvs:
                break
            start = base64.b64decode(kvs[-1]["key"]).decode("utf-8", "replace")[len(prefix) :] + "\0"
        if first_rev is not None:
            self._rev = max(self._rev, first_rev)

    def _range(self, prefix: str, limit: int) -> dict:
        answer = self._call("kv/range", {"key": _key(prefix), "range_end": _next_key(prefix), "limit": limit})
        answer.setdefault("kvs", [])
        return answer

    def _adopt(self, queue: str, data: bytes) -> None:
        """A placement read from etcd kept (a bad record, or one past the bounds, logged and left)."""
        if queue in self.placements:
            return  # (placed once: a record is never changed by pzq)
        try:
            found = records.decode(queue, data)
        except records.BadRecord as exc:
            log.warning("etcd: the placement of %r is not pzq's (%s): ignored", queue[:80], exc)
            return
        if len(self.placements) >= MAX_PLACEMENTS or self._placement_bytes + len(data) > MAX_PLACEMENT_BYTES:
            log.warning("etcd: %d placements held (the most): %r not kept", len(self.placements), queue[:80])
            return
        self.placements[queue] = found
        self._placement_bytes += len(data) + len(queue)
        self._dirty = True

    def _place_pending(self) -> None:
        """Place what the loop asked for, a transaction each: ours made, or the one already there read."""
        while not self._stopping:
            with self._lock:
                if not self._pending:
                    return
                queue, partitions = next(iter(self._pending.items()))
            if queue not in self.placements and not self.conflict:
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
        answer = self._call("kv/txn", _create_or_read(key, chosen.encode()))
        if answer.get("succeeded"):
            self.placed_total += 1
            log.info("placed %r: %s", queue[:80], ", ".join(f"{n} on {s}" for n, s in chosen.places[:8]))
            self._adopt(queue, chosen.encode())
            return
        found = answer["responses"][0]["response_range"].get("kvs", [])
        if found:
            self._adopt(queue, _value(found[0]))

    # -- the cache file -----------------------------------------------------------------------------
    def _save_if_due(self, now: float) -> None:
        if not self._dirty or now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at, self._dirty = now if now != float("inf") else 0.0, False
        data = {
            "shards": [json.loads(records.encode_member(s, i)) for s, i in self._members_read.values()],
            "placements": {q: json.loads(p.encode()) for q, p in list(self.placements.items())},
        }
        tmp = self.cache_path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump(data, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.cache_path)
        except OSError as exc:
            log.warning("etcd: the placement cache %s was not written: %s", self.cache_path, exc)

    def _load_cache(self) -> None:
        """What an earlier run saw (a missing or damaged cache is only a cache: etcd has the records)."""
        try:
            if os.path.getsize(self.cache_path) > 2 * MAX_PLACEMENT_BYTES:
                raise ValueError("too big")
            with open(self.cache_path, encoding="utf-8") as cached:
                data = json.load(cached)
            shards = [records.decode_member(json.dumps(entry).encode()) for entry in data["shards"][:MAX_SHARDS]]
            for queue, record in data["placements"].items():
                self._adopt(queue, json.dumps(record).encode())
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError, records.BadRecord) as exc:
            log.warning("etcd: placement cache %s unreadable (%s): etcd's records are read", self.cache_path, exc)
            return
        self._members_read = {shard.name: (shard, store_id) for shard, store_id in shards}
        self._dirty = False
        if shards:
            self._publish(shards=ShardList(tuple(shard for shard, _ in shards)))
        log.info("etcd: %d placements and %d shards from the cache", len(self.placements), len(shards))


def _client(etcd3gw, base: str, session):
    """An etcd3gw client of the member at ``base`` (http://host:port), a call at most CALL_TIMEOUT_S."""
    parsed = urllib.parse.urlsplit(base)
    return etcd3gw.Etcd3Client(
        host=parsed.hostname,
        port=parsed.port or 2379,
        protocol=parsed.scheme,
        timeout=CALL_TIMEOUT_S,
        api_path="/v3/",
        session=session,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _create_or_read(key: str, value: bytes) -> dict:
    """A transaction: put ``key`` if it has never been made, else read it (one round trip either way)."""
    return {
        "compare": [{"key": _key(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": _key(key), "value": _b64(value)}}],
        "failure": [{"request_range": {"key": _key(key)}}],
    }
