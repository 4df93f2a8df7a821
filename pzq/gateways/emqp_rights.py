"""Which eMQP commands a client's CURVE key may make (docs/permissions.md), and which queues a worker's may serve.

REQUEST and PUBLISH need the produce right on their queue or topic; SCHEDULE and UNSCHEDULE the manage
right on the queue they name and on the queue of the schedule they would replace or remove (a schedule is
found by its job alone, so a SCHEDULE naming a queue of its own could otherwise take another tenant's
schedule away); a worker's INFORM the consume right on every queue it serves.

The checks ask ``pzq.permissions``, which counts and logs each refusal; the gateway answers it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pzq.permissions import CONSUME, MANAGE, PHRASES, PRODUCE, Permissions, shown
from pzq.protocols import emqp

__all__ = ["client_refusal", "unserved"]


def client_refusal(
    permissions: Permissions, cmd: emqp.Command, user: str | None, schedules: Mapping[str, dict]
) -> str | None:
    """Why the client command ``cmd`` of CURVE key ``user`` (None: no key) is refused, or None when it
    may go on (and for commands that name no queue). ``schedules`` are the schedules' timings by id."""
    if not permissions.enabled:  # (no file: the common case costs one attribute read)
        return None
    if cmd.name in ("REQUEST", "PUBLISH"):
        wanted = [(PRODUCE, cmd.args[0])]
    elif cmd.name in ("SCHEDULE", "UNSCHEDULE"):
        wanted = [(MANAGE, cmd.args[0])]
        existing = schedules.get(emqp.schedule_id(cmd.args[3] if len(cmd.args) > 3 else ""))
        if existing is not None and existing.get("queue") != cmd.args[0]:
            wanted.append((MANAGE, existing.get("queue", "")))
    else:
        return None
    for right, queue in wanted:
        if not permissions.key_may(user, right, queue, "emqp", cmd.name):
            return f"{cmd.name.lower()} refused: not permitted: this client may not {PHRASES[right]} {shown(queue)}"
    return None


def unserved(permissions: Permissions, user: str | None, queues: Iterable[str], what: str = "") -> str | None:
    """The first of a worker's ``queues`` its key ``user`` may not consume from, or None. With ``what``
    (the command) a refusal is counted and logged; without, it is a re-check after a reload."""
    if not permissions.enabled:
        return None
    for queue in queues:
        allowed = (
            permissions.key_may(user, CONSUME, queue, "emqp", what)
            if what
            else permissions.allows_key(user, CONSUME, queue)
        )
        if not allowed:
            return queue
    return None
