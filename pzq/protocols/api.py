"""The pzq API protocol: request/reply over ZeroMQ for clients that need more than a stream of
deliveries (the Spark connector). Pure functions over frame lists; no socket here.

client -> server  "", request id, command, msgpack map of arguments     (client DEALER or REQ)
server -> client  "", request id, "OK", msgpack map of results
                  "", request id, "ERR", msgpack {"code": str, "detail": str}

The server binds a ROUTER, so its frames start with the routing frame(s). Every command is idempotent
(PRODUCE through its dedup ``key``), so a client may resend a request that timed out.

=========  =====================================================  ==================================
command    arguments                                              results
=========  =====================================================  ==================================
OFFSETS    queue, group                                           base, end
LEASE      queue, group, after, max, durable (optional, 1)          base, end
FETCH      queue, group, lo, hi                                   messages, gone
ACK_UPTO   queue, group, upto                                     base
INFO       queue                                                  first, next, depth
SNAPSHOT   queue, after, before, limit                            messages, next
PRODUCE    messages: [[queue, body], ...], key (optional)         count, duplicate
WHERE      queue, brief (optional, 0), place (optional, 0)        shard, shards, partitions, places,
                                                                  held (brief 1: shard, partitions, held);
                                                                  with etcd also placed, alive, reachable
=========  =====================================================  ==================================

WHERE says where a queue lives (pzq/shards.py ``where_answer``): this server's shard name, the shard
list it reads, the partitions it keeps for the queue, their places on the list and the queues of it
(the queue and its partitions ``Q#i``) this server holds with their depths. It needs no right on the
queue (names and counts, as the monitor's figures): any client let onto the socket may ask. With
``brief`` 1 the list and the places are left out: a client that reads the list itself (pzq's
``Cluster.locate``) needs neither, and with a list of 1,024 shards they are ~113 KB of every answer.
A shard of a cluster kept in etcd answers ``placed`` too, the queue's places as etcd records them (None:
not placed yet; ``place`` 1, a producer's, has it placed if etcd is reachable: ask again), with
``alive``, the shards whose lease holds, and ``reachable``, whether etcd answered this shard's last call.
PRODUCE on such a shard is refused ``wrong-shard`` for a queue placed elsewhere, ``placing`` while a new
queue is placed (ask again: ``ApiClient`` does) and ``unplaced`` for a new queue while etcd is away.

LEASE with ``durable`` 0 answers without waiting for the commit of the leases it made: they become
durable with a later commit (within --commit-interval), and a failed commit or a crash before it loses
them (the range is leased again by the next call from the same offset). A client hands such an end on
only after a LEASE with ``durable`` 1 (the default) from the same offset has answered it.

A message in results is ``[seq, key, enqueued_us, deliveries, body]``: ``seq`` is the lease seq (FETCH)
or the queue seq (SNAPSHOT), ``key`` the 32-hex message id, ``body`` its frames joined.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgpack

from pzq.errors import ProtocolError

OK = b"OK"
ERR = b"ERR"

_STR, _INT, _LIST = str, int, list
SCHEMAS: dict[str, dict[str, tuple[type, bool]]] = {  # name -> {field: (type, required)}
    "OFFSETS": {"queue": (_STR, True), "group": (_STR, True)},
    "LEASE": {
        "queue": (_STR, True),
        "group": (_STR, True),
        "after": (_INT, True),
        "max": (_INT, True),
        "durable": (_INT, False),
    },
    "FETCH": {"queue": (_STR, True), "group": (_STR, True), "lo": (_INT, True), "hi": (_INT, True)},
    "ACK_UPTO": {"queue": (_STR, True), "group": (_STR, True), "upto": (_INT, True)},
    "INFO": {"queue": (_STR, True)},
    "SNAPSHOT": {"queue": (_STR, True), "after": (_INT, True), "before": (_INT, True), "limit": (_INT, True)},
    "PRODUCE": {"messages": (_LIST, True), "key": (_STR, False)},
    "WHERE": {"queue": (_STR, True), "brief": (_INT, False), "place": (_INT, False)},
}


@dataclasses.dataclass(frozen=True)
class Request:
    """One request: answer it to ``routing`` with ``request_id``."""

    routing: tuple[bytes, ...]
    request_id: bytes
    command: str
    args: dict


def parse_request(
    frames: Sequence[bytes],
    max_size: int = 64 << 20,
    max_produce: int | None = None,
    max_produce_bytes: int | None = None,
) -> Request | Rejected | None:
    """Read one request from the server's ROUTER. A request that cannot be answered (no delimiter or
    no id) is None; one that can but is wrong comes back Rejected, to answer with ERR. A PRODUCE of more
    than ``max_produce`` messages (default MAX_PRODUCE), or of more than one message in an arguments
    frame past ``max_produce_bytes`` (default MAX_PRODUCE_BYTES), is refused from its list's header."""
    try:
        split = list(frames).index(b"")
    except ValueError:
        return None
    routing, rest = tuple(frames[:split]), frames[split + 1 :]
    if not routing or not rest:
        return None
    request_id = rest[0]
    if len(rest) != 3:
        return _bad(routing, request_id, "bad-frames", f"expected [id, command, arguments], got {len(rest)} frame(s)")
    name = bytes(rest[1]).decode("ascii", "replace")
    schema = SCHEMAS.get(name)
    if schema is None:
        return _bad(
            routing,
            request_id,
            "unknown-command",
            f"unknown command {name[:40]!r}; known: {', '.join(sorted(SCHEMAS))}",
        )
    most = (MAX_PRODUCE if max_produce is None else max_produce, max_produce_bytes or MAX_PRODUCE_BYTES)
    try:
        args = _arguments(rest[2], name, max_size, *most)
    except ProtocolError as exc:
        return _bad(routing, request_id, exc.code, exc.detail)
    for field, (kind, required) in schema.items():
        value = args.get(field)
        if value is None:
            if required:
                return _bad(routing, request_id, "bad-arguments", f"{name} needs {field!r}")
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            return _bad(routing, request_id, "bad-arguments", f"{name}: {field!r} must be {kind.__name__}")
        problem = _out_of_range(field, value)
        if problem:
            return _bad(routing, request_id, "bad-arguments", f"{name}: {problem}")
    return Request(routing, request_id, name, {k: v for k, v in args.items() if k in schema})


