"""Batched native consumers (PZQ-BATCH/1, docs/native-batch.md "Batched consumers"): pure functions
over frame lists, both sides.

The server binds a ROUTER (``--consume-dsn``); each consumer connects a DEALER, so the server's frames
start with the consumer's routing id and the consumer's have none.

consumer -> server  ["HELLO"]                       answered ["HELLO", "PZQ-BATCH/1", msgpack map of limits]
                    ["CREDIT", n]                   n more deliveries (ASCII decimal); no answer unless ERR
                    ["ACK", keys] | ["NACK", keys]  keys: msgpack array of message keys; answered
                                                    ["SETTLED", n, msgpack array of the keys refused]
                    ["BYE"]                         everything held goes back; answered ["BYE", n]
server -> consumer  ["DELIVER", ack timeout µs, sent µs, keys, bodies]
                    ["ERR", "<code>: <text>"]       nothing was changed

Decoding is cost-checked (as pzq/protocols/api.py): array headers are read and refused past their
limit before any item is built, and every key's length is bounded, so a hostile frame costs a few
bytes' reading, whatever it announces.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence

import msgpack

from pzq.errors import ProtocolError

VERSION = b"PZQ-BATCH/1"
HELLO, CREDIT, ACK, NACK, BYE = b"HELLO", b"CREDIT", b"ACK", b"NACK", b"BYE"
DELIVER, SETTLED, ERR = b"DELIVER", b"SETTLED", b"ERR"
MAX_KEY = 64  # bytes of one key in an ACK or NACK (pzq's keys are 49)
MAX_DIGITS = 18  # of a CREDIT count (anything longer is past every limit anyway)
# What the server reads in the place of a message past its frame cap, its frames drained unkept (1,024, the
# routing frame included: pzq.zmqio.answer_cut): this one object, told by identity (no peer's frame is it)
CUT = b"(more than 1024 frames)"


@dataclasses.dataclass(frozen=True)
class Command:
    """One consumer command as the server reads it: ``name`` (HELLO, CREDIT, ACK, NACK, BYE), ``count``
    (CREDIT's n) and ``keys`` (ACK's and NACK's, in order)."""

    name: bytes
    count: int = 0
    keys: tuple[bytes, ...] = ()


def parse_command(frames: Sequence[bytes], max_keys: int) -> Command:
    """Read one command (without the routing frame). Raises ProtocolError (code, detail) for anything
    malformed: the server answers ERR and changes nothing."""
    if not frames:
        raise ProtocolError("bad-frames", "an empty message")
    if frames[0] is CUT:
        raise ProtocolError("bad-frames", "more than 1024 frames in one message, the routing frame included")
    name = bytes(frames[0])
    if name in (HELLO, BYE):
        if len(frames) != 1:
            raise ProtocolError("bad-frames", f"{name.decode()} takes no other frame, got {len(frames) - 1}")
        return Command(name)
    if name == CREDIT:
        if len(frames) != 2:
            raise ProtocolError("bad-frames", f"CREDIT takes one frame (a count), got {len(frames) - 1}")
        text = bytes(frames[1])
        if not (text.isdigit() and text.isascii()) or len(text) > MAX_DIGITS:
            raise ProtocolError("bad-credit", f"CREDIT count must be ASCII digits, not {text[:20]!r}")
        return Command(name, count=int(text))
    if name in (ACK, NACK):
        if len(frames) != 2:
            raise ProtocolError("bad-frames", f"{name.decode()} takes one frame (the keys), got {len(frames) - 1}")
        return Command(name, keys=tuple(decode_keys(bytes(frames[1]), max_keys)))
    raise ProtocolError("unknown-command", f"unknown command {name[:20]!r}; known: HELLO, CREDIT, ACK, NACK, BYE")


def records_of(frames: Sequence[bytes]) -> int:
    """What a command as the server's ROUTER reads it (routing frame first) costs a turn, in records
    before it is parsed: an ACK or NACK touches a record per key (about one per 50 bytes of its keys
    frame: a key and its header), anything else one."""
    if len(frames) == 3 and frames[1] in (ACK, NACK):
        return max(1, len(frames[2]) // 50)
    return 1


def decode_keys(data: bytes, max_keys: int) -> list[bytes]:
    """A msgpack array of at most ``max_keys`` keys (bin or str, each 1 to MAX_KEY bytes), nothing after
    it; its header is checked before any item is read."""
    count = _array_header(data)
    if count is None:  # (not a plain array header: the Unpacker says what it is)
        count = _unpacker_array_header(data)
    if count > max_keys:
        raise ProtocolError("too-many-keys", f"at most {max_keys} keys at once, not {count}")
    try:  # (the header is within limits: the whole array in one call, its items checked after)
        keys = msgpack.unpackb(
            data,
            raw=True,
            max_str_len=MAX_KEY,
            max_bin_len=MAX_KEY,
            max_ext_len=0,
            max_array_len=count,
            max_map_len=0,
        )
    except msgpack.ExtraData as exc:
        raise ProtocolError("bad-keys", f"{len(exc.extra)} byte(s) after the keys") from None
    except Exception as exc:  # noqa: BLE001 - as above
        raise ProtocolError("bad-keys", f"keys are not msgpack within limits: {exc}"[:200]) from None
    if type(keys) is not list or keys and (set(map(type, keys)) != {bytes} or not all(keys)):  # (in C: a run)
        raise ProtocolError("bad-keys", f"each key must be a str or bin of 1 to {MAX_KEY} bytes")
    return keys


def cut(frames: Sequence[bytes]) -> list[bytes]:
    """What the server reads in the place of a message cut past its frame cap: its routing frame and CUT."""
    return [bytes(frames[0]), CUT]


def _array_header(data: bytes) -> int | None:
    """The count of a msgpack array header at the start of ``data`` (fixarray, array 16 or array 32), read
    from its first bytes; None for anything else."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big")
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big")
    return None


def _unpacker_array_header(data: bytes) -> int:
    """``_array_header`` by msgpack's Unpacker (ProtocolError when ``data`` does not begin with an array)."""
    unpacker = msgpack.Unpacker(
        io.BytesIO(data),
        read_size=max(1, min(len(data), 64 << 10)),
        raw=True,
        max_buffer_size=max(1, len(data)),
        max_str_len=MAX_KEY,
        max_bin_len=MAX_KEY,
        max_ext_len=0,
        max_array_len=0,  # (keys are scalars: the one array is read by its header)
        max_map_len=0,
    )
    try:
        count: int = unpacker.read_array_header()
    except Exception:  # noqa: BLE001 - msgpack raises several unrelated types on garbage
        raise ProtocolError("bad-keys", "the keys frame must be a msgpack array") from None
    return count


# -- what the server sends (its ROUTER puts the routing frame first) ------------------------------------


def hello_reply(max_credit: int, max_batch: int, max_keys: int, ack_timeout_us: int, idle_us: int) -> list[bytes]:
    """The answer to HELLO: the version and the limits this server applies to each consumer."""
    limits = {
        "max_credit": max_credit,
        "max_batch": max_batch,
        "max_keys": max_keys,
        "ack_timeout_us": ack_timeout_us,
        "idle_us": idle_us,
    }
    return [HELLO, VERSION, msgpack.packb(limits)]


def deliver(ack_timeout_us: int, sent_us: int, keys: Sequence[bytes], bodies: Sequence[Sequence[bytes]]) -> list[bytes]:
    """A batch of deliveries: keys and bodies (each a list of frames) in the same order."""
    return [
        DELIVER,
        b"%d" % ack_timeout_us,
        b"%d" % sent_us,
        msgpack.packb(keys if type(keys) is list else list(keys)),
        msgpack.packb(bodies if type(bodies) is list else list(bodies)),  # (each body a list or tuple of frames)
    ]


def deliver_packed(ack_timeout_us: int, sent_us: int, keys: bytes, bodies: Sequence[Sequence[bytes]]) -> list[bytes]:
    """``deliver`` with its keys frame packed already (``pack_keys``)."""
    return [
        DELIVER,
        b"%d" % ack_timeout_us,
        b"%d" % sent_us,
        keys,
        msgpack.packb(bodies if type(bodies) is list else list(bodies)),
    ]


def pack_keys(groups: Sequence[tuple[bytes, bytes, int]]) -> bytes:
    """A keys frame (a msgpack array of bin) of keys that share a prefix group by group: each group is
    (prefix, ids, n), its keys ``prefix + id`` for each of its ``n`` ids, which ``ids`` holds with one
    ``|`` between two (``binascii.hexlify(raw, b"|", size)``: ids of hex digits hold no ``|``). Built by a
    replace per group, with no object per key; every key is of one length, below 256 bytes."""
    total = sum(n for _, _, n in groups)
    out = [array_header(total)]
    for prefix, ids, n in groups:
        size = len(prefix) + (len(ids) - (n - 1)) // n  # (each key's length)
        head = b"\xc4" + bytes([size]) + prefix  # (bin 8, then the key's shared prefix)
        out += (head, ids.replace(b"|", head))
    return b"".join(out)


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


def settled(count: int, refused: Sequence[bytes]) -> list[bytes]:
    """The answer to ACK or NACK, after the commit: how many were settled, and the keys refused."""
    return [SETTLED, b"%d" % count, msgpack.packb(list(refused))]


def bye_reply(returned: int) -> list[bytes]:
    """The answer to BYE: how many held deliveries went back to the queue."""
    return [BYE, b"%d" % returned]


def error(code: str, detail: str) -> list[bytes]:
    """An ERR: the command changed nothing."""
    return [ERR, f"{code}: {detail}".encode("utf-8", "replace")]


# -- the consumer's side ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a server's HELLO says it applies to each consumer."""

    max_credit: int
    max_batch: int
    max_keys: int
    ack_timeout_us: int
    idle_us: int


@dataclasses.dataclass(frozen=True)
class Delivered:
    """A DELIVER as the consumer reads it."""

    ack_timeout_us: int
    sent_us: int
    keys: list[bytes]
    bodies: list[list[bytes]]


@dataclasses.dataclass(frozen=True)
class Settled:
    """A SETTLED as the consumer reads it."""

    count: int
    refused: list[bytes]


def hello() -> list[bytes]:
    return [HELLO]


def credit(n: int) -> list[bytes]:
    """Grant ``n`` more deliveries (0: only say "still here")."""
    return [CREDIT, b"%d" % n]


def ack(keys: Sequence[bytes]) -> list[bytes]:
    return [ACK, msgpack.packb([bytes(k) for k in keys])]


def nack(keys: Sequence[bytes]) -> list[bytes]:
    return [NACK, msgpack.packb([bytes(k) for k in keys])]


def bye() -> list[bytes]:
    return [BYE]


def parse_reply(frames: Sequence[bytes]) -> Limits | Delivered | Settled | ProtocolError | int | None:
    """Read what the server sent: Limits (HELLO), Delivered, Settled, ProtocolError (ERR), int (BYE's
    count); None if it is none of these (not a PZQ-BATCH server)."""
    try:
        kind = frames[0]
        if kind == HELLO and len(frames) == 3 and frames[1] == VERSION:
            m = msgpack.unpackb(frames[2], raw=False)
            fields = (m["max_credit"], m["max_batch"], m["max_keys"], m["ack_timeout_us"], m["idle_us"])
            return Limits(*(int(f) for f in fields))
        if kind == DELIVER and len(frames) == 5:
            keys = msgpack.unpackb(frames[3], raw=True)
            bodies = msgpack.unpackb(frames[4], raw=True)
            if len(keys) != len(bodies):
                return None
            return Delivered(int(frames[1]), int(frames[2]), list(keys), [list(b) for b in bodies])
        if kind == SETTLED and len(frames) == 3:
            return Settled(int(frames[1]), list(msgpack.unpackb(frames[2], raw=True)))
        if kind == ERR and len(frames) == 2:
            code, _, detail = frames[1].decode("utf-8", "replace").partition(": ")
            return ProtocolError(code, detail)
        if kind == BYE and len(frames) == 2:
            return int(frames[1])
    except (IndexError, ValueError, KeyError, TypeError, msgpack.UnpackException):
        return None
    return None
