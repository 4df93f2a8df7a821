"""eMQP/1.0, the EventMQ protocol (shared/specs/emqp.md), as pure functions over frame lists.

Every command is ``['', 'eMQP/1.0', COMMAND, msgid, ...]`` of UTF-8 text frames (eventmq peers decode
every frame, so nothing binary may ever be sent to them). A ROUTER prepends the sender's identity.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from pzq.errors import ProtocolError

VERSION = b"eMQP/1.0"

# command -> how many frames follow the msgid (min, max)
_ARITY = {
    b"REQUEST": (3, 3),  # queue, headers, payload
    b"REPLY": (1, 2),  # reply (, original msgid)
    b"INFORM": (1, 2),  # queues (, peer type)
    b"READY": (0, 0),
    b"HEARTBEAT": (0, 1),  # unix timestamp
    b"DISCONNECT": (0, 0),
    b"KBYE": (0, 0),
    b"KBAI": (0, 0),
    b"ACK": (1, 1),
    b"SCHEDULE": (3, 5),  # queue, headers, interval (, payload, cron): 9 frames as eventmq sends
    b"UNSCHEDULE": (3, 5),
    b"PUBLISH": (2, 3),  # topic (, headers), payload
}


@dataclasses.dataclass(frozen=True)
class Command:
    """One eMQP command from a peer; ``args`` are the frames after the msgid, as text."""

    peer: bytes
    name: str
    msgid: str
    args: list[str]


MAX_MSGID = 255  # bytes (eventmq's are uuid4 strings of 36)
MAX_HEADER_BYTES, MAX_HEADER_ITEMS = 64 << 10, 64  # (the server passes Limits.emqp_header_*)
_HEADERS = {b"REQUEST", b"SCHEDULE", b"UNSCHEDULE"}  # commands whose second argument is a headers frame


def parse(
    frames: Sequence[bytes], *, max_header_bytes: int = MAX_HEADER_BYTES, max_header_items: int = MAX_HEADER_ITEMS
) -> Command:
    """Read one ROUTER-received message; raises ProtocolError on anything that is not eMQP/1.0. A
    headers frame longer than ``max_header_bytes`` or of more than ``max_header_items`` comma-separated
    items is refused ("bad-headers") from its length and comma count, before it is decoded or split."""
    if len(frames) < 5:
        raise ProtocolError("short", f"{len(frames)} frame(s) is too short for an eMQP command")
    peer, empty, version, name = frames[0], frames[1], frames[2], frames[3]
    if empty != b"" or version != VERSION:
        raise ProtocolError("bad-version", f"expected '' and {VERSION.decode()}, got {bytes(version[:20])!r}")
    if name not in _ARITY:
        raise ProtocolError("unknown-command", f"unknown command {bytes(name[:20])!r}")
    if len(frames[4]) > MAX_MSGID:  # echoed in ACKs and REPLYs: it must not size our memory
        raise ProtocolError("bad-msgid", f"a msgid of {len(frames[4])} bytes; at most {MAX_MSGID}")
    low, high = _ARITY[name]
    rest = frames[5:]
    if not low <= len(rest) <= high:
        raise ProtocolError(
            "bad-arity", f"{name.decode()} takes {low} to {high} frames after the msgid, got {len(rest)}"
        )
    if name in _HEADERS or (name == b"PUBLISH" and len(rest) == 3):
        check_headers(rest[1], max_header_bytes, max_header_items)
    try:
        text = [f.decode("utf-8") for f in (frames[4], *rest)]
    except UnicodeDecodeError:
        raise ProtocolError("not-utf8", f"{name.decode()} has a frame that is not UTF-8") from None
    return Command(peer, name.decode(), text[0], text[1:])


def command(name: str, msgid: str, *args: str | bytes) -> list[bytes]:
    """The frames of a command to send (without the ROUTER's routing frame). ``msgid`` is the caller's
    fresh id (the codec draws no random numbers, so a byte vector test can name it)."""
    return [
        b"",
        VERSION,
        name.encode(),
        msgid.encode(),
        *(a if isinstance(a, bytes) else a.encode("utf-8") for a in args),
    ]


def ack(msgid: str, acked_msgid: str) -> list[bytes]:
    return command("ACK", msgid, acked_msgid)


def heartbeat(msgid: str, now: float) -> list[bytes]:
    return command("HEARTBEAT", msgid, repr(now))


def request(msgid: str, queue: str, headers: str, payload: str | bytes) -> list[bytes]:
    """A job as a worker receives it: the client's REQUEST with its msgid kept (a payload given as bytes
    must be UTF-8 already)."""
    body = payload if isinstance(payload, bytes) else payload.encode()
    return [b"", VERSION, b"REQUEST", msgid.encode(), queue.encode(), headers.encode(), body]


def reply(msgid: str, reply_json: str, request_msgid: str) -> list[bytes]:
    """A worker's REPLY passed on to the client: [.., new msgid, reply, the request's msgid]."""
    return command("REPLY", msgid, reply_json, request_msgid)


def error_reply(msgid: str, detail: str, request_msgid: str) -> list[bytes]:
    """eMQP has no error command: a refused request is answered with a REPLY whose body is
    ``{"error": detail}``, in the layout of a worker's REPLY, so the client can match it by msgid."""
    return reply(msgid, json.dumps({"error": detail}), request_msgid)


