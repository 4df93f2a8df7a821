"""MQKS connections on the shared store: events, bindings, consumers and acks (shared/specs/mqks.md).

The endpoint hands every connection's bytes to ``keep``, has them served (``serve``: whose turn it is by
what its requests cost, gateways/mqks_lines.py; a request that does not fit a slice of a turn goes on in
the next, gateways/mqks_requests.py) and sends the answers and what ``dispatch`` returns after the
turn's commit, so a ``--confirm`` answer always follows the durable commit of what it confirms. What is
sent to a connection goes in order, within the turn's bytes and its share of the byte account
(gateways/mqks_out.py), and stays charged to it until its peer's TCP has it (``piped``).

Mapping to the store: an MQKS queue is a named store queue; its bindings and its
``--delete-queue-when-unused`` setting are a side record (table ``mqks``). A publish stores one message
per bound queue: the data as a one-frame body, and the publisher's msg_id and the event in the message's
meta. A message from another protocol reaches MQKS consumers with its 32-hex id as msg_id, its queue's
name as event, and its frames joined as data (line breaks escaped as \\n and \\r).

Consumers belong to their connection (ids are looked up per connection) and are not restored after a
restart: clients consume again on reconnect, as the reference client does. Auto-ack consumers get each
message at most once: it is deleted (durably) before its line is sent. Manual-ack consumers get it at
least once: unacknowledged after ``--ack-timeout``, or when the consumer or its connection goes, it is
delivered again with ``retry`` raised; a reject puts it at the end of its queue, retry raised.
Bindings: gateways/mqks_bindings.py; consumers and deliveries: gateways/mqks_consumers.py.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreError, StoreFull
from pzq.gateways import mqks_rights
from pzq.gateways.contract import ONLY, UNBOUNDED, BrokerSurface, Budget, Send
from pzq.gateways.mqks_bindings import BindingIndex
from pzq.gateways.mqks_consumers import Consumer, Consumers
from pzq.gateways.mqks_lines import LINE_S_PER_BYTE, FairTurns, Session
from pzq.gateways.mqks_out import HELD_MOST, Outbox
from pzq.gateways.mqks_publish import Publish
from pzq.gateways.mqks_requests import CONFIRM, Requests
from pzq.gateways.peer_rights import PeerRights
from pzq.logs import warn_bad
from pzq.permissions import Permissions
from pzq.protocols import mqks
from pzq.store.bindings import Bindings

log = logging.getLogger("pzq.mqks")


class MqksGateway:
    """Every MQKS connection and what it asks: the commands, on the bindings and consumers below."""

    def __init__(
        self,
        broker: BrokerSurface,
        bindings: Bindings,
        *,
        max_line: int,
        window: int,
        drop_queue: Callable[[str], int],
        error_id: Callable[[], str] = lambda: secrets.token_hex(12),
        limits: Limits = DEFAULT_LIMITS,
        permissions: Permissions | None = None,
    ):
        """``bindings`` is the store's table of MQKS bindings; ``window`` the unacked deliveries per
        manual-ack consumer; ``drop_queue`` deletes a queue and what it holds (the server's, which
        also forgets its figures); ``permissions`` who may do what, per source network (mqks_rights.py)."""
        self.broker = broker
        self.rights = PeerRights(permissions, "mqks")
        self.limits = limits
        self.max_line = max_line
        self.sessions: dict[bytes, Session] = {}
        self._ghosts: dict[bytes, Session] = {}  # closed connections whose publish goes on to its end
        self.turns = FairTurns()
        self.outbox = Outbox(broker, self._session, self._wake)
        self._served: set[bytes] = set()
        self.waiting_bytes = 0
        self.writing = False  # a job wrote a copy or a part since the last flush (the turn must commit)
        self.dispatched = self.dispatched_bytes = 0  # what the last dispatch handed out (the turn's budget)
        self.consumers = Consumers(broker, limits, window)
        self.bindings = BindingIndex(bindings, limits)
        self.requests = Requests(
            broker, limits, self.rights, self.bindings, self.consumers, self.outbox, drop_queue, max_line, error_id
        )
        self.requests.start_unused_clocks()
        broker.queues.add_user(self.requests)

    def _session(self, conn: bytes) -> Session | None:
        return self.sessions.get(conn) or self._ghosts.get(conn)

    def _wake(self, conn: bytes) -> None:
        """``conn`` has held output that may go: its turn comes (mqks_lines.py)."""
        session = self._session(conn)
        if session is not None:
            self._push(conn, session)

    def _push(self, conn: bytes, session: Session) -> None:
        """Into the fair queue, with what its next slice is likely to cost (mqks_lines.py)."""
        if self.outbox.ready(conn):
            likely = 0.0
        elif session.job is not None:
            likely = session.last_cost
        else:
            likely = len(session.waiting[0]) * LINE_S_PER_BYTE if session.waiting else 0.0
        self.turns.push(conn, session, likely)

    def _has_work(self, conn: bytes, session: Session) -> bool:
        """Held output that may go, or a slice, or a line while its answers have room; while it holds back little."""
        lines = session.job is not None or bool(session.waiting) and self.outbox.may_answer(conn)
        return self.outbox.ready(conn) or lines and session.held_size <= HELD_MOST

    def load(self) -> None:
        """Read the bindings: at start-up and after a rolled-back turn."""
        self.bindings.load()
        self.requests.start_unused_clocks()

    def recover(self) -> None:
        """The turn was rolled back (the broker restarted from the disk): deliveries are forgotten,
        bindings re-read, what was about to be confirmed is answered with an error instead, and the
        requests under way in slices end with an error (what earlier turns stored of them stays)."""
        self.consumers.forget_deliveries()
        pending, self.outbox.out = self.outbox.out, []
        self.outbox.out = self._salvage(pending)
        for conn, session in [*self.sessions.items(), *self._ghosts.items()]:
            if session.job is not None:
                job, session.job = session.job, None
                self.requests.job_rolled_back(conn, job)
            if session.busy:
                self._push(conn, session)
        self._ghosts.clear()
        self.load()

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        return self._salvage(sends)

    def _salvage(self, sends: list[Send]) -> list[Send]:
        """Lines of a rolled-back turn: errors and pings still go out, confirms become errors, and
        deliveries and --update notices (of a state that is gone) are not sent (the consumers of those
        notices are due one again)."""
        kept = []
        for send in self.outbox.salvage(sends, CONFIRM, self._error_instead):
            token: Any = send.token
            if token is None:
                kept.append(send)
            elif token[0] == CONFIRM:
                self.requests.error(send.peer, token[1], "store-failed", "store failure: the request was rolled back")
        return kept + self._take_out()

    def _error_instead(self, confirm: Send) -> Send:  # (a confirm held behind a notice: mqks_out.py)
        return Send(ONLY, [confirm.peer, self.requests.error_line(confirm.token[1], "store-failed", "rolled back")])  # type: ignore[index]

    def _take_out(self) -> list[Send]:
        out, self.outbox.out = self.outbox.out, []
        return out

    # -- connections ---------------------------------------------------------------------------------

    def connected(self, conn: bytes, address: str = "") -> None:
        self.sessions[conn] = Session(mqks.LineBuffer(self.max_line))
        self.rights.connected(conn, address)

    def buffered(self, conn: bytes) -> int:
        """Bytes of input it holds: an unfinished line, whole lines not served, a publish's being stored."""
        session = self.sessions.get(conn)
        return 0 if session is None else session.buffered

    def holding(self, conn: bytes) -> bool:
        return self.consumers.holding(conn)

    def disconnected(self, conn: bytes) -> None:
        """The connection is gone: its consumers go, and what they held returns with retry raised. A
        publish of it under way goes on (its client sent all of it); its lines not served yet are not."""
        session = self.sessions.pop(conn, None)
        if session is None:
            return
        session.open = False
        self._drop_waiting(session)
        session.held.clear()
        self.outbox.forget(conn)
        if session.job is not None:
            self._ghosts[conn] = session
        self._served.add(conn)
        self.rights.gone(conn)
        self.bindings.shares.forget(conn)  # (its bindings stay: the pool's limit still counts them)
        for consumer in self.consumers.of(conn):
            self.requests.remove_consumer(consumer)
        self.broker.gone(("mqks", conn))  # (the queues it made, and what its pipe held, go with it)

    def narrowed(self) -> list[bytes]:
        """Connections consuming a queue their network may no longer consume (SIGHUP): to be closed."""
        return mqks_rights.narrowed(self.rights, self.consumers, self.bindings)

    def received(self, conn: bytes, data: bytes, *, now: Now) -> list[Send]:
        """Bytes, and the answers to every waiting line (tests; the endpoint calls ``keep``, ``serve``)."""
        sends = self.keep(conn, data)
        return sends if sends and sends[-1].close else sends + self.serve(now=now, budget=UNBOUNDED)

    def keep(self, conn: bytes, data: bytes) -> list[Send]:
        """Bytes from a connection: its whole lines wait for ``serve``; an endless line closes it."""
        session = self.sessions.get(conn)
        if session is None:  # a connection already closed (STREAM announces every new one first)
            return []
        try:
            lines = session.buffer.feed(data)
        except ProtocolError as exc:
            warn_bad("mqks", exc.code, f"{exc.detail}; closing the connection")
            self._drop_waiting(session)
            return [*self._take_out(), Send(ONLY, [conn], close=True)]
        if lines:
            session.waiting.extend(lines)
            size = sum(map(len, lines))
            session.waiting_bytes += size
            self.waiting_bytes += size
            if self._has_work(conn, session):  # (else once what it holds back is out)
                self._push(conn, session)
        return self._take_out()

    def waiting(self) -> bool:
        """True while lines, slices or held output wait for their turn."""
        return bool(self.turns)

    def _drop_waiting(self, session: Session) -> None:
        self.waiting_bytes -= session.waiting_bytes
        session.waiting.clear()
        session.waiting_bytes = 0

    def served(self) -> set[bytes]:
        """The connections whose waiting lines went down since the last call (``buffered`` changed)."""
        served, self._served = self._served, set()
        return served

    def serve(self, *, now: Now, budget: Budget) -> list[Send]:
        """Serve while ``budget`` lasts, the connection whose requests have cost least first
        (mqks_lines.py), a slice of its turn at a time: output held behind a notice (while it has room),
        else its request in slices or its next line; asked between requests and slices, so each request
        stays whole or goes on next turn. A connection with output held back is served its lines while
        what it holds is small (its answers wait behind, in order). One slice is served whatever the
        budget says: reading a flood of pipelined lines may have spent it, and the lowest tag (an honest
        line) must still go each turn."""
        first = True
        while first or not budget.spent():
            first = False
            conn = self.turns.pop()
            if conn is None:
                break
            session = self._session(conn)
            if session is None:
                continue
            if not self._has_work(conn, session):  # (pushed again when it has)
                session.queued = False
                continue
            began = time.perf_counter()  # (still ``queued`` while served: a wake meanwhile pushes nothing)
            try:
                if self.outbox.ready(conn):
                    self.outbox.drain(conn, session, budget, self.bindings.get, self._registered)
                    self._served.add(conn)  # (what it holds back went down: buffered)
                elif session.job is not None:
                    self._step(conn, session, budget, now.wall_us)
                else:
                    self._serve_line(conn, session, now.wall_us, budget)
            finally:
                self.turns.charge(session, time.perf_counter() - began)
                session.queued = False
            if self._has_work(conn, session):
                self._push(conn, session)
        return self._take_out()

    def _registered(self, consumer: Consumer) -> bool:
        return self.consumers.get(consumer.conn, consumer.id) is consumer

    def _serve_line(self, conn: bytes, session: Session, now_us: int, budget: Budget) -> None:
        """The next waiting line of ``conn``: its answer goes out after the answers to its earlier lines."""
        line = session.waiting.popleft()
        session.waiting_bytes -= len(line)
        self.waiting_bytes -= len(line)
        self._served.add(conn)
        self.outbox.unstick(conn)  # (an ack may give it room for a notice it waits for)
        try:
            self.requests.request(conn, session, line, now_us, budget)
        except StoreError:
            # The whole turn is rolled back by the server: this line and the rest get an error.
            for rest in [line, *session.waiting]:
                self.requests.error(conn, mqks.request_id_of(rest), "store-failed", "store failure; try again")
            self._drop_waiting(session)
            raise
        budget.take(0, records=1)

    def _step(self, conn: bytes, session: Session, budget: Budget, now_us: int) -> None:
        """The next slice of ``conn``'s request under way; its answer after its last."""
        job = session.job
        failed = True
        try:
            done = job.step(budget, now_us)
            failed = False
        except ProtocolError as exc:
            self.requests.error(conn, job.request_id, exc.code, exc.detail)
        except StoreFull as exc:
            stored = job.stored() if isinstance(job, Publish) else 0
            self.requests.error(conn, job.request_id, "queue-full", f"{exc} (stored in {stored} of its queues)")
        finally:
            self.writing = self.writing or job.wrote
        if failed or done:
            session.job = None
            self._served.add(conn)  # (the line it held is let go: buffered went down)
            if not session.open:
                self._ghosts.pop(conn, None)
        if failed or not done:
            return
        self.requests.published_total += isinstance(job, Publish)
        if job.confirm:
            self.requests.reply(conn, mqks.ok(job.request_id), (CONFIRM, job.request_id))

    def flushed(self) -> None:
        """The turn's output went (after its commit): a new turn's parts make a new commit."""
        self.writing = False
        self.outbox.new_turn()

    def piped(self, conn: bytes, sends: list[Send], kept: int) -> int:
        """What went to libzmq for ``conn``, charged to it until its peer has it (see Outbox.piped)."""
        return self.outbox.piped(conn, sends, kept)

    def unpiped(self, conn: bytes, size: int) -> None:
        self.outbox.unpiped(conn, size)

    # -- each turn -------------------------------------------------------------------------------------

    def dispatch(
        self,
        *,
        now: Now,
        blocked: frozenset = frozenset(),
        most: int | None = None,
        most_bytes: int | None = None,
    ) -> list[Send]:
        """Everything to send this turn: replies, then deliveries (``most`` of them and about
        ``most_bytes`` of bodies at most: ``dispatched``, ``dispatched_bytes`` say what went; a call again
        in the same turn goes on from there); and queues unused for long enough go. ``blocked``
        connections read too slowly, and those with output held back wait for it: no deliveries now."""
        self.outbox.retry(now.mono)  # (those without room looked at again now and then: an ack timeout, the bound)
        self.requests.expire_unused(now.mono)
        self.consumers.put_back(most)  # (a call's share when the turn is cut in calls: see most)
        held = frozenset(self.outbox.holders())
        deliveries = self.consumers.deliver(
            now=now, blocked=blocked | held if held else blocked, most=most, most_bytes=most_bytes
        )
        self.dispatched = len(deliveries)
        self.dispatched_bytes = sum(len(send.frames[-1]) for send in deliveries)
        return self._take_out() + deliveries

    def unsent(self, send: Send) -> bool:
        """A line the client's connection would not take now: see Consumers.unsent."""
        return self.consumers.unsent(send)

    def next_wake(self, now: float) -> float | None:
        due = self.requests.next_delete()
        wakes = [] if due is None else [due]
        if self.outbox.has_stuck:  # (connections without room for a notice: looked at again then)
            wakes.append(self.outbox.retry_at)
        return min(wakes) if wakes else None

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return self.consumers.of_queue(queue, limit)

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        rows = []
        for conn in itertools.islice(self.sessions, offset, offset + limit):
            mine = self.consumers.of(conn)
            queues = ", ".join(sorted({c.queue for c in mine}))
            rows.append([conn.hex(), len(mine), queues[:200] or "-", sum(len(c.unacked) for c in mine)])
        columns = ["connection", "consumers", "queues", "unacked"]
        return [{"kind": "mqks", "title": "Connections", "columns": columns, "rows": rows, "total": len(self.sessions)}]

    def stats(self) -> dict:
        return {
            "connections": len(self.sessions),
            "consumers": len(self.consumers),
            "bound_queues": len(self.bindings),
            "bindings": self.bindings.bound_total,
            "bindings_refused_total": self.bindings.shares.refused_total,  # (past a connection's share)
            "published_total": self.requests.published_total,
            "unrouted_total": self.requests.unrouted_total,
            "delivered_total": self.consumers.delivered_total,
            "errors_total": self.requests.errors_total,
            # (whole lines read but not served yet: the turn's budget ran out before them)
            "lines_waiting": sum(len(s.waiting) for s in self.sessions.values()),
            # (requests under way in slices: publishes' copies, notices being marked)
            "requests_in_slices": sum(1 for s in [*self.sessions.values(), *self._ghosts.values()] if s.job),
            "notices_total": self.outbox.made_total,
            "connections_held_back": len(self.outbox.holders()),  # (output waiting behind a notice)
            # (queues deleted whose records go over the next turns, and the messages they still hold)
            **dict(zip(("deleting_queues", "deleting_messages"), self.broker.queues.dropping_left(), strict=True)),
        }
