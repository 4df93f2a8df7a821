"""The native PZQ endpoints: producers on the receive ROUTER, consumers on the send DEALER.

A thin adapter: it reads each socket's run of messages within its share and the turn's budget, feeds the run to the
NativeGateway, and sends what the gateway answers after the commit (replies through a backlog that never
drops one silently; deliveries through the DEALER, handing back those it would not take).
"""

from __future__ import annotations

import collections
import logging
import time

import zmq

from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive
from pzq.endpoints.replies import Replies
from pzq.gateways.contract import Send
from pzq.gateways.native import RECEIVE, SEND, NativeGateway
from pzq.protocols.native_batch import MARK, announced
from pzq.zmqio import NOBLOCK, POLLIN, POLLOUT, Again, events, send_frames

log = logging.getLogger("pzq.server")

RUN_CHUNK = 256  # messages read and decoded between two looks at the turn's budget
ACKS_UNREAD = 10_000  # acks a producer may leave unread in its pipe before they wait in our backlog
_ROLES = {RECEIVE: "producer", SEND: "consumer"}
# Big messages (past what a turn may still let in) read and held at once, each for a turn of its own: past
# two, reading stops, so what a turn holds is bounded and a small message is never behind more than one
HELD_BIG = 2


class NativeEndpoints(Endpoint):
    """Binds the receive and send sockets and carries runs of messages between them and the gateway."""

    name = "native"

    def __init__(self, config: Config, gateway: NativeGateway, binder: Sockets):
        self.limits = config.limits  # (read_batch, turn_bytes: each socket's share of a turn)
        self.gateway = gateway
        # Bigger messages are refused by libzmq before they are buffered (the peer is disconnected).
        self.receive = binder.bind(
            zmq.ROUTER,
            config.receive_dsn,
            "--receive-dsn",
            # (a batch's bodies frame may be bigger than one message: Limits.batch_max_bytes)
            MAXMSGSIZE=max(config.max_message_size, config.limits.batch_max_bytes) + 4096,
            SNDHWM=ACKS_UNREAD,  # a pipelining producer's acks fit in its pipe (~100 bytes each)
            # A producer's window of messages waits here until a turn reads it (every turn does, within
            # its budget): about Limits.pipe_in_bytes of its biggest messages (docs/limits.md, "Memory
            # bound"); the rest of its window waits in its own process
            RCVHWM=config.limits.pipe_messages(config.max_message_size + 4096, 1000),
            LINGER=2000,
        )  # let the last acks out on shutdown
        self.replies = Replies(self.receive, "producer", config.limits)
        # LINGER 0: unsent deliveries are still stored, nothing to flush.
        # SNDHWM: deliveries in flight are at most --max-inflight (a delivery is in flight from its send);
        # RCVHWM: consumers' acks and nacks (a few dozen bytes each), read every turn.
        self.send = binder.bind(
            zmq.DEALER, config.send_dsn, "--send-dsn", SNDHWM=max(config.max_inflight, 1000), RCVHWM=10_000
        )
        self.sockets = [self.receive, self.send]
        self.binder = binder
        self._gates = {RECEIVE: binder.gate(self.receive), SEND: binder.gate(self.send)}
        self._replies: list[Send] = []  # answers to producers: they wait for the commit
        self._deliveries: list[Send] = []  # they leave after the turn's commit, whether or not it wrote
        # Messages read but left for later turns, in order: each big one (more than the turn could still let
        # in) gets a turn of its own, with the messages its producer sent after it (they keep its order)
        self._held: collections.deque[tuple[list[bytes], bool]] = collections.deque()
        self._held_from: set[bytes] = set()  # producers with a held message: their next ones wait behind it
        self._held_big = 0
        self._due = False  # the next turn is the oldest held big message's own
        self._first = RECEIVE  # the socket read first: the other one when a turn's budget cut this one short

    def before_poll(self, poller: zmq.Poller) -> None:
        want_out = self.gateway.would_send(time.monotonic())
        poller.modify(self.send, POLLIN | (POLLOUT if want_out else 0))

    def read(self, ready: dict, now: float, now_us: int) -> None:
        if self._due:  # a big message an earlier turn read and held: a turn of its own
            self._due = False
            self._commit_held(now, now_us)
            return
        self._release_held(now, now_us)
        self._read(ready, now, now_us)
        # Turns with a held big message and turns that read alternate, so that a small message read after
        # the big one (another producer's) is committed first, and one sent during its commit is read next
        if self._held:
            if self.budget.let_in:
                self._due = True
                self.budget.bytes_left = min(self.budget.bytes_left, 0)  # (the loop goes on at once)
            else:  # nothing else in this turn: the big message has it to itself already
                self._commit_held(now, now_us)

    def _commit_held(self, now: float, now_us: int) -> None:
        """Let in the oldest held big message alone (the messages behind it go first the next turn)."""
        frames, _ = self._held.popleft()
        self._held_big -= 1
        self._held_from = {held[0] for held, _ in self._held}
        self.budget.take(sum(map(len, frames)))
        self.budget.bytes_left = min(self.budget.bytes_left, 0)  # (what else waits, waits for the next turn)
        self._replies += self.gateway.received_many(RECEIVE, [frames], now=now, now_us=now_us)

    def _release_held(self, now: float, now_us: int) -> None:
        """Let in the held messages before the next big one: they were sent after a big one now stored."""
        run: list[list[bytes]] = []
        while self._held and not self._held[0][1]:
            run.append(self._held.popleft()[0])
        if run:
            self._held_from = {held[0] for held, _ in self._held}
            self.budget.take(sum(len(f) for frames in run for f in frames))
            self._replies += self.gateway.received_many(RECEIVE, run, now=now, now_us=now_us)

    def _read(self, ready: dict, now: float, now_us: int) -> None:
        names = [RECEIVE, SEND] if self._first == RECEIVE else [SEND, RECEIVE]
        for name in names:
            if name == RECEIVE and self.receive not in ready or name == SEND and not ready.get(self.send, 0) & POLLIN:
                continue
            # Each socket's share: read_batch messages, turn_bytes bytes; the turn's budget may end it first.
            count, share = self.limits.read_batch, self.limits.turn_bytes
            while count > 0 and share > 0:
                run, read, size = self._run(name, min(count, RUN_CHUNK), share)
                if not read:
                    break
                count, share = count - read, share - size
                # (decoded a chunk at a time, so that the budget's clock sees the decoding too)
                if run:
                    self._replies += self.gateway.received_many(name, run, now=now, now_us=now_us)
            if self.budget.spent():  # cut short: the other socket goes first next time
                self._first = SEND if name == RECEIVE else RECEIVE
                return

    def _run(self, name: str, most: int, share: int) -> tuple[list[list[bytes]], int, int]:
        """The messages waiting on socket ``name``, up to ``most`` messages and ``share`` bytes, and no
        further than the turn's budget; how many were read (some may be refused) and their size."""
        sock, gate, role = (self.receive if name == RECEIVE else self.send), self._gates[name], _ROLES[name]
        replies = self.replies if name == RECEIVE else None
        budget, batch_most = self.budget, self.limits.batch_max_messages
        run: list[list[bytes]] = []
        read = size = 0
        for _ in range(most):
            if size >= share or budget.spent() or self._held_big >= HELD_BIG:
                break
            try:
                frames = receive(sock, gate, role, NOBLOCK)
            except Again:
                break
            read += 1
            if frames is None:
                continue
            length = sum(map(len, frames))
            size += length
            # Its answers cannot leave: store nothing more for it. Unanswered, it is the peer's to resend.
            if replies is not None and replies.refuses(frames[0], "its messages are discarded unstored"):
                budget.take(length)
                continue
            if replies is not None and (length > budget.bytes_left or frames[0] in self._held_from):
                # More than the turn may still let in: this message is committed in a turn of its own, so
                # that what this turn takes in (another producer's small message) does not wait for its
                # write; its producer's next messages wait behind it, in order.
                big = length > budget.bytes_left
                size -= length if big else 0  # (not let in this turn: it leaves the socket's share to others)
                self._held.append((frames, big))
                self._held_from.add(frames[0])
                self._held_big += big
                if self._held_big >= HELD_BIG:
                    break
                continue
            # (a batch draws its messages on the turn's records, as the same messages one by one would)
            budget.take(length, 1 if len(frames) < 3 or frames[2] != MARK else announced(frames, batch_most))
            run.append(frames)
        return run, read, size

    def work(self, now: float, now_us: int) -> None:
        # A run at a time (Limits.turn_chunk), each drawn on the turn's budget: a thousand deliveries (or
        # take-backs) in one call held a turn 25 ms past its budget, and their sends after the commit more
        blocked = frozenset() if events(self.send) & POLLOUT else frozenset({SEND})
        while most := self.budget.records_for(self.limits.turn_chunk):
            self._deliveries += self.gateway.dispatch(now=now, now_us=now_us, blocked=blocked, most=most)
            done = self.gateway.dispatched
            self.budget.take(records=done)
            if done < most:  # nothing more to do now (no credit, nothing ready)
                return

    def waiting(self) -> bool:
        return bool(self._replies)

    def wake_at(self, now: float) -> float | None:
        wakes = [t for t in (self.replies.wake_at(now), self.gateway.next_wake(now)) if t is not None]
        return min(wakes) if wakes else None

    def revoked(self, users: set[str]) -> None:
        # The DEALER hands deliveries to every connected consumer in turn and cannot skip one: re-bind
        # it, so that every consumer connects again and a revoked key fails its handshake. What was in
        # flight stays in flight (the consumers that hold it may still ack it) until its ack timeout.
        if self._gates[SEND] is not None:
            self.send = self.binder.rebind(self.send)
            self.sockets = [self.receive, self.send]
            log.warning("send socket re-bound: consumers reconnect, those of revoked CURVE keys cannot")

    def recover(self) -> None:
        self.gateway.recover()

    def stats(self) -> dict:
        return self.gateway.stats()

    def memory(self) -> dict[str, int]:
        return {"native_backlogs": self.replies.backlog_bytes}

    def rolled_back(self) -> None:
        out = self.gateway.rolled_back(self._replies + self._deliveries)
        self._replies = [s for s in out if s.socket == RECEIVE]
        self._deliveries = [s for s in out if s.socket != RECEIVE]

    def flush(self, now: float, now_us: int) -> None:
        self.replies.flush()
        replies, self._replies = self._replies, []
        for send in replies:
            self.replies.send(send.frames)
        deliveries, self._deliveries = self._deliveries, []
        for i, send in enumerate(deliveries):
            try:
                send_frames(self.send, send.frames, NOBLOCK)
            except Again:
                # The last consumer left between the writability check and now: the rest goes back.
                kept = self.gateway.unsent_many(deliveries[i:])
                self._deliveries = kept
                return
