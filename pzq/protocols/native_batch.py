"""Batched native frames, PZQ-BATCH/1 (docs/native-batch.md): many producer messages in one ZeroMQ message.

An extension of the native receive socket (shared/specs/pzq-wire.md), as pure functions over frame lists.
The server's ROUTER adds and strips the routing frame as for every native message.

Producer -> server  [batch id, "PZQ-BATCH/1", "", bodies]   bodies: msgpack array of messages, each
                                                              a msgpack array of bin (its frames)
server -> producer  [batch id, "1", "", n]                   all n stored, after the fsync'd commit
                    [batch id, "0", "", error text, n]       the first n stored (a prefix), not the rest
Producer -> server  [probe id, "PZQ-BATCH/1", ""]            the probe: does the server speak batches?
server -> producer  [probe id, "1", "", "PZQ-BATCH/1", caps] caps: msgpack map of max_messages,
                                                              max_bytes, max_message_size, max_frames
An old server reads the marker as a header frame it ignores, so it answers the probe
[probe id, "0", "", "Trying to save empty message"]: a client must probe before its first batch.

Bodies are decoded with every count checked from its msgpack header before anything is built, and no
container inside a message (so a frame of nested arrays, or of a million nils, costs a few bytes' reading).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence

import msgpack

from pzq.errors import ProtocolError

MARK = b"PZQ-BATCH/1"
MAX_BATCH_ID = 200  # bytes of a batch id: printable ASCII, remembered in the store's dedup table
MAX_ECHO = 1024  # bytes of a refused id echoed back (as a legacy message id)
MIN_MESSAGE_BYTES = 3  # a message in a bodies frame: an array header (1 byte) and one bin (2 bytes at least)

# Error texts (the code in brackets is what the server logs)
BAD_ID = "Batch id must be 1 to {limit} bytes of printable ASCII (0x21-0x7e)"
BAD_FRAMES = "Malformed batch: expected [batch id, PZQ-BATCH/1, '', bodies] (or no bodies: a probe)"
MALFORMED = "Malformed batch bodies: {detail}"
EMPTY_BATCH = "Empty batch: it holds no message"
TOO_MANY = "Batch of {count} messages, the limit is {limit}"
TOO_MANY_FRAMES = "Batch of more than {limit} frames in all, the limit is {limit}"
TOO_BIG = "Batch bodies frame of {size} bytes, the limit is {limit}"
EMPTY_MESSAGE = "Trying to save empty message (message {index} of the batch has no frame)"
MESSAGE_TOO_LARGE = "Message too large: message {index} of the batch has {size} bytes, the limit is {limit}"


@dataclasses.dataclass(frozen=True)
class Caps:
    """What the server takes in one batch (its probe answer says so)."""

    max_messages: int
    max_bytes: int  # bytes of the bodies frame
    max_message_size: int  # bytes of one message, summed over its frames (as a legacy message)
    max_frames: int  # frames of all the batch's messages together


@dataclasses.dataclass(frozen=True)
class Batch:
    """A producer's batch: store ``bodies`` in order and answer ``routing`` with ``batch_id``."""

    routing: bytes
    batch_id: bytes
    bodies: list[list[bytes]]
    raw: bytes  # the bodies frame as sent (its digest tells a resend from another batch of the same id)


@dataclasses.dataclass(frozen=True)
class Probe:
    """A producer asking whether batches are spoken here."""

    routing: bytes
    probe_id: bytes


@dataclasses.dataclass(frozen=True)
class BatchRejected:
    """A batch refused whole (nothing stored): answer it "0", ``error`` and 0 stored."""

    routing: bytes
    batch_id: bytes
    error: ProtocolError


def is_batch(frames: Sequence[bytes]) -> bool:
    """True for a batch or a probe as the server's ROUTER reads it (routing frame first)."""
    return len(frames) > 2 and frames[2] == MARK


