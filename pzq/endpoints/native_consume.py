"""The batched native consumers' endpoint (PZQ-BATCH/1): a ROUTER on ``--consume-dsn``.

A thin adapter: it reads consumers' commands within the turn's budget (an ACK or NACK counts one
record per key), asks the gateway for batches of deliveries a chunk at a time (each message one record),
and sends every answer and batch after the commit through ``Replies`` (nothing vanishes silently: a
consumer whose pipe is full is served nothing more until it reads). The bodies its consumers were handed
count in the memory bound through the broker's byte account (``deliveries``: each consumer within its
share, all of them under the low-water mark), its backlogs as ``consume_backlogs``.
"""

from __future__ import annotations

import logging

import zmq

from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_with_fd
from pzq.endpoints.held import Held
from pzq.endpoints.replies import Replies
from pzq.gateways.native_consume import BatchConsumeGateway, Out
from pzq.protocols import native_consume as wire
from pzq.zmqio import NOBLOCK, Again, answer_cut

log = logging.getLogger("pzq.server")

PIPE_FRAMES = 16  # DELIVER frames (and answers) one consumer's pipe holds: SNDHWM (its credit of 1,000 is 10 DELIVERs)
# Commands one consumer's pipe holds (RCVHWM): ~7 MiB of the biggest (an ACK of 1,000 keys), a few KiB of
# CREDITs; a consumer waits for SETTLED before it needs to send many more
COMMANDS_UNREAD = 100
_ANSWERED_AFTER_COMMIT = (wire.ACK, wire.NACK, wire.BYE)  # (HELLO, ERR and batches need no commit first)


