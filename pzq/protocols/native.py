"""The native PZQ wire protocol (docs/protocols.md, "The native protocol"), as pure functions over frame lists.

Producer  -> server   [routing, message id, header*, "", body+]      (server ROUTER, client DEALER)
server    -> producer [routing, message id, "1", ""] | [routing, message id, "0", "", error text]
server    -> consumer [message key, sent µs, ack timeout µs, "", body+]  (server DEALER, client ROUTER)
consumer  -> server   [message key, "1" | anything else]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pzq.errors import ProtocolError
from pzq.protocols.native_batch import MARK, batch_error

NO_DELIMITER = "Malformed message, no delimiter found or missing message parts"
EMPTY_MESSAGE = "Trying to save empty message"
ONLY_ID = "Malformed message, only a message id and no delimiter or body"
TOO_LARGE = "Message too large: {size} bytes, the limit is {limit}"
QUEUE_FULL = "queue full: the store is at its size limit or its disk is nearly full, try again later"
STORE_FAILED = "store failure: the message was not stored, try again"
BUSY = "busy: an earlier big message of yours is still being stored; send this one again once that one is acked"
ID_TOO_LONG = "Message id too long: {size} bytes, the limit is {limit} (this ack carries its first {limit})"
TOO_MANY_FRAMES = (
    "Too many frames: at most {limit} in one message, the server's routing frame included ({sent} as the "
    "producer sends them); nothing was stored"
)
MAX_ID = 1024  # bytes of a producer's message id
MAX_FRAMES = 1024  # frames of one message, the routing frame included (pzq.zmqio.MAX_FRAMES: the same)


@dataclasses.dataclass(frozen=True)
class Produce:
    """A producer's message: store ``body`` and answer ``routing`` with ``message_id``."""

    routing: bytes
    message_id: bytes
    body: list[bytes]


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A producer's message that cannot be stored; answer it with "0" and ``error``."""

    routing: bytes
    message_id: bytes
    error: ProtocolError
    batch: bool = False  # a batch's (PZQ-BATCH/1) id: answered in a batch's frames


class Cut(list[bytes]):
    """The routing and id frames of a message the server read past MAX_FRAMES frames (the rest drained
    unkept, pzq.zmqio.answer_cut): refused "too many frames" in its place among its producer's."""

    __slots__ = ("batch",)

    def __init__(self, frames: Sequence[bytes]):
        super().__init__([bytes(frames[0]), bytes(frames[1][:MAX_ID])])
        self.batch = len(frames) > 2 and frames[2] == MARK


@dataclasses.dataclass(frozen=True)
class ConsumerAck:
    """A consumer's answer for the delivery with ``key``: ``ok`` deletes, anything else requeues."""

    key: bytes
    ok: bool


def plain_body(frames: list[bytes], max_size: int) -> list[bytes] | None:
    """The body of a producer's message of the usual shape, ``[routing, id, "", body...]`` with an id of
    at most MAX_ID bytes and a body of at most ``max_size``; None for any other (``parse_produce`` reads
    those). The hot path's reading: no Produce made for the message that needs none."""
    if len(frames) > 3 and frames[2] == b"" and len(frames[1]) <= MAX_ID:
        body = frames[3:]
        if sum(map(len, body)) <= max_size:
            return body
    return None


def parse_produce(frames: Sequence[bytes], max_size: int) -> Produce | Rejected | None:
    """Read one message from the receive socket. None when there is no one to answer (no id frame)."""
    if len(frames) < 2:
        return None
    routing, message_id = frames[0], frames[1]
    if isinstance(frames, Cut):
        detail = TOO_MANY_FRAMES.format(limit=MAX_FRAMES, sent=MAX_FRAMES - 1)
        return Rejected(routing, message_id, ProtocolError("too-many-frames", detail), frames.batch)
    if len(message_id) > MAX_ID:  # it is echoed in the ack: it must not let a producer size our memory
        return Rejected(
            routing,
            message_id[:MAX_ID],
            ProtocolError("id-too-long", ID_TOO_LONG.format(size=len(message_id), limit=MAX_ID)),
        )
    if len(frames) == 2:
        return Rejected(routing, message_id, ProtocolError("only-id", ONLY_ID))
    try:
        delimiter = frames.index(b"", 2)
    except ValueError:
        return Rejected(routing, message_id, ProtocolError("no-delimiter", NO_DELIMITER))
    body = list(frames[delimiter + 1 :])
    if not body:
        return Rejected(routing, message_id, ProtocolError("empty", EMPTY_MESSAGE))
    size = sum(map(len, body))
    if size > max_size:
        return Rejected(routing, message_id, ProtocolError("too-large", TOO_LARGE.format(size=size, limit=max_size)))
    return Produce(routing, message_id, body)


def produce_ack(routing: bytes, message_id: bytes, error: str | None = None) -> list[bytes]:
    """The frames answering a producer: stored ("1") when ``error`` is None, else "0" and the text."""
    if error is None:
        return [routing, message_id, b"1", b""]
    return [routing, message_id, b"0", b"", error.encode("utf-8", "replace")]