def announced(frames: Sequence[bytes], most: int) -> int:
    """How many messages a batch says it holds (at most ``most``; 1 for a probe or an unreadable one):
    what it draws on a turn's record budget, read from its array header alone."""
    if len(frames) != 5:
        return 1
    try:
        count = msgpack.Unpacker(io.BytesIO(frames[4][:5]), max_buffer_size=5).read_array_header()
    except Exception:  # noqa: BLE001 - garbage: the gateway refuses it, costing one record
        return 1
    # (each message takes 3 bytes at least, an array header and an empty bin: a 4-byte frame announcing
    # a thousand would otherwise take a whole turn's records for nothing, again and again)
    return max(1, min(count, most, len(frames[4]) // MIN_MESSAGE_BYTES))


def parse_batch(frames: Sequence[bytes], caps: Caps) -> Batch | Probe | BatchRejected:
    """Read a frame list for which ``is_batch`` holds."""
    routing, batch_id = frames[0], frames[1]
    if not 1 <= len(batch_id) <= MAX_BATCH_ID or not all(0x21 <= c <= 0x7E for c in batch_id):
        return _refused(routing, batch_id[:MAX_ECHO], "batch-bad-id", BAD_ID.format(limit=MAX_BATCH_ID))
    if len(frames) == 4 and frames[3] == b"":
        return Probe(routing, batch_id)
    if len(frames) != 5 or frames[3] != b"":
        return _refused(routing, batch_id, "batch-frames", BAD_FRAMES)
    try:
        bodies = decode_bodies(frames[4], caps)
    except ProtocolError as exc:
        return BatchRejected(routing, batch_id, exc)
    return Batch(routing, batch_id, bodies, frames[4])


def decode_bodies(data: bytes, caps: Caps) -> list[list[bytes]]:
    """The messages of a bodies frame, each a list of frames; ProtocolError when it is not one within
    ``caps``. Counts are read from headers before their items; any item that is not bin is refused."""
    if len(data) > caps.max_bytes:
        raise ProtocolError("batch-too-large", TOO_BIG.format(size=len(data), limit=caps.max_bytes))
    if not data or not (0x90 <= data[0] <= 0x9F or data[0] in (0xDC, 0xDD)):
        raise ProtocolError("batch-malformed", MALFORMED.format(detail="not a msgpack array"))
    unpacker = msgpack.Unpacker(
        io.BytesIO(data),
        read_size=min(len(data), 64 << 10),
        max_buffer_size=len(data),
        max_bin_len=len(data),  # (a frame past max_message_size is refused below, with its own words)
        max_str_len=0,
        max_ext_len=0,
        max_array_len=0,  # (no containers inside a message: headers are read one by one below)
        max_map_len=0,
    )
    limit, frames_left = caps.max_message_size, caps.max_frames
    out: list[list[bytes]] = []
    try:
        count = unpacker.read_array_header()
        if count == 0:
            raise ProtocolError("batch-empty", EMPTY_BATCH)
        if count > caps.max_messages:
            raise ProtocolError("batch-too-many", TOO_MANY.format(count=count, limit=caps.max_messages))
        for index in range(count):
            try:
                parts = unpacker.read_array_header()
            except ValueError:
                raise ProtocolError(
                    "batch-malformed", MALFORMED.format(detail=f"message {index} is not an array of bin")
                ) from None
            if parts == 0:
                raise ProtocolError("batch-message-empty", EMPTY_MESSAGE.format(index=index))
            frames_left -= parts
            if frames_left < 0:
                raise ProtocolError("batch-frames", TOO_MANY_FRAMES.format(limit=caps.max_frames))
            body = [unpacker.unpack() for _ in range(parts)]
            size = 0
            for part in body:
                if type(part) is not bytes:
                    raise ProtocolError(
                        "batch-malformed", MALFORMED.format(detail=f"message {index} has a frame that is not bin")
                    )
                size += len(part)
            if size > limit:
                raise ProtocolError(
                    "batch-message-too-large", MESSAGE_TOO_LARGE.format(index=index, size=size, limit=limit)
                )
            out.append(body)
        if unpacker.tell() != len(data):
            raise ProtocolError(
                "batch-malformed", MALFORMED.format(detail=f"{len(data) - unpacker.tell()} byte(s) after the array")
            )
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types on garbage
        detail = f"not msgpack within the limits ({type(exc).__name__}: {exc})"[:200]
        raise ProtocolError("batch-malformed", MALFORMED.format(detail=detail)) from None
    return out


def _refused(routing: bytes, batch_id: bytes, code: str, detail: str) -> BatchRejected:
    return BatchRejected(routing, batch_id, ProtocolError(code, detail))


def batch_ack(routing: bytes, batch_id: bytes, count: int) -> list[bytes]:
    """All ``count`` messages of the batch were stored."""
    return [routing, batch_id, b"1", b"", b"%d" % count]


def batch_error(routing: bytes, batch_id: bytes, error: str, stored: int = 0) -> list[bytes]:
    """The batch failed after its first ``stored`` messages (0: nothing of it was stored)."""
    return [routing, batch_id, b"0", b"", error.encode("utf-8", "replace"), b"%d" % stored]


def probe_answer(routing: bytes, probe_id: bytes, caps: Caps) -> list[bytes]:
    """The server speaks PZQ-BATCH/1, within ``caps``."""
    return [routing, probe_id, b"1", b"", MARK, msgpack.packb(dataclasses.asdict(caps))]


# -- the client's side: what a producer's DEALER sends and reads ------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchAck:
    """The server's answer to a batch: ``stored`` messages from the first were stored."""

    batch_id: bytes
    ok: bool
    stored: int
    error: str = ""


def encode_bodies(bodies: Sequence[Sequence[bytes]]) -> bytes:
    """The bodies frame of a batch."""
    return msgpack.packb([list(body) for body in bodies], use_bin_type=True)


def batch(batch_id: bytes, bodies: Sequence[Sequence[bytes]]) -> list[bytes]:
    """A producer's batch (the server's ROUTER puts the routing frame before it)."""
    return [batch_id, MARK, b"", encode_bodies(bodies)]


def probe(probe_id: bytes) -> list[bytes]:
    """A producer's probe."""
    return [probe_id, MARK, b""]


def encoded_size(body: Sequence[bytes]) -> int:
    """At most the bytes one message adds to a bodies frame (its frames and msgpack's headers)."""
    return 5 + sum(len(part) + 5 for part in body)


def parse_batch_ack(frames: Sequence[bytes]) -> BatchAck | None:
    """Read what ``batch_ack`` or ``batch_error`` sent (without the routing frame); None otherwise."""
    if len(frames) == 4 and frames[1] == b"1" and frames[2] == b"" and frames[3].isdigit():
        return BatchAck(frames[0], True, int(frames[3]))
    if len(frames) == 5 and frames[1] == b"0" and frames[2] == b"" and frames[4].isdigit():
        return BatchAck(frames[0], False, int(frames[4]), frames[3].decode("utf-8", "replace"))
    return None


def parse_probe_answer(frames: Sequence[bytes]) -> Caps | None:
    """The server's caps from its probe answer (without the routing frame); None when the server does
    not speak PZQ-BATCH/1 (an old server answers "0", as for a message without a body)."""
    if len(frames) != 5 or frames[1] != b"1" or frames[2] != b"" or frames[3] != MARK:
        return None
    try:
        if len(frames[4]) > 4096:  # (four small numbers: anything longer is not our answer)
            return None
        caps = msgpack.unpackb(frames[4], raw=False, max_array_len=0, max_map_len=16)
        return Caps(
            int(caps["max_messages"]), int(caps["max_bytes"]), int(caps["max_message_size"]), int(caps["max_frames"])
        )
    except Exception:  # noqa: BLE001 - an answer we cannot read: speak the legacy way
        return None
