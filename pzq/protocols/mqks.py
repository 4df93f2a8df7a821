"""The MQKS text protocol (shared/specs/mqks.md), as pure functions: lines in, requests and lines out.

Request   {request_id} {action} [--confirm] {data}\\n
Responses {request_id} ok {data}\\n | {request_id} error {error_id}\\n
Delivery  {consumer_id} ok {msg_id} event={event}[,retry={n}] {data}\\n
Update    {consumer_id} ok --update {queue} {event...} [--delete-queue-when-unused[=S]] [--manual-ack]\\n

IDs (request, queue, event, consumer, message) are tokens without spaces or control characters; only
the data of ``publish`` and ``ping`` may contain spaces. A parse error raises ProtocolError whose
detail goes to the log; the client gets ``{request_id} error {error_id}``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from pzq.errors import ProtocolError
from pzq.protocols.mqks_masks import (  # noqa: F401 (the mask rules: read here as before)
    GLOB_CHARS_PER_UNIT,
    SORT_PER_UNIT,
    matches,
    remove_masked,
)

ACTIONS = ("publish", "consume", "rebind", "ack", "reject", "delete_consumer", "delete_queue", "ping", "_eval")
_BAD_ID = re.compile(r"[\x00-\x20\x7f]")
MAX_ID = 255  # bytes of any id (queue names are store queue names, at most 255 bytes)


@dataclasses.dataclass(frozen=True)
class Request:
    """One parsed line. ``args`` depends on ``action`` (see parse_line)."""

    request_id: str
    action: str
    confirm: bool
    args: dict


def request_id_of(line: bytes) -> str:
    """The request id of a line, as far as one can be read (for answering a line that does not parse)."""
    # (only the line's start is split: a head past 4 x MAX_ID bytes is too long whatever it decodes to)
    head = line[: 4 * MAX_ID + 1].split(b" ", 1)[0].decode("utf-8", "replace")
    return head if head and not _BAD_ID.search(head) and len(head) <= MAX_ID else "-"


def _check_id(kind: str, value: str) -> str:
    if not value or _BAD_ID.search(value) or len(value.encode()) > MAX_ID:
        raise ProtocolError(
            "bad-id", f"{kind} {value[:80]!r} must be 1 to {MAX_ID} bytes without spaces or control characters"
        )
    return value


def parse_line(line: bytes) -> Request:
    """Parse one line (without its newline). Raises ProtocolError."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("bad-utf8", "the line is not UTF-8") from None
    if text.endswith("\r"):  # telnet and friends end lines with CR LF
        text = text[:-1]
    parts = text.split(" ", 2)
    request_id = _check_id("request id", parts[0])
    if len(parts) < 2 or not parts[1]:
        raise ProtocolError("no-action", "a request needs an action after its id")
    action = parts[1]
    if action not in ACTIONS:
        raise ProtocolError("unknown-action", f"unknown action {action[:40]!r}")
    data = parts[2] if len(parts) > 2 else ""
    confirm = data == "--confirm" or data.startswith("--confirm ")
    if confirm:
        data = data[len("--confirm ") :]
    return Request(request_id, action, confirm, _ARGS[action](data))


BIG_LINE = 64 << 10  # a longer line is a publish (or a consume or rebind: mqks_bind_line_bytes), or refused


def action_of(line: bytes) -> bytes:
    """The action word of a line, read from its head (a request id is at most 255 bytes)."""
    parts = line[: 2 * MAX_ID + 2].split(b" ", 2)
    return parts[1] if len(parts) > 1 else b""


def parse_publish(line: bytes) -> tuple[Request, memoryview]:
    """A publish line (without its newline) whose data is not decoded: the request (its data left
    empty) and the data as a view of ``line``, not a copy of it (whether that is UTF-8 is for the caller
    to find, a slice at a time). Raises ProtocolError."""
    first = line.find(b" ")
    second = line.find(b" ", first + 1) if first >= 0 else -1
    if second < 0 or line[first + 1 : second] != b"publish":
        raise ProtocolError("bad-arguments", "expected {request_id} publish [--confirm] {event} {data}")
    request_id = _check_id("request id", _text(line[:first]))
    at = second + 1
    confirm = line.startswith(b"--confirm ", at)
    at += len(b"--confirm ") if confirm else 0
    end = len(line) - 1 if line.endswith(b"\r") else len(line)  # (telnet and friends end lines with CR LF)
    space = line.find(b" ", at, end)
    event = _check_id("event", _text(line[at : end if space < 0 else space]))
    data = memoryview(line)[space + 1 : end] if space >= 0 else memoryview(b"")
    return Request(request_id, "publish", confirm, {"event": event, "data": ""}), data


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("bad-utf8", "the line is not UTF-8") from None