MAX_ARGUMENTS = 16  # entries of a request's map (its schema names at most four; unknown ones are dropped)


def _arguments(data: bytes | memoryview, command: str, max_size: int, max_produce: int, max_produce_bytes: int) -> dict:
    """A request's msgpack map, decoded with its sizes checked before anything is built: the map's and
    PRODUCE's message list's headers are read first and refused past MAX_ARGUMENTS and ``max_produce``
    (and a list of more than one message in a frame past ``max_produce_bytes``),
    every other value must be a scalar (a list or map header there is refused as it is read), and no
    string, bin or ext is longer than ``max_size``. So a refusal costs a few bytes' reading, however
    many items the frame announces (a 16 MiB frame of nils would decode into 16 million objects)."""
    if not data or not (0x80 <= data[0] <= 0x8F or data[0] in (0xDE, 0xDF)):
        raise ProtocolError("bad-arguments", "arguments must be a msgpack map")
    reader = _Reader(data, max_size)
    args: dict = {}
    try:
        entries = reader.unpacker.read_map_header()
        if entries > MAX_ARGUMENTS:
            raise ProtocolError("bad-arguments", f"a map of {entries} arguments; at most {MAX_ARGUMENTS}")
        for _ in range(entries):
            key = reader.unpack()
            if not isinstance(key, str) or key in args:
                raise ProtocolError("bad-arguments", "argument names must be distinct strings")
            if command == "PRODUCE" and key == "messages":
                args[key] = _messages(reader, max_produce, max_produce_bytes, len(data))
            else:
                args[key] = reader.unpack()
        if reader.tell() != len(data):
            raise ProtocolError("bad-arguments", f"{len(data) - reader.tell()} byte(s) after the arguments' map")
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types on garbage
        raise ProtocolError("bad-arguments", f"arguments are not msgpack within limits: {exc}"[:200]) from None
    return args


