"""The monitor socket's requests and replies (pure). REQ clients send one frame; one frame comes back.

Requests (case-sensitive, words separated by spaces):

    MONITOR                          the PZQ text: six fixed lines, their two wiki spellings, pzq's own lines
    STATS                            the same figures as one JSON object, for tools
    DEADLETTERS <queue> [limit]      JSON list of a queue's dead letters, oldest first
    REQUEUE <queue> <id>|all         move dead letters back to the end of their queue; JSON count
    QUEUE <queue>                    JSON: one queue's figures and its consumers
    PEEK <queue> [limit] [after-id]  JSON: the first ready messages (after one), each body's head only
    DEAD <queue> [limit] [after-id]  JSON: the same for dead letters, with when and why each died
    CLIENTS [limit] [offset]         JSON: each gateway's figures and pages of its clients' lists
    PURGE <queue>                    delete its ready messages (over turns); JSON count
    DELETEDEAD <queue> <id>|all      delete dead letters for good; JSON count
    PUBLISH <queue>                  store the SECOND frame as a message (the only two-frame request)
    CREATE <queue>                   make an explicit queue (never expires); JSON {"created": bool}
    DELETE <queue>                   delete a queue with its messages and dead letters (over turns); JSON
    ROUTES <event>                   JSON: the MQKS queues bound to an event (a publish copies to them)
    WHERE <queue>                    JSON: where the queue lives (its shard, partitions, places; the API's
                                     WHERE answer: pzq/shards.py where_answer)

Anything else is answered with one ``error: ...`` line, never with silence (which would hang a REQ
client forever).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from pzq.errors import ProtocolError

PZQ_FIELDS = ("messages", "messages_inflight", "db_size", "inflight_db_size", "syncs", "expired_messages")
# The PZQ wiki page ("PZQ Sockets & Formats") spells two of the six otherwise than the original's later
# code (which the six lines follow): MONITOR adds them under the wiki's names, same values, after the six,
# so that a script written from either source finds its key (docs/protocols.md)
WIKI_SPELLINGS = (("messages_in_flight", "messages_inflight"), ("in_flightdb_size", "inflight_db_size"))
MAX_REQUEST = 4096


@dataclasses.dataclass(frozen=True)
class Request:
    """One monitor request: who to answer (``envelope``), the command and its arguments."""

    envelope: list[bytes]
    command: str
    args: list[str]
    body: bytes | None = None  # PUBLISH's second frame (no other request has one)
    problem: str = ""  # why a request that has no command was refused (said in its error line)


def parse_request(frames: Sequence[bytes]) -> Request:
    """Split a ROUTER-received request into its envelope and words.

    A REQ client's envelope ends with an empty frame; a bare DEALER may send none, and is answered
    with one all the same (``['', text]``), as the original PZQ answered every client. Bad text
    becomes an error reply (``Request.command == ""``, ``problem`` saying why), never an exception. Only
    PUBLISH has a second frame (its body), and it must have one.
    """
    try:
        cut = frames.index(b"") + 1
    except ValueError:
        cut = 0
    if 0 < cut < len(frames):
        envelope, body = list(frames[:cut]), frames[cut:]
    else:  # (no delimiter, or only a last empty frame: a bare DEALER's PUBLISH of an empty body, not a REQ's)
        envelope, body = [*frames[:1], b""], frames[1:]
    if not 1 <= len(body) <= 2 or len(body[0]) > MAX_REQUEST:
        return Request(
            envelope, "", [], problem=f"a request is one frame of at most {MAX_REQUEST} bytes (PUBLISH: two)"
        )
    try:
        words = body[0].decode("utf-8").split()
    except UnicodeDecodeError:
        return Request(envelope, "", [], problem="a request is UTF-8 text")
    if not words:
        return Request(envelope, "", [])
    if (words[0] == "PUBLISH") != (len(body) == 2):
        why = "PUBLISH carries its body as a second frame" if len(body) == 1 else "only PUBLISH has a second frame"
        return Request(envelope, "", [], problem=why)
    return Request(envelope, words[0], words[1:], bytes(body[1]) if len(body) == 2 else None)


def reply(request: Request, text: str) -> list[bytes]:
    return [*request.envelope, text.encode("utf-8")]


def error_text(error: ProtocolError | str) -> str:
    detail = error.detail if isinstance(error, ProtocolError) else error
    return f"error: {detail}\n"


def unknown_request(request: Request) -> str:
    return error_text(
        f"{request.problem or 'unknown request'}; send MONITOR, STATS, QUEUE <queue>, "
        "PEEK|DEAD <queue> [limit] [after-id], CLIENTS [limit] [offset], DEADLETTERS <queue> [limit], "
        "REQUEUE|DELETEDEAD <queue> <id>|all, PURGE|CREATE|DELETE <queue>, ROUTES <event>, WHERE <queue> "
        "or PUBLISH <queue> (its body a second frame)"
    )


def render_text(stats: dict) -> str:
    """The MONITOR reply: the six PZQ lines in their order, the wiki's two spellings, then every other
    figure as name: value.

    Nested figures flatten with dots: {"queues": {"default": {"depth": 3}}} -> "queue.default.depth: 3".
    """
    lines = monitor_opening(stats).splitlines()
    for name, value in stats.items():
        if name in PZQ_FIELDS:
            continue
        if name == "queues":
            lines.extend(queue_lines(value))
        else:
            lines.extend(_flatten(name, value))
    return "\n".join(lines) + "\n"


def queue_lines(queues: dict) -> list[str]:
    """The MONITOR lines of ``queues`` (name -> figures), as ``render_text`` writes them."""
    return [f"queue.{queue}.{k}: {_scalar(v)}" for queue, figures in queues.items() for k, v in figures.items()]


# An answer in three parts, for a server that builds the per-queue part over turns (pzq/admin/figures.py):
# the opening (the figures before ``queues``: the six PZQ fields), the queues in slices (a slice's
# figures by name), and the closing (every other figure). Put end to end, they are the same text as
# ``render_json`` (STATS) or ``render_text`` (MONITOR) of the whole.


def stats_opening(head: dict) -> str:
    return render_json(head)[:-1] + ',"queues":{'


def stats_queues(queues: dict, first: bool) -> str:
    """``queues``'s members of STATS's ``queues`` object (after a comma unless ``first``; "" for none)."""
    members = render_json(queues)[1:-1]
    return members if first or not members else "," + members


def stats_closing(rest: dict) -> str:
    return "}" + ("," + render_json(rest)[1:] if rest else "}")


def monitor_opening(head: dict) -> str:
    six = "".join(f"{name}: {head[name]}\n" for name in PZQ_FIELDS)
    return six + "".join(f"{wiki}: {head[name]}\n" for wiki, name in WIKI_SPELLINGS)


def monitor_queues(queues: dict, first: bool) -> str:
    return "".join(line + "\n" for line in queue_lines(queues))


def monitor_closing(rest: dict) -> str:
    return "".join(line + "\n" for name, value in rest.items() for line in _flatten(name, value))


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