def stored_ack(frames: Sequence[bytes]) -> tuple[bytes, bytes] | None:
    """(routing, message id) of a "stored" answer ``produce_ack`` made; None for a refusal (or anything else)."""
    if len(frames) < 3 or frames[2] != b"1":
        return None
    return frames[0], frames[1]


def refusal(event: Rejected) -> list[bytes]:
    """The frames refusing ``event``: a legacy "0" ack, or a batch's (nothing of it stored) for a batch."""
    if event.batch:
        return batch_error(event.routing, event.message_id, event.error.detail)
    return produce_ack(event.routing, event.message_id, event.error.detail)


def message_key(enqueued_us: int, message_id: str) -> bytes:
    """The key consumers see: "<16-digit µs of enqueue>|<32-hex message id>", stable across redeliveries."""
    return b"%016d|%s" % (enqueued_us, message_id.encode("ascii"))


def key_message_id(key: bytes) -> str | None:
    """The message id inside a key made by ``message_key``, or None if the key is not one of ours."""
    _, sep, mid = key.rpartition(b"|")
    if not sep or len(mid) != 32:
        return None
    try:
        return mid.decode("ascii")
    except UnicodeDecodeError:
        return None


def key_ref(key: bytes) -> tuple[int, int] | None:
    """(qid, seq) of the message a key made by ``message_key`` names; None for a key that is not one."""
    # Read without a regex: every consumer's ack comes here (the gateways name it ref_of_key)
    if len(key) == 49 and key[16] == 0x7C and (tail := key[17:]).isalnum() and tail == tail.lower():
        try:  # (32 lowercase letters and digits: only hex digits get past int)
            whole = int(tail, 16)
        except ValueError:
            whole = -1
        if whole >= 0:
            return whole >> 64, whole & 0xFFFFFFFFFFFFFFFF
    mid = key_message_id(key)  # (a key of other digits before its "|": the id is what names the message)
    if mid is None or not all(c in _HEX_DIGITS for c in mid):
        return None
    return int(mid[:16], 16), int(mid[16:], 16)


_HEX_DIGITS = frozenset("0123456789abcdef")


def delivery(key: bytes, sent_us: int, ack_timeout_us: int, body: Sequence[bytes]) -> list[bytes]:
    """The frames sent to a consumer through the send socket (its ROUTER prepends the peer id)."""
    return [key, b"%d" % sent_us, b"%d" % ack_timeout_us, b"", *body]


def parse_consumer_ack(frames: Sequence[bytes]) -> ConsumerAck | None:
    """Read a consumer's answer; None for anything too short to be one (the spec says ignore it)."""
    read = consumer_answer(frames)
    return None if read is None else ConsumerAck(*read)


def consumer_answer(frames: Sequence[bytes]) -> tuple[bytes, bool] | None:
    """``parse_consumer_ack`` as a plain pair (key, ok): what the gateway reads for every answer of a
    run, without a ConsumerAck made for each."""
    if len(frames) < 2:
        return None
    return frames[0], frames[1] == b"1"


# -- the client's side: what a producer's DEALER and a consumer's ROUTER send and read -----------------


@dataclasses.dataclass(frozen=True)
class ProduceAck:
    """The server's answer to one produced message, as the producer reads it."""

    message_id: bytes
    ok: bool
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Delivered:
    """A delivery as the consumer reads it, once its ROUTER's peer frame is taken off."""

    key: bytes
    sent_us: int
    ack_timeout_us: int
    body: list[bytes]


def produce(message_id: bytes, body: Sequence[bytes]) -> list[bytes]:
    """A producer's message without headers; the server's ROUTER puts the routing frame before it."""
    return [message_id, b"", *body]


def answered_id(frames: Sequence[bytes]) -> bytes | None:
    """The id an answer to a producer carries (a message's, a batch's or a probe's: its first frame once
    the DEALER has it), to match it with what was sent; None for an empty message."""
    return frames[0] if frames else None


def parse_produce_ack(frames: Sequence[bytes]) -> ProduceAck | None:
    """Read what ``produce_ack`` sent, without its routing frame; None if it is not a pzq ack."""
    if len(frames) < 3 or frames[1] not in (b"1", b"0") or frames[2] != b"":
        return None
    error = frames[3].decode("utf-8", "replace") if len(frames) > 3 else ""
    return ProduceAck(frames[0], frames[1] == b"1", error)


def parse_delivery(frames: Sequence[bytes]) -> Delivered | None:
    """Read what ``delivery`` sent (the frames after the consumer ROUTER's peer id); None if it is not one."""
    if len(frames) < 4 or frames[3] != b"" or not (frames[1].isdigit() and frames[2].isdigit()):
        return None
    return Delivered(frames[0], int(frames[1]), int(frames[2]), list(frames[4:]))


def parse_routed_delivery(frames: Sequence[bytes]) -> tuple[bytes, Delivered] | None:
    """A delivery as the consumer's ROUTER reads it: the server's peer id (its answers go back to it) and
    what ``delivery`` sent; None if it is not one."""
    delivered = parse_delivery(frames[1:]) if frames else None
    return None if delivered is None else (frames[0], delivered)


def consumer_ack(key: bytes, ok: bool = True) -> list[bytes]:
    """A consumer's answer for the delivery with ``key``: "1" deletes it, "0" puts it back."""
    return [key, b"1" if ok else b"0"]
