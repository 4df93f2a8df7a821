"""The PHPMQ message protocol (shared/specs/phpmq.md): an incremental decoder, an encoder, and the
per-connection dialect rule. Pure: bytes in, messages out; no socket, no store.

    message  = "H" version(2) type(3) packet-count(2)  packet*
    packet   = "P" packet-type(2) content-length(29, zero-padded)  content

Two dialects share version 01. The legacy one (the php-mq client and server) sends 2-packet 001 and
reads exactly 3 packets of a 003; the current one (the protocol README) adds a TTL packet to 001 and
003 and defines 005 and 006. The packet count is read from each header, so both decode alike.
"""

from __future__ import annotations

import dataclasses
import enum

from pzq.errors import ProtocolError

HEADER_SIZE = 8
PACKET_HEADER_SIZE = 32

SEND, CONSUME, DISPATCH, ACK, REQUEUE, DEAD_LETTER = 1, 2, 3, 4, 5, 6
QUEUE, CONTENT, MESSAGE_ID, COUNT, TTL = 1, 2, 3, 4, 5

# message type -> (required packet types, optional packet types), for what a client may send
_CLIENT_MESSAGES = {
    SEND: ({QUEUE, CONTENT}, {TTL}),
    CONSUME: ({QUEUE, COUNT}, set()),
    ACK: ({QUEUE, MESSAGE_ID}, set()),
    REQUEUE: ({QUEUE, MESSAGE_ID}, {TTL}),
    DEAD_LETTER: ({QUEUE, MESSAGE_ID}, set()),
}
MAX_NUMBER_DIGITS = 18  # counts and TTLs: anything longer is not a number a client means


class Dialect(enum.Enum):
    LEGACY = "legacy"
    CURRENT = "current"


@dataclasses.dataclass(frozen=True)
class Message:
    """One decoded client message: its type and packets by type (the spec keys packets by type)."""

    type: int
    packets: dict[int, bytes | bytearray]  # (a packet of BIG_PACKET bytes or more is a bytearray)
    packet_count: int

    @property
    def queue(self) -> str:
        return self.packets[QUEUE].decode("utf-8", "surrogateescape")

    def number(self, packet_type: int, default: int = 0) -> int:
        raw = self.packets.get(packet_type)
        if raw is None or raw == b"":
            return default
        if not raw.isdigit() or len(raw) > MAX_NUMBER_DIGITS:
            raise ProtocolError("bad-number", f"packet {packet_type:02d} is not a decimal number: {raw[:40]!r}")
        return int(raw)


def encode(msg_type: int, packets: list[tuple[int, bytes]]) -> bytes:
    """One message as bytes: header and every packet, in the order given."""
    parts = [b"H01%03d%02d" % (msg_type, len(packets))]
    for packet_type, content in packets:
        parts.append(b"P%02d%029d" % (packet_type, len(content)))
        parts.append(content)
    return b"".join(parts)


def encode_dispatch(queue: str, content: bytes, message_id: str, ttl_left: int | None, dialect: Dialect) -> bytes:
    """A 003 for ``dialect``: legacy clients read exactly queue, content, id; current ones get the TTL."""
    packets = [
        (QUEUE, queue.encode("utf-8", "surrogateescape")),
        (CONTENT, content),
        (MESSAGE_ID, message_id.encode("ascii")),
    ]
    if dialect is Dialect.CURRENT:
        packets.append((TTL, b"%d" % (ttl_left or 0)))
    return encode(DISPATCH, packets)


def _broken(code: str, detail: str) -> ProtocolError:
    """The stream cannot be framed past this point: PHPMQ has no resynchronisation and no error reply."""
    return ProtocolError(code, detail, fatal=True)


BIG_PACKET = 64 << 10  # a packet this long is gathered in a buffer of its own, handed on as it is


