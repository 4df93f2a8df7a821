"""etcd's JSON gateway as the registry (pzq/etcd_registry.py) speaks it: the members' URLs, a client of
each, and the keys, values and transactions of its calls (keys and values are base64 in the gateway)."""

from __future__ import annotations

import base64
import threading
import time
import urllib.parse

from pzq import placement as records
from pzq.errors import ConfigError
from pzq.shards import Shard


def key(*parts: str) -> str:
    return base64.b64encode("".join(parts).encode()).decode()


def next_key(prefix: str) -> str:
    """The end of the range of every key starting with ``prefix`` (its last byte plus one)."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def value_of(kv: dict) -> bytes:
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


def client(etcd3gw, base: str, session, timeout: float):
    """An etcd3gw client of the member at ``base`` (http://host:port), a call at most ``timeout``."""
    parsed = urllib.parse.urlsplit(base)
    return etcd3gw.Etcd3Client(
        host=parsed.hostname,
        port=parsed.port or 2379,
        protocol=parsed.scheme,
        timeout=timeout,
        api_path="/v3/",
        session=session,
    )


def session(requests, ca: str = "", cert: str = "", key: str = ""):
    """The HTTP session of every member's client: no proxy from the environment between pzq and etcd;
    with https, etcd's certificate checked (against ``ca``, else the system's CAs) and this server's
    ``cert`` and ``key`` shown if given (etcd's --client-cert-auth)."""
    made = requests.Session()
    made.trust_env = False
    made.verify = ca or True
    if cert:
        made.cert = (cert, key)
    return made


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def create_or_read(name: str, value: bytes) -> dict:
    """A transaction: put ``name`` if it has never been made, else read it (one round trip either way)."""
    return {
        "compare": [{"key": key(name), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
        "success": [{"request_put": {"key": key(name), "value": b64(value)}}],
        "failure": [{"request_range": {"key": key(name)}}],
    }


RECORD_MOST = 8 << 10  # a member's or alive record's bytes at most: a bigger value is no pzq record's
CHANGED_PAGE = 2  # changed records read a call (2 of etcd's biggest values, 1.5 MiB: ~4 MB of answer, in a second)
CHANGED_BUDGET_S = 0.3  # and for this long a poll at most (the rest at the next)


def read_changed(call, prefix: str, limit: int, held: dict[bytes, tuple[int, bytes]]) -> dict[bytes, tuple[int, bytes]]:
    """The records under ``prefix``, at most ``limit`` (key -> (mod revision, value)), their values read only
    when changed since ``held`` (the last read): the keys alone are listed each time, so a big record is
    read once, not every poll. Changed values are read CHANGED_PAGE a call, for CHANGED_BUDGET_S a poll
    at most (each call within its second however big the records); one not read yet keeps its old value
    (a new key is absent) until the next poll. A value over RECORD_MOST is kept as b"" (a bad record)."""
    body = {"key": key(prefix), "range_end": next_key(prefix), "limit": limit, "keys_only": True}
    listed = {
        base64.b64decode(kv["key"]): int(kv.get("mod_revision", 0)) for kv in call("kv/range", body).get("kvs", [])
    }
    out = {name: held[name] for name in listed if name in held}
    stale = sorted(name for name, rev in listed.items() if name not in held or held[name][0] != rev)
    deadline = time.monotonic() + CHANGED_BUDGET_S
    while stale and time.monotonic() < deadline:
        since = min(listed[name] for name in stale)
        body = {"key": b64(stale[0]), "range_end": next_key(prefix), "limit": CHANGED_PAGE, "min_mod_revision": since}
        kvs = call("kv/range", body).get("kvs", [])
        for kv in kvs:
            name, value = base64.b64decode(kv["key"]), value_of(kv)
            if name in listed:
                out[name] = (int(kv.get("mod_revision", 0)), value if len(value) <= RECORD_MOST else b"")
        last = base64.b64decode(kvs[-1]["key"]) if kvs else None
        stale = [name for name in stale if last is not None and name > last]
    return out


class CallTimeout(Exception):
    """A call that did not end within its time (a member answering a byte at a time), or one not made
    because too many such calls are still stuck."""


class Deadlines:
    """Calls each ended within ``timeout`` seconds, whatever the member does: requests' timeout bounds
    each read, not the answer, so a member that answers a byte a second would hold a call for ever. Each
    call runs in a daemon thread of its own, waited for ``timeout``; one still running then is left to
    end by itself (at most ``most`` of them: past that a call fails at once)."""

    def __init__(self, timeout: float, most: int = 8) -> None:
        self.timeout, self.most = timeout, most
        self._running = 0
        self._lock = threading.Lock()

    def call(self, fn, *args, **kwargs):
        with self._lock:
            if self._running >= self.most:
                raise CallTimeout(f"{self._running} calls still unanswered past {self.timeout} s")
            self._running += 1
        done, out = threading.Event(), {}

        def run() -> None:
            try:
                out["answer"] = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                out["error"] = exc
            finally:
                with self._lock:
                    self._running -= 1
                done.set()

        threading.Thread(target=run, name="pzq-etcd-call", daemon=True).start()
        if not done.wait(self.timeout):
            raise CallTimeout(f"no answer within {self.timeout} s")
        if "error" in out:
            raise out["error"]
        return out["answer"]


def claim_entry(call, name: str, me: Shard, store_id: str) -> str:
    """Key ``name`` made this shard's entry (``me``'s endpoints and ``store_id``), or found to be: its
    endpoints updated if they moved. "" when it is, else why not (a conflict, for the operator)."""
    mine = records.encode_member(me, store_id)
    answer = call("kv/txn", create_or_read(name, mine))
    found = [] if answer.get("succeeded") else answer["responses"][0]["response_range"].get("kvs", [])
    if not found:
        return ""
    try:
        shard, kept_id = records.decode_member(value_of(found[0]))
    except records.BadRecord as exc:
        return f"shard {me.name!r}'s record in etcd is not pzq's ({exc}): delete {name} (etcdctl del)"
    if kept_id != store_id:
        return (
            f"shard {me.name!r} is registered in etcd by another store (id {kept_id}, this store's {store_id}): "
            f"two servers with one name? this one neither registers nor places; if that store is gone for "
            f"good, delete {name} (etcdctl del)"
        )
    if shard != me:  # (its endpoints moved: the entry follows)
        call("kv/put", {"key": key(name), "value": b64(mine)})
    return ""
