"""The monitor socket's requests and replies (pure). REQ clients send one frame; one frame comes back.

Requests (case-sensitive, words separated by spaces):

    MONITOR                          the PZQ text: six fixed lines, then pzq's own lines
    STATS                            the same figures as one JSON object, for tools
    DEADLETTERS <queue> [limit]      JSON list of a queue's dead letters, oldest first
    REQUEUE <queue> <id>|all         move dead letters back to the end of their queue; JSON count

Anything else is answered with one ``error: ...`` line, never with silence (which would hang a REQ
client forever).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from pzq.errors import ProtocolError

PZQ_FIELDS = ("messages", "messages_inflight", "db_size", "inflight_db_size", "syncs", "expired_messages")
MAX_REQUEST = 4096


@dataclasses.dataclass(frozen=True)
class Request:
    """One monitor request: who to answer (``envelope``), the command and its arguments."""

    envelope: list[bytes]
    command: str
    args: list[str]


def parse_request(frames: Sequence[bytes]) -> Request:
    """Split a ROUTER-received request into its envelope and words.

    A REQ client's envelope ends with an empty frame; a bare DEALER may send none, and is answered
    with one all the same (``['', text]``), as the original PZQ answered every client. Bad text
    becomes an error reply (``Request.command == ""``), never an exception.
    """
    try:
        cut = frames.index(b"") + 1
        envelope, body = list(frames[:cut]), frames[cut:]
    except ValueError:
        envelope, body = [*frames[:1], b""], frames[1:]
    if len(body) != 1 or len(body[0]) > MAX_REQUEST:
        return Request(envelope, "", [])
    try:
        words = body[0].decode("utf-8").split()
    except UnicodeDecodeError:
        return Request(envelope, "", [])
    if not words:
        return Request(envelope, "", [])
    return Request(envelope, words[0], words[1:])


def reply(request: Request, text: str) -> list[bytes]:
    return [*request.envelope, text.encode("utf-8")]


def error_text(error: ProtocolError | str) -> str:
    detail = error.detail if isinstance(error, ProtocolError) else error
    return f"error: {detail}\n"


def unknown_request(request: Request) -> str:
    return error_text("unknown request; send MONITOR, STATS, DEADLETTERS <queue> [limit] or REQUEUE <queue> <id>|all")


def render_text(stats: dict) -> str:
    """The MONITOR reply: the six PZQ lines in their order, then every other figure as name: value.

    Nested figures flatten with dots: {"queues": {"default": {"depth": 3}}} -> "queue.default.depth: 3".
    """
    lines = [f"{name}: {stats[name]}" for name in PZQ_FIELDS]
    for name, value in stats.items():
        if name in PZQ_FIELDS:
            continue
        if name == "queues":
            for queue, figures in value.items():
                lines.extend(f"queue.{queue}.{k}: {_scalar(v)}" for k, v in figures.items())
        else:
            lines.extend(_flatten(name, value))
    return "\n".join(lines) + "\n"


def _flatten(name: str, value) -> list[str]:
    if isinstance(value, dict):
        return [line for k, v in value.items() for line in _flatten(f"{name}.{k}", v)]
    return [f"{name}: {_scalar(value)}"]


def _scalar(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def render_json(stats: dict | list) -> str:
    return json.dumps(stats, sort_keys=False, separators=(",", ":"))