class Decoder:
    """Turns a byte stream, split or joined anyhow, into whole messages.

    ``feed`` raises ProtocolError at the first byte that cannot be PHPMQ; the stream is then lost
    (there is no way to resynchronise), so the caller closes the connection.

    Each byte is copied once: a packet of ``BIG_PACKET`` bytes or more is gathered in a bytearray of its
    own as it arrives (grown by realloc, which moves no bytes for a big buffer on Linux) and handed on
    as that bytearray, so a 15 MiB message read 8 KiB at a time costs one pass over its bytes, not a
    growing buffer's copies and two more for the packet (a big body then goes to the store in parts
    straight from it). Smaller packets are bytes."""

    def __init__(self, max_content: int):
        self.max_content = max_content
        self._buf = bytearray()
        self._type: int | None = None  # the type of the message being read, and its packets left
        self._left = 0
        self._packets: dict[int, bytes | bytearray] = {}
        self._count = 0
        self._held = 0  # bytes of the incomplete message already taken out of the buffer
        self._big: bytearray | None = None  # the big packet being gathered, its type and length
        self._big_type = self._big_length = 0
        self.broken: ProtocolError | None = None  # garbage found after whole messages were returned

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a whole message (bounded by one message)."""
        return len(self._buf) + self._held

    def feed(self, data: bytes) -> list[Message]:
        """Every whole message in what has arrived. Garbage raises ProtocolError (fatal), but only once
        the whole messages before it were returned: whether a message counts must not depend on how
        TCP split the bytes."""
        if self.broken is not None:
            raise self.broken
        if self._big is not None:
            with memoryview(data) as view:
                take = self._gather(self._big, view)
                if self._big is not None:
                    return []
                self._buf += view[take:]
        else:
            self._buf += data
        out: list[Message] = []
        while True:
            try:
                message = self._next()
            except ProtocolError as exc:
                if not out:
                    raise
                self.broken = exc  # raised by the next feed (or ``check``)
                return out
            if message is None:
                return out
            out.append(message)

    def _gather(self, big: bytearray, view: memoryview) -> int:
        """Add what ``view`` holds of the big packet being gathered (``big``); how many bytes it took.
        Once the packet is whole it is one of the message's packets."""
        take = min(len(view), self._big_length - len(big))
        big += view[:take]
        self._held += take
        if len(big) == self._big_length:
            self._big = None
            self._packet(self._big_type, big)
        return take

    def _next(self) -> Message | None:
        buf = self._buf
        if self._type is None:
            if len(buf) < HEADER_SIZE:
                self._check_prefix(bytes(buf[:HEADER_SIZE]), b"H01", "bad-header")
                return None
            raw = bytes(buf[:HEADER_SIZE])
            del buf[:HEADER_SIZE]
            self._held = HEADER_SIZE
            self._type, self._left = self._parse_header(raw)
            self._packets, self._count = {}, self._left
        msg_type = self._type
        while self._left > 0:
            if len(buf) < PACKET_HEADER_SIZE:
                self._check_prefix(bytes(buf[:PACKET_HEADER_SIZE]), b"P", "bad-packet")
                return None
            packet_type, length = self._parse_packet_header(bytes(buf[:PACKET_HEADER_SIZE]))
            if packet_type in self._packets:
                raise _broken("duplicate-packet", f"packet type {packet_type:02d} appears twice")
            if length >= BIG_PACKET:  # (gathered on its own: what the buffer holds of it now, the rest as it comes)
                del buf[:PACKET_HEADER_SIZE]
                self._held += PACKET_HEADER_SIZE
                self._big, self._big_type, self._big_length = bytearray(), packet_type, length
                with memoryview(buf) as view:
                    take = self._gather(self._big, view)
                del buf[:take]
                if self._big is not None:
                    return None
                continue
            if len(buf) < PACKET_HEADER_SIZE + length:
                return None
            with memoryview(buf) as view:
                content = bytes(view[PACKET_HEADER_SIZE : PACKET_HEADER_SIZE + length])
            del buf[: PACKET_HEADER_SIZE + length]
            self._held += PACKET_HEADER_SIZE + length
            self._packet(packet_type, content)
        self._type = None
        self._held = 0
        return self._validate(Message(msg_type, self._packets, self._count))

    def _packet(self, packet_type: int, content: bytes | bytearray) -> None:
        self._packets[packet_type] = content
        self._left -= 1

    @staticmethod
    def _check_prefix(partial: bytes, expected: bytes, code: str) -> None:
        if not expected.startswith(partial[: len(expected)]):
            raise _broken(code, f"expected {expected!r}, got {partial[: len(expected)]!r}")

    @staticmethod
    def _parse_header(raw: bytes) -> tuple[int, int]:
        if raw[:3] != b"H01" or not raw[3:].isdigit():
            raise _broken("bad-header", f"not a PHPMQ version 01 message header: {raw!r}")
        msg_type, count = int(raw[3:6]), int(raw[6:8])
        if msg_type not in _CLIENT_MESSAGES:
            raise _broken("bad-type", f"message type {msg_type:03d} cannot come from a client")
        required, optional = _CLIENT_MESSAGES[msg_type]
        if not len(required) <= count <= len(required) + len(optional):
            raise _broken("bad-count", f"message type {msg_type:03d} cannot have {count} packets")
        return msg_type, count

    def _parse_packet_header(self, raw: bytes) -> tuple[int, int]:
        if raw[:1] != b"P" or not raw[1:].isdigit():
            raise _broken("bad-packet", f"not a PHPMQ packet header: {raw!r}")
        packet_type, length = int(raw[1:3]), int(raw[3:])
        if packet_type not in (QUEUE, CONTENT, MESSAGE_ID, COUNT, TTL):
            raise _broken("bad-packet", f"unknown packet type {packet_type:02d}")
        if length > self.max_content:
            raise _broken("too-large", f"packet of {length} bytes; the limit is {self.max_content}")
        return packet_type, length

    @staticmethod
    def _validate(message: Message) -> Message:
        required, optional = _CLIENT_MESSAGES[message.type]
        present = set(message.packets)
        if not required <= present or not present <= required | optional:
            raise _broken(
                "bad-packets",
                f"message type {message.type:03d} needs packets {sorted(required)}, got {sorted(present)}",
            )
        if not message.packets[QUEUE]:
            raise _broken("bad-queue", "empty queue name")
        return message


def speaks_current(message: Message) -> bool:
    """The dialect rule: a 3-packet 001, or any 005 or 006, is only sent by current-dialect clients."""
    return (message.type == SEND and message.packet_count == 3) or message.type in (REQUEUE, DEAD_LETTER)