class BatchConsumeEndpoint(Endpoint):
    """Binds the consume ROUTER and carries commands, answers and batches between it and the gateway."""

    name = "native_batch"

    def __init__(self, config: Config, gateway: BatchConsumeGateway, binder: Sockets):
        self.limits = config.limits  # (read_batch, turn_chunk, consume_max_keys)
        self.gateway = gateway
        # Commands are small: the biggest is an ACK of consume_max_keys keys (libzmq disconnects a peer
        # that sends more before buffering it).
        self.sock = binder.bind(
            zmq.ROUTER,
            config.consume_dsn,
            "--consume-dsn",
            MAXMSGSIZE=config.limits.consume_max_keys * (wire.MAX_KEY + 2) + 4096,
            SNDHWM=PIPE_FRAMES,
            RCVHWM=COMMANDS_UNREAD,
        )
        self.sockets = [self.sock]
        self.replies = Replies(self.sock, "batch consumer", config.limits)
        self._gate = binder.gate(self.sock)
        answer_cut(self.sock, wire.cut)  # (a command past MAX_FRAMES frames is answered ERR, not dropped unseen)
        self.binder = binder
        # (tcp://: a consumer whose connection closes is gone, and what it held goes back at once)
        binder.on_disconnect[self.sock] = gateway.disconnected
        self._out: list[Out] = []
        self._held = Held[Out]()  # (each turn's answers and deliveries, till their commit is on disk)
        # A dispatch owed that this turn's work did not make: the next turn comes at once (wake_at). Else a
        # consumer that has sent all it had to waits with credit and messages ready for the next event, up to
        # the loop's 1 s tick (82 such pauses in 20,000 messages acked one ACK per message, issue 40). Owed
        # when commands were read after the work (the loop's round-robin begins a turn after a spent one with
        # the tasks it did not reach: the works, then the reads), or when a consumer passed over because
        # answers waited for it has them sent by the flush (its last answers SETTLEDs: nothing to ack).
        self._again = False
        self._held_back: set[bytes] = set()  # consumers passed over this turn for answers waiting

    def read(self, ready: dict, now: Now) -> None:
        if self.sock not in ready:
            return
        budget = self.budget
        came: list[tuple[bytes, int, str | None]] = []  # (consumer, descriptor of its connection, CURVE key)
        for _ in range(self.limits.read_batch):
            if budget.spent():
                break
            try:
                frames, user, fd = receive_with_fd(self.sock, self._gate, "batch consumer", NOBLOCK)
            except Again:
                break
            if frames is None:
                continue
            came.append((frames[0], fd, user))
            size = sum(map(len, frames))
            # (a consumer's commands are carried out even while replies wait for it: a backlog is often a
            # moment's (libzmq's I/O thread had not moved its pipe yet), and a dropped ACK or NACK hung a
            # consumer that reads, waiting for its SETTLED. Its answers queue behind what waits, in order;
            # one that reads nothing has them dropped past Limits.backlog_messages/bytes, as any peer.)
            if len(frames) < 2:
                budget.take(size)
                continue
            out = self.gateway.received(frames[0], frames[1:], now=now.mono, user=user)
            self._out += out
            # (an ACK or NACK touches a record per key: the turn's records bound its commit and flush)
            budget.take(size, records=wire.records_of(frames))
        if came:
            self._again = True  # (cleared by the work, if it comes after in this turn)
            if self.gateway.known_connections(came):
                return  # (each over the connection already mapped to it: nothing the monitor says changes that)
            # Connections that closed before these commands came are known gone first (a descriptor may be
            # reused); one the monitor does not know open is not mapped (its consumer goes when silent).
            self.binder.drain_events(self.sock)
            open_fds = self.binder.open_fds.get(self.sock, set())
            for peer, fd, user in came:
                self.gateway.connection(peer, fd if fd in open_fds else -1, user)

    def work(self, now: Now) -> None:
        self._again = False
        due = self.gateway.next_sweep()
        if due is not None and now.mono >= due:
            self.gateway.sweep(now.mono)
        # A chunk at a time (Limits.turn_chunk), each drawn on the turn's budget, as the native endpoint's
        while self.gateway.would_send() and (most := self.budget.records_for(self.limits.turn_chunk)):
            # (their bodies draw on the turn's bytes, as the send socket's: reading them back costs ~1 ms a MiB)
            most_bytes = max(self.budget.bytes_left, 1)
            self._out += self.gateway.dispatch(now=now, most=most, blocked=self._blocked, most_bytes=most_bytes)
            done = self.gateway.dispatched
            self.budget.take(self.gateway.dispatched_bytes, records=done)
            if done < most or self.budget.bytes_left <= 0:  # nothing more now (no credit, nothing ready, pipes full)
                return

    def _blocked(self, peer: bytes) -> bool:
        """Serve ``peer`` nothing now: its answers wait unread, or it has never shown it reads and
        everything pzq holds is at the big replies' ceiling. What else it may be handed is the broker's
        byte account's to say (its share, and the ceiling for deliveries, past which only a consumer that
        holds nothing gets one message): a consumer that acked all it got drains past the ceiling, while
        new consumers that never read one DELIVER cannot each take one more past it and raise the alarm
        that refuses every producer (12 of them did)."""
        if self.replies.blocked(peer):
            self._held_back.add(peer)
            return True
        consumer = self.gateway.consumers.get(peer)
        if consumer is not None and consumer.reader:
            return False
        return not self.alarm.admit(0, self.limits.consume_batch_bytes)

    def waiting(self) -> bool:
        return any(out.kind in _ANSWERED_AFTER_COMMIT for out in self._out)

    def rolled_back(self) -> None:
        self._out = self.gateway.rolled_back(self._out)

    holds_output = True

    def hold(self, commit: int) -> None:
        self._held.hold(commit, self._out)
        self._out = []

    def release(self, durable: int) -> None:
        self._out = self._held.release(durable, self._out)

    def flush(self, now: Now) -> None:
        self.replies.flush()
        outs, self._out = self._out, []
        for out in outs:
            gone = self.replies.gone_total
            self.replies.send(out.frames)
            if out.kind != wire.DELIVER:
                continue
            if self.replies.gone_total != gone:  # (its consumer disconnected: the batch goes back)
                self.gateway.unsent(out)
        if self._held_back:  # (those still blocked are tried again with the backlog: Replies.wake_at)
            self._again |= any(not self.replies.blocked(peer) for peer in self._held_back)
            self._held_back.clear()

    def revoked(self, users: set[str]) -> None:
        # (their commands are dropped by the gate already; this stops deliveries to them)
        gone = self.gateway.revoke(users)
        if gone:
            log.warning("batched consumers: %d of revoked CURVE keys forgotten, their deliveries requeued", gone)

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        if lost.get("consume"):
            self.revoked(lost["consume"])

    def wake_at(self, now: float) -> float | None:
        if self._again and self.gateway.would_send():
            return now
        wakes = [t for t in (self.replies.wake_at(now), self.gateway.next_sweep()) if t is not None]
        return min(wakes) if wakes else None

    def stats(self) -> dict:
        return self.gateway.stats()

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """Its batched consumers, all of one queue, with their connections' peer addresses and when they
        connected (TCP: what the socket monitor told of each connection; ipc:// names none)."""
        rows, total = self.gateway.queue_consumers(queue, limit)
        for row in rows:
            row["address"], row["connected_us"] = self.binder.peer(self.sock, row.pop("fd", -1))
        return rows, total

    def memory(self) -> dict[str, int]:
        return {"consume_backlogs": self.replies.backlog_bytes}
