"""What the MQKS gateway sends each connection, in order, within the turn's bytes and the connection's
share of the byte account (pzq/broker/accounts.py): replies, deliveries and ``--update`` notices.

A change of a queue's events tells every consumer of it the whole list (up to 10,000 events: a notice
can be 2.5 MB), so a change of a queue with 1,000 consumers made a ~210 MB burst in one request, which
nothing counted (1,028 MiB of the server's memory, an honest client's wait 1.3 s). A notice is now made
only when it is sent: a consumer that is due one is marked (once, however many changes come meanwhile:
it tells the events as they are when it is sent), and notices are made in slices of its connection's
turn (gateways/mqks_lines.py: their time is charged to it), each only while that connection has room in
its share (what it was sent stays charged until its peer's TCP has it: pzq/endpoints/unread.py). What a
connection is sent after a notice that has to wait, waits behind it (``Session.held``), so that its
lines are still answered in order and after the notices they caused; such a connection is handed no
deliveries meanwhile, and its lines are served while what waits is small (``HELD_MOST``: its acks may
be what gives it room again).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from pzq.gateways.contract import ONLY, BrokerSurface, Budget, Send
from pzq.gateways.mqks_consumers import Consumer
from pzq.gateways.mqks_lines import Session
from pzq.protocols import mqks
from pzq.store.bindings import Binding

UPDATE = "update"  # the token of a notice (a rolled-back turn does not send it: its consumer is due again)
HELD_MOST = 1 << 20  # replies held behind a notice past which the connection's next lines wait
STEP_BYTES = 256 << 10  # notices made in one slice of a connection's turn, beyond its first
RETRY_S = 0.05  # how soon a connection without room for its notice is looked at again at the latest
BLOBS_MOST = 8 << 20  # bytes of queues' event lists kept joined for their notices (the oldest go first)


class Outbox:
    """Each connection's output, in order: at once with the turn, or held behind a notice. ``wake(conn)``
    is told when a connection has held output that may go (its turn, in the fair queue, sends it)."""

    def __init__(
        self, broker: BrokerSurface, session_of: Callable[[bytes], Session | None], wake: Callable[[bytes], None]
    ):
        self.broker = broker
        self.session_of = session_of
        self.wake = wake
        self.out: list[Send] = []  # what goes with this turn
        self._holders: set[bytes] = set()  # connections with held output
        self._stuck: set[bytes] = set()  # of them, those whose next notice found no room
        self._quiet: set[bytes] = set()  # connections whose lines wait for room for their answers
        self.retry_at = 0.0  # when the stuck ones are looked at again, unless something gave them room
        self._made: dict[bytes, int] = {}  # bytes sent this turn per connection, not charged yet
        self._blobs: dict[str, tuple[tuple[str, ...], bytes]] = {}  # queue -> (its events, them joined)
        self._blob_bytes = 0
        self.stamp = 0  # the turn's: what was held this turn a rollback must take back
        self.made_total = 0  # notices made

    def new_turn(self) -> None:
        """The turn's output went (its flush): what the next makes is the next's."""
        self.stamp += 1
        self._made.clear()

    def send(self, send: Send) -> None:
        """``send`` goes with the turn, or behind what its connection has held."""
        session = self.session_of(send.peer)
        if session is None or not session.open:
            return
        if session.held:
            session.held.append((self.stamp, send))
            session.held_size += len(send.frames[-1])
        else:
            self.out.append(send)
            self._made[send.peer] = self._made.get(send.peer, 0) + len(send.frames[-1])

    def due(self, consumer: Consumer) -> None:
        """``consumer`` is to be told its queue's events (once: the list as it is when it is sent)."""
        session = self.session_of(consumer.conn)
        if session is None or not session.open or consumer.notice_due:
            return
        consumer.notice_due = True
        session.held.append((self.stamp, consumer))
        if consumer.conn not in self._holders:
            self._holders.add(consumer.conn)
            self.wake(consumer.conn)

    def holders(self) -> set[bytes]:
        """The connections with output held back (no delivery for them until it is out)."""
        return self._holders

    def ready(self, conn: bytes) -> bool:
        """True when ``conn`` has held output that may go now (not waiting for room)."""
        return conn in self._holders and conn not in self._stuck

    def may_answer(self, conn: bytes) -> bool:
        """Whether ``conn``'s next line may be served: what it was sent and its peer has not acknowledged
        (answers, notices, auto-ack deliveries), with what this turn made for it, is under its share and
        the memory bound's ceiling (its account's ``may_pipe``). If not, its lines wait (counted in its
        unfinished input: a client that pipelines and never reads is read no further, then closed) until
        its peer acknowledges some (``unstick``) or ``retry``. A ping's answer is as long as its line: 16
        connections pipelining pings of 60 KB and reading nothing held 497 MiB, raised the alarm (every
        producer refused) and left the server 638 MiB of RssAnon, when answers stopped only at each
        connection's share and a backlog (``stream_backlog_bytes``) unacknowledged."""
        if self.broker.account(("mqks", conn)).may_pipe(self._made.get(conn, 0)):
            return True
        self._quiet.add(conn)
        return False

    def unstick(self, conn: bytes) -> None:
        """``conn`` may have room again (an ack, its peer read): its held output and lines are looked at."""
        if conn in self._stuck or conn in self._quiet:
            self._stuck.discard(conn)
            self._quiet.discard(conn)
            self.wake(conn)

    def retry(self, now: float) -> None:
        """Connections without room are looked at again once ``retry_at`` came, whatever gave them room
        (an ack timeout, the memory bound going down)."""
        if self.has_stuck and now >= self.retry_at:
            for conn in [*self._stuck, *self._quiet]:
                self.unstick(conn)
        if not self.has_stuck:
            self.retry_at = now + RETRY_S

    @property
    def has_stuck(self) -> bool:
        return bool(self._stuck or self._quiet)

    def drain(self, conn: bytes, session: Session, budget: Budget, binding_of, registered) -> None:
        """A slice of ``conn``'s held output, in order, while the turn's bytes last: a notice only while
        the connection has room (made then, with its queue's events as they are)."""
        made = 0
        while session.held and made < STEP_BYTES and not (made and budget.spent()):
            stamp, item = session.held[0]
            if isinstance(item, Send):
                self.out.append(item)
                session.held_size -= len(item.frames[-1])
            elif registered(item):
                line = self._notice(item, binding_of(item.queue))
                if not self._room(conn, len(line)):
                    self._stuck.add(conn)
                    return
                item.notice_due = False
                self._made[conn] = self._made.get(conn, 0) + len(line)
                self.made_total += 1
                self.out.append(Send(ONLY, [conn, line], (UPDATE, item)))
                budget.take(len(line), records=1)
                made += len(line)
            else:  # (gone since it was marked)
                item.notice_due = False
            session.held.popleft()
        if not session.held:
            self._holders.discard(conn)

    def _room(self, conn: bytes, size: int) -> bool:
        # (charged at the turn's flush: what this turn made counts before)
        return self.broker.account(("mqks", conn)).may_hand(size, self._made.get(conn, 0))

    def piped(self, conn: bytes, sends: list[Send], kept: int) -> int:
        """``sends`` (and ``kept`` bytes of replies held back before) went to libzmq for ``conn``: they are
        charged to it until its peer has them, but for manual-ack deliveries, charged by their take."""
        charged = kept
        for send in sends:
            token: Any = send.token
            if token is None or token[0] != "manual":
                charged += len(send.frames[-1])
        self.charged(conn)
        if charged:
            self.broker.account(("mqks", conn)).charge(charged)
        return charged

    def unpiped(self, conn: bytes, size: int) -> None:
        """``conn``'s peer acknowledged ``size`` of its charges: it may have room again."""
        self.broker.account(("mqks", conn)).charge(-size)
        self.unstick(conn)

    def charged(self, conn: bytes) -> None:
        """What was made for ``conn`` this turn is charged now (its flush)."""
        self._made.pop(conn, None)

    def _notice(self, consumer: Consumer, binding: Binding | None) -> bytes:
        """``consumer``'s notice of its queue's events as they are (each queue's list joined once)."""
        if binding is None:
            return mqks.update(consumer.id, consumer.queue, (), None, consumer.manual_ack)
        cached = self._blobs.get(consumer.queue)
        if cached is None or cached[0] is not binding.events:
            if cached is not None:
                self._blob_bytes -= len(cached[1])
            cached = self._blobs[consumer.queue] = (tuple(binding.events), " ".join(binding.events).encode())
            self._blob_bytes += len(cached[1])
            while self._blob_bytes > BLOBS_MOST and len(self._blobs) > 1:  # (each list may be MBs)
                self._blob_bytes -= len(self._blobs.pop(next(iter(self._blobs)))[1])
        return mqks.update_line(consumer.id, consumer.queue, cached[1], binding.unused, consumer.manual_ack)

    def salvage(self, sends: list[Send], confirm_token: str, error: Callable[[Any], Send]) -> list[Send]:
        """A rolled-back turn: its notices are not sent (their consumers are due again), and what it
        held for its connections is taken back as its sends are (``error`` makes a confirm's error)."""
        kept = []
        for send in sends:
            token: Any = send.token
            if token is not None and token[0] == UPDATE and len(token) > 1 and isinstance(token[1], Consumer):
                token[1].notice_due = False
                self.due(token[1])
            else:
                kept.append(send)
        for conn in list(self._holders):
            session = self.session_of(conn)
            if session is not None:
                session.held = collections.deque(
                    (stamp, error(item) if stamp == self.stamp and _confirms(item, confirm_token) else item)
                    for stamp, item in session.held
                )
        self._made.clear()
        return kept

    def forget(self, conn: bytes) -> None:
        """The connection is gone (its session's held output goes with it)."""
        self._made.pop(conn, None)
        self._holders.discard(conn)
        self._stuck.discard(conn)
        self._quiet.discard(conn)


def _confirms(item: object, token: str) -> bool:
    return isinstance(item, Send) and isinstance(item.token, tuple) and item.token[:1] == (token,)
