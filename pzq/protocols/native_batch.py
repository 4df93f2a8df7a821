"""Batched native frames, PZQ-BATCH/1 (docs/native-batch.md): many producer messages in one ZeroMQ message.

An extension of the native receive socket (docs/protocols.md), as pure functions over frame lists.
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

Bodies are read with every count checked from its msgpack header before anything is built, and no
container inside a message (so a frame of nested arrays, or of a million nils, costs a few bytes' reading);
the server stores each message's bytes as they came (split_bodies), without decoding its frames.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import msgpack

from pzq.errors import ProtocolError

MARK = b"PZQ-BATCH/1"
MAX_BATCH_ID = 200  # bytes of a batch id: printable ASCII, remembered in the store's dedup table
MAX_ECHO = 1024  # bytes of a refused id echoed back (as a legacy message id)
# msgpack's type bytes of a 16- and 32-bit array header and of an 8-, 16- and 32-bit bin header
_ARRAY16, _ARRAY32, _BIN8, _BIN16, _BIN32 = 0xDC, 0xDD, 0xC4, 0xC5, 0xC6
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
    """A producer's batch: store ``messages`` in order and answer ``routing`` with ``batch_id``."""

    routing: bytes
    batch_id: bytes
    messages: list[bytes]  # each message as the bodies frame encodes it (split_bodies)
    raw: bytes  # the bodies frame as sent (its digest tells a resend from another batch of the same id)

    @property
    def bodies(self) -> list[list[bytes]]:
        """The messages' frames (decoded: the server stores ``messages`` as they are)."""
        return [msgpack.unpackb(message) for message in self.messages]


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


class KeyedFrames(list[bytes]):
    """A batch's frames as the server read them, with the CURVE key (z85) of the connection it came over:
    its id is remembered as that key's (two keys' batches of one id are two batches)."""

    __slots__ = ("key",)

    def __init__(self, frames: Sequence[bytes], key: str):
        super().__init__(frames)
        self.key = key


def is_batch(frames: Sequence[bytes]) -> bool:
    """True for a batch or a probe as the server's ROUTER reads it (routing frame first)."""
    return len(frames) > 2 and frames[2] == MARK


def records_of(frames: Sequence[bytes], most: int) -> int:
    """What a message read by the server's ROUTER draws on a turn's record budget: 1, or what a batch
    says it holds (``announced``)."""
    return announced(frames, most) if is_batch(frames) else 1


def refuse_batch(frames: Sequence[bytes], code: str) -> list[bytes]:
    """The answer refusing the batch or probe ``frames`` with ``code``, its id echoed (cut to MAX_ECHO):
    ``frames`` as the server's ROUTER read them, or an answer to them (routing and id first in both)."""
    return batch_error(frames[0], frames[1][:MAX_ECHO], code)


def announced(frames: Sequence[bytes], most: int) -> int:
    """How many messages a batch says it holds (at most ``most``; 1 for a probe or an unreadable one):
    what it draws on a turn's record budget, read from its array header alone."""
    if len(frames) != 5:
        return 1
    data = frames[4]
    tag = data[0] if len(data) else 0  # (read by hand: an Unpacker per batch cost 3 µs)
    if 0x90 <= tag <= 0x9F:
        count = tag & 0x0F
    elif (tag == _ARRAY16 and len(data) >= 3) or (tag == _ARRAY32 and len(data) >= 5):
        count = int.from_bytes(data[1 : 3 if tag == _ARRAY16 else 5], "big")
    else:  # garbage: the gateway refuses it, costing one record
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
        messages = split_bodies(frames[4], caps)
    except ProtocolError as exc:
        return BatchRejected(routing, batch_id, exc)
    return Batch(routing, batch_id, messages, frames[4])


def decode_bodies(data: bytes, caps: Caps) -> list[list[bytes]]:
    """The messages of a bodies frame, each a list of frames; ProtocolError when it is not one within
    ``caps`` (see ``split_bodies``)."""
    return [msgpack.unpackb(message) for message in split_bodies(data, caps)]


