"""The MQKS text protocol from the client's side (shared/specs/mqks.md), as pure functions: request lines
out, answers and deliveries in (pzq.protocols.mqks reads and writes the same lines on the server's side)."""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Delivery:
    """A delivery line as a consumer reads it (``delivery`` writes it)."""

    consumer: str
    msg_id: str
    event: str
    retry: int
    data: str


@dataclasses.dataclass(frozen=True)
class Answer:
    """The answer to one request: ``ok`` with its data, or not ok with the error id the log has."""

    request_id: str
    ok: bool
    data: str


_DELIVERY = re.compile(r"^(\S+) ok (\S+) event=([^, ]+)(?:,retry=(\d+))? (.*)$", re.S)


def request_line(request_id: str, action: str, data: str = "", confirm: bool = False) -> bytes:
    """A request as ``parse_line`` reads it; empty parts are left out."""
    return (" ".join(p for p in (request_id, action, "--confirm" if confirm else "", data) if p) + "\n").encode()


def parse_delivery(line: str) -> Delivery | None:
    """A delivery line (without its newline); None for other lines (answers, --update notices)."""
    if " ok --update " in line:
        return None
    match = _DELIVERY.match(line)
    if match is None:
        return None
    consumer, msg_id, event, retry, data = match.groups()
    return Delivery(consumer, msg_id, event, int(retry or 0), data)


def parse_answer(line: str, request_id: str) -> Answer | None:
    """The answer to ``request_id`` if ``line`` (without its newline) is one; None for other lines,
    --update notices included."""
    head = f"{request_id} ok"
    if (line == head or line.startswith(head + " ")) and not line.startswith(head + " --update"):
        return Answer(request_id, True, line[len(head) + 1 :])
    if line.startswith(f"{request_id} error "):
        return Answer(request_id, False, line.split()[-1])
    return None