def _publish(data: str) -> dict:
    event, _, payload = data.partition(" ")
    return {"event": _check_id("event", event), "data": payload}


MAX_TOKENS = 3 * 10_000 + 200  # a consume or rebind with more words cannot be within the event limits


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _refuse_control(data: str) -> None:
    """ProtocolError when ``data`` holds a control character (an ASCII line at C speed: printable ASCII
    is exactly what is not a control character)."""
    if not data.isprintable() if data.isascii() else _CONTROL.search(data) is not None:
        raise ProtocolError("bad-id", "ids must not contain control characters")


def _tokens(data: str) -> list[str]:
    """The words of ``data``, checked at once for control characters: each is then an id but for its
    length (``_check_word``), so that 30,000 words cost one search, not 30,000."""
    _refuse_control(data)
    tokens = list(filter(None, data.split(" ")))
    if len(tokens) > MAX_TOKENS:  # refused before any per-word work
        raise ProtocolError("too-many-events", f"{len(tokens)} words in one request; at most {MAX_TOKENS}")
    return tokens


def _check_word(kind: str, value: str) -> str:
    """``_check_id`` of a word of ``_tokens`` (no space or control character left to look for)."""
    if len(value) * 4 > MAX_ID and len(value.encode()) > MAX_ID:
        raise ProtocolError(
            "bad-id", f"{kind} {value[:80]!r} must be 1 to {MAX_ID} bytes without spaces or control characters"
        )
    return value


def _check_words(kind: str, words: list[str]) -> list[str]:
    """``_check_word`` of each of ``words``, at C speed when none is long enough to be over MAX_ID."""
    if words and max(map(len, words)) * 4 > MAX_ID:
        for word in words:
            _check_word(kind, word)
    return words


def _by_option(data: str) -> list[tuple[str, list[str]]]:
    """The words of ``data`` (checked as ``_tokens`` does) cut at each option (a word starting with
    ``--``): the words before the first under "", then each option with the words after it. The text is
    cut at " --" and each piece split in C: a rebind of 10,000 events has a few options, and looking at
    its words one by one in Python cost more than the rest of its parse."""
    _refuse_control(data)
    pieces = (" " + data).split(" --")
    out = [("", list(filter(None, pieces[0].split(" "))))]
    for piece in pieces[1:]:
        name, _, rest = piece.partition(" ")  # (a piece beginning with a space: the word was "--" alone)
        out.append(("--" + name, list(filter(None, rest.split(" ")))))
    if sum(len(words) for _, words in out) + len(out) > MAX_TOKENS:  # refused before any per-word work
        raise ProtocolError("too-many-events", f"too many words in one request; at most {MAX_TOKENS}")
    return out


def _consume(data: str) -> dict:
    parts = _by_option(data)
    if not parts[0][1]:
        raise ProtocolError("no-queue", "consume needs a queue")
    out: dict[str, Any] = {
        "queue": _check_id("queue", parts[0][1].pop(0)),
        "events": None,
        "add": [],
        "unused": None,
        "manual_ack": False,
        "prefetch": None,
    }
    events: list[str] = []
    into = events  # (words go to the events until --add; flags leave that as it is)
    for option, words in parts:
        if option == "--add":
            into = out["add"]
        elif option == "--manual-ack":
            out["manual_ack"] = True
        elif option == "--delete-queue-when-unused" or option.startswith("--delete-queue-when-unused="):
            out["unused"] = _seconds(option.partition("=")[2]) if "=" in option else 0.0
        elif option.startswith("--prefetch="):  # pzq's own: unacked messages at most (manual ack)
            out["prefetch"] = _count(option.partition("=")[2])
        elif option:
            raise ProtocolError("bad-option", f"consume: unknown option {option[:40]!r}")
        into.extend(_check_words("event", words))
    if events:
        out["events"] = events
    return out


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProtocolError("bad-option", f"--delete-queue-when-unused={text[:40]!r} is not seconds") from None
    if not 0 <= value <= 30 * 86400:
        raise ProtocolError("bad-option", f"--delete-queue-when-unused={value} is not 0 to 2592000 seconds")
    return value


MAX_PREFETCH = 10_000  # unacked messages one consumer may hold


def _count(text: str) -> int:
    # (ASCII digits, a few: "²" is a digit to str.isdigit, and 5,000 digits are past what int() converts; both
    # raised ValueError, which rolled the turn back and answered nothing)
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or not 1 <= int(text) <= MAX_PREFETCH:
        raise ProtocolError("bad-option", f"--prefetch={text[:40]!r} is not 1 to {MAX_PREFETCH}")
    return int(text)