class _Window:
    """The file the Unpacker reads a frame from, from ``at`` on: bytes copied only as they are read."""

    def __init__(self, data: bytes | memoryview, at: int):
        self.data, self.at = data, at

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else min(self.at + n, len(self.data))
        chunk, self.at = bytes(self.data[self.at : end]), end
        return chunk


class _Reader:
    """A request's msgpack, read as needed (64 KiB at a time, not copied whole before the first check),
    every string, bin or ext at most ``max_size`` bytes, and no list or map but through its header. A
    bin 32 (64 KiB and more: a big PRODUCE body) is a memoryview of the frame (libzmq's buffer, kept by
    the endpoint: no copy at all), the Unpacker started again past it: read through the Unpacker, a
    15 MiB body grew its buffer 64 KiB at a time (10-57 ms on a loaded machine, for one request)."""

    def __init__(self, data: bytes | memoryview, max_size: int):
        self.data, self.max_size = data, max_size
        self._from(0)

    def _from(self, offset: int) -> None:
        self.base = offset
        self.unpacker = msgpack.Unpacker(
            _Window(self.data, offset),
            read_size=min(len(self.data), 64 << 10),
            raw=False,
            strict_map_key=True,
            max_buffer_size=len(self.data),
            max_str_len=self.max_size,
            max_bin_len=self.max_size,
            max_ext_len=0,
            max_array_len=0,  # (scalars only: the one list, PRODUCE's messages, is read by its headers)
            max_map_len=0,
        )

    def tell(self) -> int:
        return self.base + self.unpacker.tell()

    def unpack(self):
        at = self.tell()
        if self.data[at : at + 1] != b"\xc6":
            return self.unpacker.unpack()
        size = int.from_bytes(self.data[at + 1 : at + 5], "big")
        end = at + 5 + size
        if size > self.max_size or end > len(self.data):
            raise ValueError(f"a bin of {size} bytes: past the limit of {self.max_size} or the frame's end")
        value = memoryview(self.data)[at + 5 : end]
        self._from(end)
        return value


def _messages(reader: _Reader, max_produce: int, max_bytes: int, size: int) -> list:
    """PRODUCE's ``[[queue, body], ...]``, its length checked from its header before any item is read,
    and against ``max_bytes`` when there are several (``size``: the arguments frame's bytes)."""
    try:
        count = reader.unpacker.read_array_header()
    except ValueError:
        raise ProtocolError("bad-arguments", "PRODUCE: 'messages' must be list") from None
    if count > max_produce:  # one request must fit a turn's budget
        raise ProtocolError("too-many", f"PRODUCE: at most {max_produce} messages per request, not {count}")
    if size > max_bytes and count > 1:  # (its bytes must fit a turn's commit; one big message goes in parts)
        raise ProtocolError(
            "too-large",
            f"PRODUCE: {count} messages in {size} bytes of arguments; several messages must fit in {max_bytes}: "
            "split them by bytes (pzq's clients do), or send a big message alone",
        )
    out = []
    for _ in range(count):
        try:
            pair = reader.unpacker.read_array_header()
        except ValueError:
            pair = 0
        if pair != 2:
            raise ProtocolError(
                "bad-arguments", f"PRODUCE: each message must be [queue (str of 1 to {MAX_NAME} bytes), body (bin)]"
            )
        out.append([reader.unpack(), reader.unpack()])
    return out


MAX_INT = 1 << 62  # seqs and counts; anything larger is a mistake (and would not fit a u64 key)
MAX_NAME = 255  # bytes of a queue or group name (as everywhere in pzq)
MAX_KEY = 256  # bytes of a PRODUCE dedup key (LMDB keys stop at 511)


