"""The monitor's admin requests from a blocking client (the CLI's `pzq queue`, `pzq clients`,
`pzq dead-letters delete`): one request, one JSON answer, an ``error:`` reply raised as AdminRefused."""

from __future__ import annotations

import json
from collections.abc import Sequence

import zmq

from pzq.clients.native import no_answer
from pzq.clients.sockets import Curve, connect, receive, timeout_seconds, wait_ms
from pzq.errors import ClientError, NoMessage, NotPermitted

NOT_PERMITTED = "error: not permitted:"  # the refusal of a request the client's key has not the right for


class AdminRefused(ClientError):
    """The server answered ``error: ...``: ``str()`` is the text after ``error:``; ``reply`` the whole line."""

    def __init__(self, reply: str):
        super().__init__(reply.strip().removeprefix("error:").strip())
        self.reply = reply

    @property
    def no_queue(self) -> bool:
        """The request named a queue the server does not have."""
        return str(self).startswith("there is no queue")


class AdminNotPermitted(AdminRefused, NotPermitted):
    """The server answered ``error: not permitted: ...``: the client's key has not the right."""


def admin_request(
    endpoint: str,
    words: str | Sequence[str],
    body: bytes | None = None,
    *,
    timeout_s: float | None = None,
    curve: Curve | None = None,
    ctx: zmq.Context | None = None,
    timeout_ms: int | None = None,
) -> dict | list:
    """Send one monitor request (its words; ``body`` as the second frame: PUBLISH) and return its
    JSON answer. AdminRefused on an ``error:`` answer (AdminNotPermitted, a NotPermitted too, on
    ``error: not permitted``); NotPermitted when the server refuses the CURVE key; ClientError when
    nothing answers within ``timeout_s`` (5 s; ``timeout_ms`` is its deprecated alias) or the answer is not
    pzq's."""
    wait = timeout_seconds(timeout_s, timeout_ms, 5.0)
    text = words if isinstance(words, str) else " ".join(words)
    sock = connect(zmq.REQ, endpoint, ctx=ctx, curve=curve)
    try:
        sock.send_multipart([text.encode("utf-8")] if body is None else [text.encode("utf-8"), body])
        frames = receive(sock, wait_ms(wait))
    finally:
        sock.close(linger=0)
    if frames is None:
        raise NoMessage(no_answer(endpoint, wait))
    reply = frames[0].decode("utf-8", "replace")
    if reply.startswith(NOT_PERMITTED):
        raise AdminNotPermitted(reply)
    if reply.startswith("error:"):
        raise AdminRefused(reply)
    try:
        answer = json.loads(reply)
    except ValueError:
        answer = None
    if not isinstance(answer, (dict, list)):
        raise ClientError(f"the answer from {endpoint} is not pzq's ({reply[:60]!r}): is a pzq monitor there?")
    return answer