def _rebind(data: str) -> dict:
    parts = _by_option(data)
    if not parts[0][1]:
        raise ProtocolError("no-queue", "rebind needs a queue")
    out: dict[str, Any] = {
        "queue": _check_id("queue", parts[0][1].pop(0)),
        "events": None,
        "remove": [],
        "remove_mask": [],
        "add": [],
    }
    events: list[str] = []
    for option, words in parts:
        if option in ("--remove", "--remove-mask", "--add"):
            out[option[2:].replace("-", "_")].extend(_check_words("event", words))
        elif option:
            raise ProtocolError("bad-option", f"rebind: unknown option {option[:40]!r}")
        else:
            events = _check_words("event", words)
    if events:
        out["events"] = events
    return out


def _settle(data: str) -> dict:
    tokens = _tokens(data)
    if len(tokens) != 2:
        raise ProtocolError("bad-arguments", "expected {consumer_id} {msg_id}|--all")
    consumer, message = tokens
    return {
        "consumer": _check_id("consumer id", consumer),
        "msg_id": None if message == "--all" else _check_id("message id", message),
    }


def _one(name: str):
    def parse(data: str) -> dict:
        tokens = _tokens(data)
        if len(tokens) != 1:
            raise ProtocolError("bad-arguments", f"expected one {name}")
        return {name: _check_id(name, tokens[0])}

    return parse


_ARGS = {
    "publish": _publish,
    "consume": _consume,
    "rebind": _rebind,
    "ack": _settle,
    "reject": _settle,
    "delete_consumer": _one("consumer"),
    "delete_queue": _one("queue"),
    "ping": lambda data: {"data": data},
    "_eval": lambda data: {},
}


# -- responses -------------------------------------------------------------------------------------


def ok(request_id: str, data: str = "") -> bytes:
    return f"{request_id} ok {data}\n".encode()


def error(request_id: str, eid: str) -> bytes:
    return f"{request_id} error {eid}\n".encode()


def delivery(consumer_id: str, msg_id: str, event: str, retry: int, data: str) -> bytes:
    retry_part = f",retry={retry}" if retry else ""
    return f"{consumer_id} ok {msg_id} event={event}{retry_part} {data}\n".encode()


def update(consumer_id: str, queue: str, events: Sequence[str], unused: float | None, manual_ack: bool) -> bytes:
    parts = [consumer_id, "ok", "--update", queue, *events]
    if unused is not None:
        parts.append(f"--delete-queue-when-unused={unused!r}" if unused else "--delete-queue-when-unused")
    if manual_ack:
        parts.append("--manual-ack")
    return (" ".join(parts) + "\n").encode()


def update_line(consumer_id: str, queue: str, events: bytes, unused: float | None, manual_ack: bool) -> bytes:
    """``update`` with its events given joined by spaces (one queue's list joined once for all its
    consumers: it may be 2.5 MB)."""
    head = f"{consumer_id} ok --update {queue}".encode()
    tail = ""
    if unused is not None:
        tail += f" --delete-queue-when-unused={unused!r}" if unused else " --delete-queue-when-unused"
    if manual_ack:
        tail += " --manual-ack"
    return b"".join((head, b" " if events else b"", events, tail.encode(), b"\n"))


def body_text(frames: list[bytes]) -> str:
    """A stored body as MQKS data: frames joined, UTF-8 (invalid bytes replaced), and the line breaks
    of bodies from other protocols escaped as \\n and \\r so that they cannot end the line."""
    text = b"".join(frames).decode("utf-8", "replace")
    if "\n" in text or "\r" in text:
        text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text


class LineBuffer:
    """Splits a byte stream into lines. More than ``limit`` bytes without a newline raises
    ProtocolError (the stream cannot be framed any more); a complete line is never refused here."""

    def __init__(self, limit: int):
        self.limit = limit
        self._parts: list[bytes] = []  # the unfinished line, in pieces: no quadratic re-joining
        self._size = 0

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished line."""
        return self._size

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._parts.append(data)
            self._size += len(data)
            lines = []
        else:
            first, *middle, last = data.split(b"\n")
            lines = [b"".join([*self._parts, first]), *middle]  # (one copy of a long line, not two)
            self._parts, self._size = ([last], len(last)) if last else ([], 0)
        if self._size > self.limit:
            head = b"".join(self._parts)[:60]
            self._parts, self._size = [], 0
            raise ProtocolError("line-too-long", f"a line is over {self.limit} bytes (starts {head!r})", fatal=True)
        return [line for line in lines if line.strip()]