def split_bodies(data: bytes, caps: Caps) -> list[bytes]:
    """The messages of a bodies frame as they are encoded there (each a msgpack array of bin: what a
    stored record holds after its header, so the server stores them without decoding their frames),
    slices of ``data``; ProtocolError when it is not one within ``caps``. Read header by header, each
    count checked before its items (a header announcing a billion costs nothing), and no container
    inside a message: the first byte that is not what a batch holds refuses it."""
    if len(data) > caps.max_bytes:
        raise ProtocolError("batch-too-large", TOO_BIG.format(size=len(data), limit=caps.max_bytes))
    end = len(data)
    count, pos = _messages_announced(data, caps)  # (once a batch: the loop below is per message)
    try:
        limit, frames_left = caps.max_message_size, caps.max_frames
        out: list = [None] * count  # (filled in place: no call per message)
        from_bytes = int.from_bytes
        for index in range(count):
            start = pos
            tag = data[pos]
            if tag == 0x91 and frames_left and data[pos + 1] == _BIN8:  # (most: one frame under 256 bytes)
                size = data[pos + 2]
                pos += 3 + size
                if size > limit or pos > end:
                    pos = start  # (read again below, for the error's words)
                else:
                    frames_left -= 1
                    out[index] = data[start:pos]
                    continue
                tag = data[pos]
            if 0x91 <= tag <= 0x9F:  # (the usual case: a message of 1 to 15 frames)
                parts, pos = tag & 0x0F, pos + 1
            elif tag == _ARRAY16 or tag == _ARRAY32 or tag == 0x90:
                pos += 1 if tag == 0x90 else 3 if tag == _ARRAY16 else 5
                parts = from_bytes(data[start + 1 : pos], "big")
                if pos > end:
                    raise IndexError
            else:
                raise ProtocolError(
                    "batch-malformed", MALFORMED.format(detail=f"message {index} is not an array of bin")
                )
            if parts == 0:
                raise ProtocolError("batch-message-empty", EMPTY_MESSAGE.format(index=index))
            frames_left -= parts
            if frames_left < 0:
                raise ProtocolError("batch-frames", TOO_MANY_FRAMES.format(limit=caps.max_frames))
            size = 0
            for _ in range(parts):
                tag = data[pos]
                if tag == _BIN8:
                    length, pos = data[pos + 1], pos + 2
                elif tag == _BIN16 or tag == _BIN32:
                    at, pos = pos + 1, pos + (3 if tag == _BIN16 else 5)
                    length = from_bytes(data[at:pos], "big")
                else:
                    raise ProtocolError(
                        "batch-malformed", MALFORMED.format(detail=f"message {index} has a frame that is not bin")
                    )
                pos += length
                size += length
            if pos > end:
                raise IndexError
            if size > limit:
                raise ProtocolError(
                    "batch-message-too-large", MESSAGE_TOO_LARGE.format(index=index, size=size, limit=limit)
                )
            out[index] = data[start:pos]
    except IndexError:  # (a header or a frame past the end of the data)
        raise ProtocolError("batch-malformed", MALFORMED.format(detail="cut short")) from None
    if pos != end:
        raise ProtocolError("batch-malformed", MALFORMED.format(detail=f"{end - pos} byte(s) after the array"))
    return out


def _messages_announced(data: bytes, caps: Caps) -> tuple[int, int]:
    """The count in a bodies frame's array header, checked against ``caps``, and where its first message
    begins; ProtocolError for a header that is not an array's, cut short, or announcing none or too many."""
    end = len(data)
    tag = data[0] if end else 0
    if 0x90 <= tag <= 0x9F:
        count, pos = tag & 0x0F, 1
    elif tag == _ARRAY16 or tag == _ARRAY32:
        pos = 3 if tag == _ARRAY16 else 5
        count = int.from_bytes(data[1:pos], "big") if pos <= end else -1
    else:
        raise ProtocolError("batch-malformed", MALFORMED.format(detail="not a msgpack array"))
    if count < 0:
        raise ProtocolError("batch-malformed", MALFORMED.format(detail="cut short in its array header"))
    if count == 0:
        raise ProtocolError("batch-empty", EMPTY_BATCH)
    if count > caps.max_messages:
        raise ProtocolError("batch-too-many", TOO_MANY.format(count=count, limit=caps.max_messages))
    return count, pos


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
