"""The API gateway: answers pzq API requests (protocols/api.py) with the broker, the leases and the
store. No socket here: the server reads requests, calls ``handle`` and sends the replies after the
turn's commit, so an OK never leaves for a lease, an acknowledgement or a message not yet on disk.

PRODUCE with a ``key`` is idempotent: the key, the count and a digest of the messages are stored
with the messages, and the same key with the same messages seen again within ``dedup_window`` seconds
is answered from that record without storing anything. The same key with other messages (a re-run
Spark task whose rows came in another order) is stored: a duplicate is better than a lost message.
The Spark sink keys each chunk by query, batch, partition and chunk, so a batch Spark runs again with
the same rows is not stored twice.

A PRODUCE of one message past ``Limits.body_chunk_bytes`` is written a part per turn (gateways/parted.py,
driven by the endpoint, which serves the client's next requests only once it is answered): its digest is
computed a part at a time, and its key, its record and its answer come in the turn of its last part, so
a resend of it is still answered from its key. Several messages must fit ``Limits.api_produce_bytes``.
"""

from __future__ import annotations

import collections
import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence

import msgpack

from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import ONLY, BrokerSurface, Send
from pzq.gateways.parted import Big, Parted
from pzq.leases import Leases
from pzq.logs import warn_bad
from pzq.permissions import CONSUME, PHRASES, PRODUCE, Permissions
from pzq.protocols import api
from pzq.shards import where_answer
from pzq.store import Message, Upload
from pzq.store.dedup_keys import NATIVE_PREFIX, DedupKeys, Produced

# WHERE's answer with brief 1 (the list and the places left out; etcd's placement, who is alive, kept)
BRIEF = ("shard", "partitions", "held", "placed", "alive", "reachable")

log = logging.getLogger("pzq.api")


LATER: dict = {}  # what a request carried out over turns answers now: nothing (its answer comes later)


def _packed_head(queue: str, size: int) -> bytes:
    """What ``msgpack.packb([(queue, body)])`` holds before the body's bytes (a body of ``size`` bytes,
    past 64 KiB: a bin 32), so that a big message's digest can be taken a part at a time."""
    return b"\x91\x92" + msgpack.packb(queue) + b"\xc6" + size.to_bytes(4, "big")


def _row(seq: int, message: Message) -> list:
    return [seq, message.id, message.enqueued_us, message.deliveries, b"".join(message.frames)]