def check_headers(frame: bytes, max_bytes: int, max_items: int) -> None:
    """Refuse a headers frame too long or of too many items, at the cost of one count of its commas."""
    if len(frame) > max_bytes:
        raise ProtocolError("bad-headers", f"a headers frame of {len(frame)} bytes; at most {max_bytes}")
    if frame.count(b",") >= max_items:
        raise ProtocolError("bad-headers", f"a headers frame of more than {max_items} items")


def parse_headers(text: str) -> dict[str, str]:
    """'reply-requested,retry-count:3' -> {'reply-requested': '', 'retry-count': '3'}."""
    out = {}
    for item in text.split(","):
        item = item.strip()
        if item:
            name, _, value = item.partition(":")
            out[name] = value
    return out


def header_int(headers: dict[str, str], name: str) -> int:
    value = headers.get(name, "")
    if not value:
        return 0
    if not (value.isascii() and value.isdigit()) or len(value) > 9:
        raise ProtocolError("bad-header", f"header {name}:{value[:20]} is not a whole number")
    return int(value)


def with_header(headers: str, name: str, parsed: dict[str, str] | None = None) -> str:
    """``headers`` with ``name`` added unless present (jobs always ask the worker for a REPLY);
    ``parsed`` is ``parse_headers(headers)`` when the caller has it already."""
    if name in (parse_headers(headers) if parsed is None else parsed):
        return headers
    return f"{headers},{name}" if headers else name


def schedule_id(payload: str) -> str:
    """The identity of a SCHEDULE, as eventmq's scheduler computes it: a hash of the job's callable and
    arguments (so an UNSCHEDULE of the same job finds it); of the whole payload when it is not a job."""
    import hashlib

    try:
        job = json.loads(payload)[1]
        key = json.dumps(
            {k: job[k] for k in ("args", "kwargs", "class_args", "class_kwargs", "path", "callable")}, sort_keys=True
        )
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        key = payload
    return hashlib.sha1(key.encode("utf-8")).hexdigest()


MAX_QUEUES = 1000  # queues one worker may serve


def parse_queues(text: str, default: Sequence[str]) -> list[tuple[int, str]]:
    """A worker INFORM's queues, heaviest first: JSON [[weight, name], ...], the old CSV of names
    (weight 10 each), or '' for the broker's default queues. Raises ProtocolError."""
    text = text.strip()
    if not text:
        return [(10, name) for name in default]
    if text.startswith("["):
        try:
            pairs = json.loads(text)
        except (ValueError, RecursionError):
            raise ProtocolError("bad-queues", "INFORM queues are not valid JSON") from None
        out = []
        for pair in pairs if isinstance(pairs, list) else [None]:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not isinstance(pair[0], int)
                or isinstance(pair[0], bool)
                or not isinstance(pair[1], str)
                or not pair[1].strip()
            ):
                raise ProtocolError("bad-queues", "INFORM queues must be [[weight, name], ...]")
            out.append((pair[0], pair[1]))
    else:
        out = [(10, name.strip()) for name in text.split(",") if name.strip()]
    if len(out) > MAX_QUEUES:  # a worker's queues are looked at for every job handed to it
        raise ProtocolError("bad-queues", f"INFORM names {len(out)} queues; at most {MAX_QUEUES}")
    if not out or any(len(name.encode()) > 255 for _, name in out):
        raise ProtocolError("bad-queues", "INFORM names no usable queue")
    return sorted(out, key=lambda pair: -pair[0])
