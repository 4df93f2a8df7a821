"""eMQP jobs handed to workers: the book of which worker holds which stored message under a client's
msgid, kept in the store's ``EmqpJobs`` with the turn's commit (so that a REPLY after a restart still
completes it), and a stored message made a worker's job (a REQUEST). The roster of workers
(gateways/emqp_workers.py) decides who gets a job and who may complete one; this book keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from pzq.gateways.contract import BrokerSurface, Ref, Send
from pzq.protocols import emqp
from pzq.store import Message
from pzq.store.emqp_jobs import EmqpJobs

FRONT, BACK = "front", "back"  # the frontend (clients) and backend (workers) sockets
Holder = tuple[bytes, str | None]  # a worker's identity and its CURVE key


class JobBook:
    """The jobs handed out: msgid -> {stored message: its holder}. Client msgids are not ours to trust
    unique, so a REPLY completes the job with that msgid held by the replying worker (or by an earlier
    connection it inherits from: ``pop``)."""

    def __init__(self, broker: BrokerSurface, table: EmqpJobs):
        self.broker = broker
        self.table = table  # jobs handed out, for a REPLY after a restart
        self.held: dict[str, dict[Ref, Holder]] = {}

    def handed(self, msgid: str, ref: Ref, holder: Holder, *, record: bool = True) -> None:
        """``holder`` holds ``ref`` under ``msgid``; ``record``: durable with the turn's commit, before the
        job leaves (False: it is on record already, held again after a restart)."""
        self.held.setdefault(msgid, {})[ref] = holder
        if record:
            self.table.put(ref, (msgid, *holder))

    def pop(self, msgid: str, mine: Holder, inherits: Callable[[Ref, Holder], bool]) -> tuple[Ref, Holder] | None:
        """The job (message, holder) a REPLY for ``msgid`` completes, taken off the book: ``mine``'s own,
        else the first another held that ``inherits`` says the replier may complete; None if there is none."""
        holders = self.held.get(msgid)
        if not holders:
            return None
        chosen = next((ref for ref, holder in holders.items() if holder == mine), None)
        if chosen is None:
            chosen = next((ref for ref, holder in holders.items() if inherits(ref, holder)), None)
        if chosen is None:
            return None
        holder = holders.pop(chosen)
        if not holders:
            del self.held[msgid]
        return chosen, holder

    def holds(self, send: Send) -> bool:
        """Whether the job ``send`` carries is still in flight to the worker it was for."""
        ref, holder = _job_of(send)
        return self.broker.deliveries.holder(ref) == holder

    def give_back(self, send: Send) -> tuple | None:
        """The job ``send`` carries never reached its worker: back to its queue and off the book. Returns
        the holder it went back from; None if it was requeued already (its worker was dropped)."""
        ref, holder = _job_of(send)
        if self.broker.deliveries.holder(ref) != holder:
            return None
        self.broker.take_back_many((ref,))
        self.table.delete(ref)
        msgid = send.frames[4].decode("utf-8", "replace")
        held = self.held.get(msgid)
        if held is not None:
            held.pop(ref, None)
            if not held:
                del self.held[msgid]
        return holder

    def forget_left(self) -> None:
        """Forget jobs that left without a REPLY (dead-lettered, acked through another protocol)."""
        gone = [m for m, holders in self.held.items() if all(self.broker.deliveries.holder(r) is None for r in holders)]
        for msgid in gone:
            for ref in self.held.pop(msgid):
                self.table.delete(ref)

    def clear(self) -> None:
        """Forget every job held (a rolled-back turn: they are held again from the table)."""
        self.held.clear()


def job_request(message: Message, queue: str, identity: bytes, consumer: tuple) -> tuple[str, Send]:
    """``message`` as a job for worker ``identity`` (held by ``consumer``): its msgid and the REQUEST."""
    meta = message.meta or {}
    msgid = meta.get("msgid") or message.id
    headers = meta.get("headers", "")
    if "reply" not in meta:  # (a scheduled run, another protocol's message, or a job stored before)
        headers = emqp.with_header(headers, "reply-requested")
    # (what eMQP stored, a REQUEST's or a schedule's, was UTF-8 text: sent as stored; another protocol's
    # bytes are made text, since eventmq peers decode every frame)
    body = b"".join(message.frames)
    payload = body if "msgid" in meta else body.decode("utf-8", "replace")
    frames = [identity, *emqp.request(msgid, queue, headers, payload)]
    return msgid, Send(BACK, frames, ((message.qid, message.seq), consumer))  # (see holds, give_back)


def reply_requested(meta: dict) -> bool:
    """Whether the client asked for the worker's REPLY: kept with the job when its REQUEST came."""
    if "reply" in meta:
        return bool(meta["reply"])
    return "reply-requested" in emqp.parse_headers(meta.get("headers", ""))  # (a job stored before)


def _job_of(send: Send) -> tuple[Ref, tuple]:
    """The stored message a job's Send carries and the holder it went to (its token: ``job_request``)."""
    return cast(tuple[Ref, tuple], send.token)