class ApiGateway:
    """Carries out API requests; one instance per server, driven by the loop."""

    def __init__(
        self,
        broker: BrokerSurface,
        leases: Leases,
        keys: DedupKeys,
        *,
        max_message_size: int,
        dedup_window_s: float,
        limits: Limits = DEFAULT_LIMITS,
        permissions: Permissions | None = None,
        where: Callable[[str, bool], dict] | None = None,
    ):
        """``keys`` is the store's table of PRODUCE dedup keys; ``limits`` gives snapshot_max,
        max_dedup_keys (each ~100 B in memory and on disk), api_reply_bytes and api_max_produce;
        ``permissions`` says which queues each CURVE key may produce to and consume from (None: any);
        ``where`` answers WHERE a queue (the server's, pzq/server/where.py; None: a server that is no shard);
        in a cluster kept in etcd its ``check_produce`` refuses a PRODUCE to a queue not placed here."""
        self.broker = broker
        self.permissions = permissions
        self.keys = keys
        self.leases = leases
        self.limits = limits
        self.max_message_size = max_message_size
        self.dedup_window_us = int(dedup_window_s * 1e6)
        self.requests_total = 0
        self.reply_waits = True  # the last reply waits for the commit of its writes (LEASE durable 0: no)
        self.errors_total = 0
        self.duplicates_total = 0
        self.where = where or self._where_alone
        self._check_placed: Callable[[list[str]], None] | None = getattr(where, "check_produce", None)
        self.parts = Parted(broker, limits)  # big PRODUCEs, written a part per turn (the endpoint drives it)
        self.load()

    def load(self) -> None:
        """Read the dedup keys (oldest first, for pruning): at start-up and after a rollback."""
        # (native batch ids share the table: the native gateway keeps those)
        keys = [(record.stored_us, key) for key, record in self.keys.items() if not key.startswith(NATIVE_PREFIX)]
        # key -> when it was last stored, oldest first: one entry per key, however often it is reused
        self._keys_by_age: collections.OrderedDict[str, int] = collections.OrderedDict(
            (key, stored_us) for stored_us, key in sorted(keys)
        )

    def received(self, socket: str, frames: list[bytes], *, now: Now, user: str | None) -> list[Send]:
        reply = self.handle(frames, now=now, user=user)
        return [] if reply is None else [Send(ONLY, reply)]

    def dispatch(self, *, now: Now, blocked: frozenset = frozenset()) -> list[Send]:
        return []  # the API only answers

    def unsent(self, send: Send) -> bool:
        return True  # (the endpoint's Replies keep what a client has not read yet)

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        """Every reply of the turn becomes "store-failed": nothing it said was done is on disk."""
        detail = "store failure: nothing was done, try again"
        return [Send(ONLY, api.as_error(send.frames, "store-failed", detail)) for send in sends]

    def recover(self) -> None:
        self.load()

    def next_wake(self, now: float) -> float | None:
        return None

    def handle(self, frames: list[bytes], *, now: Now, user: str | None = None) -> list[bytes] | None:
        """The reply to one request (None when it cannot be answered: no delimiter or id). ``user`` is
        the client's CURVE key (z85) when the endpoint uses CURVE: consumer groups belong to one key."""
        self.reply_waits = True  # (until a request says otherwise: see LEASE's ``durable``)
        limits = self.limits
        parsed = api.parse_request(
            frames, self.max_message_size + (1 << 20), limits.api_max_produce, limits.api_produce_bytes
        )
        if parsed is None:
            warn_bad("api", "unanswerable", f"{len(frames)} frame(s) without a delimiter and request id")
            return None
        self.requests_total += 1
        if isinstance(parsed, api.Rejected):
            return self._error(parsed.request, parsed.error)
        try:
            results = self._carry_out(parsed, now, user, frames[0])
            return None if results is LATER else api.ok(parsed, results)
        except ProtocolError as exc:
            return self._error(parsed, exc)
        except StoreFull as exc:
            return self._error(parsed, ProtocolError("queue-full", str(exc)))

    def _error(self, request: api.Request, exc: ProtocolError) -> list[bytes]:
        self.errors_total += 1
        if exc.code != "not-permitted":  # (pzq.permissions logged that one, with the client's name)
            warn_bad("api", exc.code, exc.detail)
        return api.error(request, exc.code, exc.detail)

    def _carry_out(self, request: api.Request, now: Now, user: str | None, peer: bytes) -> dict:
        """``peer``: the caller's routing identity, its connection (a group it makes counts against its
        key's share with CURVE, else against the connection's)."""
        a, leases = request.args, self.leases
        if request.command == "PRODUCE":
            messages = api.produce_messages(a, self.limits.api_max_produce)
            # All or none: one queue refused refuses the request, before anything is stored or made.
            self._check(user, PRODUCE, request.command, (queue for queue, _ in messages))
            if self._check_placed is not None:
                self._check_placed(list(dict.fromkeys(queue for queue, _ in messages)))
            owner = ("key", user) if user else ("api", request.routing)
            if len(messages) == 1 and self.parts.big(len(messages[0][1])):
                return self._produce_big(request, messages[0], peer, owner)
            # (a body of 64 KiB or more is a view of the request's frame: a copy of it, under 2 MiB in all)
            return self._produce(a, [(queue, bytes(body)) for queue, body in messages], now.wall_us, owner)
        if request.command == "WHERE":  # (names and counts, never bodies: no right asked, as the monitor's figures)
            if a.get("place"):  # (placing writes a record in etcd, for good: a producer's, with its right)
                self._check(user, PRODUCE, "WHERE place", (a["queue"],))
            where = self.where(a["queue"], bool(a.get("place")))
            return {key: where[key] for key in BRIEF if key in where} if a.get("brief") else where
        self._check(user, CONSUME, request.command, (a["queue"],))  # (every other command reads one queue)
        if request.command == "OFFSETS":
            base, end = leases.offsets(a["queue"], a["group"], user)
            return {"base": base, "end": end}
        if request.command == "LEASE":
            self.reply_waits = a.get("durable", 1) != 0  # (0: its leases become durable with a later commit)
            base, end = leases.lease(a["queue"], a["group"], a["after"], a["max"], now=now, user=user, client=peer)
            return {"base": base, "end": end}
        if request.command == "FETCH":
            return self._fetch(a, now.wall_us, user)
        if request.command == "ACK_UPTO":
            return {"base": leases.ack_upto(a["queue"], a["group"], a["upto"], now_us=now.wall_us, user=user)}
        if request.command == "INFO":
            info = self.broker.queues.info(a["queue"])
            if info is None:
                return {"first": 0, "next": 0, "depth": 0}
            head = self.broker.queues.peek(a["queue"], 0, 1)
            return {"first": head[0].seq if head else info.next_seq, "next": info.next_seq, "depth": info.count}
        return self._snapshot(a)  # (SNAPSHOT: parse_request lets no other command through)

    def _where_alone(self, queue: str, place: bool = False) -> dict:
        """WHERE's answer of a server that is no shard and keeps no partitions: the queues of it it holds."""
        info = self.broker.queues.info
        return where_answer(queue, "", None, 0, lambda name: getattr(info(name), "count", None))

    def _check(self, user: str | None, right: str, command: str, queues: Iterable[str]) -> None:
        """Raise ``not-permitted`` unless the client of CURVE key ``user`` has ``right`` on every one of
        ``queues`` (the first refused is the one counted and named)."""
        if self.permissions is None or not self.permissions.enabled:  # (no file: nothing to look up)
            return
        for queue in dict.fromkeys(queues):
            if not self.permissions.key_may(user, right, queue, "api", command):
                raise ProtocolError(
                    "not-permitted", f"{command} refused: this client may not {PHRASES[right]} {queue!r}"
                )

    def _fetch(self, a: dict, now_us: int, user: str | None) -> dict:
        """Leased messages of ``lo .. hi-1``; ``next`` is where the reply ends (``hi`` unless cut short
        at api_reply_bytes) and ``gone`` counts what is missing before it."""
        messages, gone, upto = self.leases.fetch(
            a["queue"], a["group"], a["lo"], a["hi"], now_us=now_us, max_bytes=self.limits.api_reply_bytes, user=user
        )
        return {"messages": [_row(lseq, m) for lseq, m in messages], "gone": gone, "next": upto}

    def _snapshot(self, a: dict) -> dict:
        """Stored messages with ``after <= seq < before``, at most ``limit`` and about api_reply_bytes:
        read-only, nothing changes. ``next`` is where to go on from (``before`` when done)."""
        limit, before = min(max(a["limit"], 1), self.limits.snapshot_max), a["before"]
        rows: list[list] = []
        size, after = 0, a["after"]
        if self.broker.queues.info(a["queue"]) is None:
            return {"messages": rows, "next": before}
        while len(rows) < limit:
            want = min(100, limit - len(rows))
            found = self.broker.queues.peek(a["queue"], after, want)
            for message in found:
                if message.seq >= before:
                    return {"messages": rows, "next": before}
                rows.append(_row(message.seq, message))
                size += sum(map(len, message.frames))
                after = message.seq + 1
                if size >= self.limits.api_reply_bytes:
                    return {"messages": rows, "next": after}
            if len(found) < want:
                return {"messages": rows, "next": before}  # the end of the queue
        return {"messages": rows, "next": after}

    def _checked(self, a: dict, messages: Sequence[tuple[str, bytes | memoryview]], owner: tuple) -> str | None:
        """A PRODUCE's messages and key checked (its queues made on ``owner``'s share of --max-queues: its
        CURVE key, or its connection); its key (None: none, or nothing to remember)."""
        for queue, body in messages:
            if not body:
                raise ProtocolError("empty-message", f"a message for {queue!r} has an empty body")
            if len(body) > self.max_message_size:
                raise ProtocolError(
                    "too-large", f"a message of {len(body)} bytes is over the limit of {self.max_message_size}"
                )
        key = a.get("key") if messages else None  # nothing to store: nothing to remember either
        if key is not None and key.startswith(NATIVE_PREFIX):
            raise ProtocolError("bad-arguments", f"PRODUCE: keys starting {NATIVE_PREFIX!r} are native batch ids")
        most = self.limits.max_dedup_keys
        if key is not None and len(self._keys_by_age) >= most and key not in self._keys_by_age:
            raise ProtocolError(
                "too-many-keys",
                f"{most} dedup keys are remembered (--api-dedup-window): no new one until the oldest expire",
            )
        for queue in dict.fromkeys(queue for queue, _ in messages):
            if self.broker.queues.info(queue) is None:
                self.broker.queues.create(queue, owner=owner)
        return key

    def _produce(self, a: dict, messages: list[tuple[str, bytes]], now_us: int, owner: tuple) -> dict:
        """Store a PRODUCE's ``messages``, all or none; the queues it names that do not exist are made on
        ``owner``'s share of --max-queues (its CURVE key, or its connection)."""
        key = self._checked(a, messages, owner)
        digest = hashlib.blake2b(msgpack.packb(messages), digest_size=16).digest()
        return self._store(key, digest, len(messages), now_us, lambda: self._put(messages, now_us))[0]

    def _put(self, messages: list[tuple[str, bytes]], now_us: int) -> None:
        self.broker.produce_all([(queue, [body]) for queue, body in messages], now_us=now_us)

    def _store(
        self, key: str | None, digest: bytes, count: int, now_us: int, put: Callable[[], None]
    ) -> tuple[dict, bool]:
        """Remember ``key`` with ``digest`` and ``put`` the messages, or answer a duplicate from the key
        without storing anything (see the module); the results, and whether ``put`` was called."""
        digests: list[bytes] = []
        seen = None
        if key is not None:
            seen = self.keys.get(key)  # (a damaged record reads as None: as if the key were new)
            if seen is not None:
                if seen.stored_us + self.dedup_window_us <= now_us:
                    digests = []
                elif digest in seen.digests:
                    self.duplicates_total += 1
                    return {"count": seen.messages, "duplicate": True}, False
                else:
                    digests = seen.digests
                    log.warning("PRODUCE key %r came again with other messages: stored as well", key)
            # first: a key refused for room (StoreFull) leaves nothing stored
            self.keys.put(key, Produced(now_us, count, [*digests[-15:], digest]))
        try:
            put()
        except StoreFull:
            if key is not None:  # as before the call, so that the client's retry is not a "duplicate"
                if seen is None:
                    self.keys.delete(key)
                else:
                    self.keys.put(key, seen)
            raise
        if key is not None:
            self._keys_by_age[key] = now_us
            self._keys_by_age.move_to_end(key)
            self._prune(now_us)
        return {"count": count, "duplicate": False}, True

    def _produce_big(
        self, request: api.Request, message: tuple[str, bytes | memoryview], peer: bytes, owner: tuple
    ) -> dict:
        """A PRODUCE of one big message: checked now, written a part per turn (its digest a part at a time,
        as ``_produce`` computes it whole), its key, record and answer in the turn of its last part."""
        if not self.parts.room(peer, len(message[1])):
            raise ProtocolError(
                "busy", "not now: big messages of other clients are being stored; try again later (nothing was done)"
            )
        key = self._checked(request.args, [message], owner)
        queue, body = message
        hasher = hashlib.blake2b(_packed_head(queue, len(body)), digest_size=16)

        def finish(upload: Upload, now_us: int) -> list[Send]:
            def put() -> None:
                self.broker.produce(queue, upload, now_us=now_us)

            results, stored = self._store(key, hasher.digest(), 1, now_us, put)
            if not stored:  # (a duplicate: its parts are not kept)
                self.broker.drop_big(upload)
            return [Send(ONLY, api.ok(request, results))]

        def refused(reason: str) -> list[Send]:
            return [Send(ONLY, self._error(request, ProtocolError("queue-full", reason)))]

        def failed() -> list[Send]:
            return [Send(ONLY, api.error(request, "store-failed", "store failure: nothing was done, try again"))]

        self.parts.write(peer, [body], Big(finish, refused, failed, hasher.update))
        return LATER

    def _prune(self, now_us: int) -> None:
        keys = self._keys_by_age
        while keys and next(iter(keys.values())) + self.dedup_window_us <= now_us:
            key, _ = keys.popitem(last=False)
            self.keys.delete(key)

    def narrow(self) -> int:
        """The permissions were reloaded: the leases of every group whose key may no longer consume its
        queue go back to the queue (see Leases.give_back); returns how many groups."""
        permissions = self.permissions
        if permissions is None or not permissions.enabled:
            return 0
        return self.leases.give_back(lambda group: not permissions.allows_key(group.owner, CONSUME, group.queue))

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        return []  # (its consumer groups are in its figures: the console shows them from there)

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """The consumer groups of ``queue`` (a group is no connection: no address), each holding its lease."""
        mine = [group for (name, _), group in self.leases.groups.items() if name == queue]
        rows = [{"protocol": "api", "client": f"group {g.name[:60]}", "held": g.end - g.base} for g in mine[:limit]]
        return rows, len(mine)

    def stats(self) -> dict:
        return {
            "requests": self.requests_total,
            "errors": self.errors_total,
            "duplicates_dropped": self.duplicates_total,
            "groups": self.leases.stats(),
            "groups_refused_total": self.leases.group_shares.refused_total,  # (past a client's share)
        }
