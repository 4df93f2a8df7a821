"""What an MQKS request needs of its connection's network (MQKS carries no identity: permissions are per
source network, pzq/permissions.py), checked before the request changes anything:

- ``publish``: produce on the event's name;
- ``consume``: consume on the queue, and on every event it binds (its events, its ``--add``, and those
  it keeps when it names none): a binding is how a queue reads what is published under an event's name,
  so binding ``payroll`` to a queue one may consume would read payroll's events without the right to;
- ``consume --delete-queue-when-unused``: manage on the queue as well (it deletes the queue, and what
  it holds, once its consumers are gone);
- ``ack``, ``reject``: consume on the queue of the consumer named;
- ``rebind``: manage on the queue, and consume on every event it binds (its events, its ``--add``;
  removing needs nothing more);
- ``delete_queue``: manage on the queue.

``ping`` and ``delete_consumer`` (a connection's own consumer; closing the connection does the same)
need nothing. A refusal is the protocol's error reply (``ProtocolError``, code ``not-permitted``)."""

from __future__ import annotations

from collections.abc import Iterable

from pzq.errors import ProtocolError
from pzq.gateways.mqks_bindings import BindingIndex
from pzq.gateways.mqks_consumers import Consumers
from pzq.gateways.peer_rights import PeerRights
from pzq.permissions import CONSUME, MANAGE, PRODUCE
from pzq.protocols import mqks

__all__ = ["check", "narrowed"]


def check(rights: PeerRights, consumers: Consumers, bindings: BindingIndex, conn: bytes, req: mqks.Request) -> None:
    """Raise ProtocolError ``not-permitted`` when ``conn``'s network may not make ``req`` (the refusal is
    counted and logged by the permissions)."""
    if not rights.enabled:  # (no file: the hot path stays one attribute test)
        return
    a = req.args
    if req.action == "publish":
        _need(rights, conn, PRODUCE, [a["event"]], "publish")
    elif req.action in ("consume", "rebind"):
        bindings.check_sizes(a)  # (at most mqks_max_events of each list before each is checked)
        _need(rights, conn, CONSUME if req.action == "consume" else MANAGE, [a["queue"]], req.action)
        if req.action == "consume" and a["unused"] is not None:  # (a delete_queue once its consumers go)
            _need(rights, conn, MANAGE, [a["queue"]], "consume --delete-queue-when-unused")
        bound = dict.fromkeys([*(a["events"] or ()), *a["add"]])  # (each once, in the request's order)
        if req.action == "consume" and a["events"] is None and (kept := bindings.get(a["queue"])) is not None:
            bound = dict.fromkeys([*kept.events, *bound])  # (the events it keeps are what its consumer reads)
        _need(rights, conn, CONSUME, bound, f"{req.action} (binding the event to {a['queue']!r})")
    elif req.action in ("ack", "reject"):
        consumer = consumers.get(conn, a["consumer"])
        if consumer is not None:  # (else the request's own error: no such consumer on this connection)
            _need(rights, conn, CONSUME, [consumer.queue], req.action)
    elif req.action == "delete_queue":
        _need(rights, conn, MANAGE, [a["queue"]], "delete_queue")


def _need(rights: PeerRights, conn: bytes, right: str, names: Iterable[str], what: str) -> None:
    refused = rights.may_all(conn, right, names, what)
    if refused is not None:
        raise ProtocolError("not-permitted", f"{what}: no {right} right on {refused!r}")


def narrowed(rights: PeerRights, consumers: Consumers, bindings: BindingIndex) -> list[bytes]:
    """The connections with a consumer of a queue their network may no longer consume, or bound to an
    event it may no longer consume (after a SIGHUP): a binding made while it could keeps copying the
    event into the queue."""
    if not rights.enabled:
        return []
    verdicts: dict[tuple[int, str], bool] = {}  # (its rights, queue) -> may it read the queue

    def reads(conn: bytes, queue: str) -> bool:
        key = (id(rights.of(conn)), queue)  # (each queue's events checked once per network)
        if key not in verdicts:
            binding = bindings.get(queue)
            events = binding.events if binding is not None else ()
            verdicts[key] = all(rights.allows(conn, CONSUME, name) for name in (queue, *events))
        return verdicts[key]

    return sorted({c.conn for c in consumers if not reads(c.conn, c.queue)})