def _out_of_range(field: str, value) -> str | None:
    if isinstance(value, int) and not 0 <= value < MAX_INT:
        return f"{field!r} must be 0 to {MAX_INT - 1}, not {value}"
    if field in ("queue", "group") and not 1 <= len(value.encode()) <= MAX_NAME:
        return f"{field!r} must be 1 to {MAX_NAME} bytes"
    if field == "key" and not 1 <= len(value.encode()) <= MAX_KEY:
        return f"'key' must be 1 to {MAX_KEY} bytes"
    return None


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A request that can be answered but not carried out: answer ``request`` with ERR ``error``."""

    request: Request
    error: ProtocolError


def _bad(routing, request_id, code: str, detail: str) -> Rejected:
    return Rejected(Request(routing, request_id, "", {}), ProtocolError(code, detail))


# Messages in one PRODUCE (the server reads Limits.api_max_produce, the same by default): ~4 us each on the
# loop, so 2,000 fit a turn's ~10 ms budget (5,000 took ~21 ms). The Spark sink sends chunks of 1,000.
MAX_PRODUCE = 2_000
# Bytes of a PRODUCE's arguments frame that holds more than one message (Limits.api_produce_bytes, the same
# by default: a turn's bytes, turn_write_bytes, whose commit holds them all). One message may be bigger (up
# to --max-message-size): it is written a part per turn. 2,000 messages of 11 KiB in one PRODUCE held a
# turn's commit for 22 MiB (its answer 445 ms, every client's longest wait 280 ms)
MAX_PRODUCE_BYTES = 2 << 20


def produce_bytes(queue: str, body: bytes) -> int:
    """At least what one ``[queue, body]`` adds to a PRODUCE's arguments frame (its msgpack: two headers of
    at most 5 bytes, the array's 1), for a client cutting its messages into PRODUCEs by bytes."""
    return len(queue.encode()) + len(body) + 11


PRODUCE_FRAME = 300  # the rest of the frame, at most: the map, its keys, a key of MAX_KEY bytes and headers


def produce_messages(args: dict, max_produce: int = MAX_PRODUCE) -> list[tuple[str, bytes | memoryview]]:
    """PRODUCE's ``messages`` checked: each a [queue, body] with a str queue and a bytes body (a body of
    64 KiB or more is a memoryview of the request's frame)."""
    if len(args["messages"]) > max_produce:  # one request must fit a turn's budget
        raise ProtocolError(
            "too-many", f"PRODUCE: at most {max_produce} messages per request, not {len(args['messages'])}"
        )
    out = []
    for item in args["messages"]:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], bytes | memoryview)
            or _out_of_range("queue", item[0])
        ):
            raise ProtocolError(
                "bad-arguments", f"PRODUCE: each message must be [queue (str of 1 to {MAX_NAME} bytes), body (bin)]"
            )
        out.append((item[0], item[1]))
    return out


def ok(request: Request, results: dict) -> list[bytes]:
    return [*request.routing, b"", request.request_id, OK, msgpack.packb(results, use_bin_type=True)]


def error(request: Request, code: str, detail: str) -> list[bytes]:
    return [
        *request.routing,
        b"",
        request.request_id,
        ERR,
        msgpack.packb({"code": code, "detail": detail}, use_bin_type=True),
    ]


def as_error(reply: list[bytes], code: str, detail: str) -> list[bytes]:
    """The same reply turned into an ERR (the turn that made it was rolled back)."""
    return [*reply[:-2], ERR, msgpack.packb({"code": code, "detail": detail}, use_bin_type=True)]


# -- the client's side ------------------------------------------------------------------------------


def request(request_id: bytes, command: str, args: dict) -> list[bytes]:
    """The frames a DEALER client sends."""
    return [b"", request_id, command.encode(), msgpack.packb(args, use_bin_type=True)]


def parse_reply(frames: Sequence[bytes]) -> tuple[bytes, bool, dict] | None:
    """(request id, ok, results) of a reply a DEALER client received; None if it is not one."""
    if len(frames) != 4 or frames[0] != b"" or frames[2] not in (OK, ERR):
        return None
    try:
        body = msgpack.unpackb(frames[3], raw=False)
    except Exception:  # noqa: BLE001 - a garbled reply is ignored like a missing one
        return None
    return (bytes(frames[1]), frames[2] == OK, body) if isinstance(body, dict) else None
