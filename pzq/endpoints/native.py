"""The native PZQ endpoints: producers on the receive ROUTER, consumers on the send DEALER.

A thin adapter: it reads each socket's run of messages within its share and the turn's budget, feeds the run to the
NativeGateway, and sends what the gateway answers after the commit (replies through a backlog that never
drops one silently; deliveries through the DEALER, those it would not take yet kept for its next turns,
and no more taken meanwhile). The send socket's pipes are short (SNDHWM from the pool's bytes, see
Limits.send_pipe_messages); while its pool has stale copies to release, the streams of its connections
are watched (pzq/endpoints/native_send.py).
"""

from __future__ import annotations

import collections
import logging
import operator
import select
import time

import zmq

from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive, receive_from
from pzq.endpoints.held import Held
from pzq.endpoints.native_held import HeldIn
from pzq.endpoints.native_send import SendWatch, consumers, drained
from pzq.endpoints.replies import Replies
from pzq.gateways.contract import Send
from pzq.gateways.native import RECEIVE, SEND, NativeGateway
from pzq.protocols import native as wire
from pzq.protocols.native_batch import KeyedFrames, is_batch, records_of
from pzq.zmqio import NOBLOCK, POLLIN, POLLOUT, Again, answer_cut, events, keep_big_frames, recv_frames, send_frames

log = logging.getLogger("pzq.server")

RUN_CHUNK = 256  # messages read and decoded between two looks at the turn's budget
# Acks a producer may leave unread in its pipe (SNDHWM): 2 MiB of acks echoing 1 KiB ids (10,000: 10 MiB)
ACKS_UNREAD = (2 << 20) // wire.MAX_ID
_ROLES = {RECEIVE: "producer", SEND: "consumer"}
BIG_FRAME = 64 << 10  # producers' frames of this size and more are not copied out of libzmq's buffer
# Deliveries the send socket took none of for this long go back to the queue (no consumer is connected, or
# none reads): they never left, and a batched consumer of the same queue may take them meanwhile
GIVE_BACK_S = 0.5
SEND_WAIT_TOTAL_S = 1e-3  # (in one flush at most)
_FRAMES = operator.attrgetter("frames")
# A consumer's answer is [key, status] (a 49-byte key): libzmq buffers a frame whole before pzq sees it,
# so a longer frame cuts its consumer off unread (a 500 MB one had cost 848 MiB)
ANSWER_FRAME = 4096


class NativeEndpoints(Endpoint):
    """Binds the receive and send sockets and carries runs of messages between them and the gateway."""

    name = "native"

    def __init__(self, config: Config, gateway: NativeGateway, binder: Sockets):
        self.limits = config.limits  # (read_batch, turn_bytes: each socket's share of a turn)
        self.gateway = gateway
        # Frames past --max-message-size, up to Limits.frame_answered, are read to be answered "too large"
        # (bigger ones libzmq refuses before they are buffered: the peer is cut off, as it always was).
        largest = max(config.max_message_size, config.limits.batch_max_bytes)  # (a batch's bodies frame)
        self.receive = binder.bind(
            zmq.ROUTER,
            config.receive_dsn,
            "--receive-dsn",
            MAXMSGSIZE=config.limits.frame_bytes(largest) + 4096,
            SNDHWM=ACKS_UNREAD,  # a pipelining producer's window of acks fits in its pipe
            # A producer's window of messages waits here until a turn reads it (every turn does, within
            # its budget): about Limits.pipe_in_bytes of the biggest messages it may store (docs/limits.md,
            # "Memory bound"); the rest of its window waits in its own process
            RCVHWM=(depth := config.limits.pipe_messages(config.max_message_size + 4096, 1000)),
            LINGER=2000,
        )  # let the last acks out on shutdown
        # (a message, not a batch, this big is refused whatever its envelope: see _run)
        self.refused_past = config.max_message_size + 4096
        self.depth = depth  # (a producer that filled its pipe has more coming: see _refilled)
        self._receive_fd = int(self.receive.getsockopt(zmq.FD))
        self.refill_waits = self.refills = 0  # (counts: how often a turn waited for a pipe's refill, and got it)
        self._dry = False  # the last _run stopped because its socket had nothing more (zmq.Again)
        self.replies = Replies(self.receive, "producer", config.limits)
        keep_big_frames(self.receive, BIG_FRAME)
        answer_cut(self.receive, wire.Cut)  # (a message past MAX_FRAMES frames is answered, not dropped unseen)
        # LINGER 0: unsent deliveries are still stored, nothing to flush.
        # SNDHWM: a pipe holds at most half the send pool's bytes of the largest messages (at least 16: a
        # consumer that stops reading holds its pipe, the others have the rest of the pool; Limits.native_send_*);
        # RCVHWM: consumers' acks and nacks (a few dozen bytes each, ANSWER_FRAME at most), read every turn.
        self.send = binder.bind(
            zmq.DEALER,
            config.send_dsn,
            "--send-dsn",
            SNDHWM=config.limits.send_pipe_messages(config.max_message_size + 4096),
            RCVHWM=10_000,
            MAXMSGSIZE=ANSWER_FRAME,
        )
        self.watch = SendWatch(binder, config.limits.native_send_stall_s)
        self.sockets = [self.receive, self.send]
        self.binder = binder
        self._gates = {RECEIVE: binder.gate(self.receive), SEND: binder.gate(self.send)}
        self._replies: list[Send] = []  # answers to producers: they wait for the commit
        self._deliveries: list[Send] = []  # they leave after the turn's commit, whether or not it wrote
        self._held_replies, self._held_deliveries = Held[Send](), Held[Send]()  # (till their commit is on disk)
        # Deliveries of earlier turns the send socket did not take yet (its pipes were full): sent first,
        # and nothing more is taken until they are out (a take the socket cannot carry was given back and
        # taken again, turn after turn: short pipes cost 75 % of the rate)
        self._waiting: list[Send] = []
        self._waiting_since = 0.0  # when the socket last took one of them, or they began to wait
        self.held = HeldIn(config.limits)  # messages read but left for later turns, in order
        self._due = False  # the next turn is the oldest held big message's own
        self._uploading = False  # the oldest held big message is being written, a part per turn
        self._first = RECEIVE  # the socket read first: the other one when a turn's budget cut this one short

    def before_poll(self, poller: zmq.Poller) -> None:
        want_out = bool(self._waiting) or self.gateway.would_send(time.monotonic())
        poller.modify(self.send, POLLIN | (POLLOUT if want_out else 0))

    def read(self, ready: dict, now: Now) -> None:
        if self._due:  # a big message an earlier turn read and held: a turn of its own
            self._due = False
            self._commit_held(now)
            return
        self._release_held(now)
        self._read(ready, now)
        # Turns with a held big message and turns that read alternate, so that a small message read after
        # the big one (another producer's) is committed first, and one sent during its commit is read next
        # (what waits at the head only for the next turn is let in by _release_held then)
        if (held := self.held.messages) and held[0][1]:  # (the oldest held is big; read inline: every turn)
            if self.budget.let_in:
                self._due = True
                self.budget.bytes_left = min(self.budget.bytes_left, 0)  # (the loop goes on at once)
            else:  # nothing else in this turn: the big message has it to itself already
                self._commit_held(now)

    def _commit_held(self, now: Now) -> None:
        """Let in the oldest held big message alone (the messages behind it go first the next turn): at
        once, or past one chunk a part per turn (``turn_write_bytes`` of it), its ack with the last."""
        frames = self.held.messages[0][0]
        size = sum(map(len, frames))
        if size <= self.limits.body_chunk_bytes or is_batch(frames):  # (a batch: whole)
            self._drop_held()
            self.budget.take(size)
            self._replies += self.gateway.received_many(RECEIVE, [frames], now=now)
        else:
            try:
                answer = self.gateway.received_big(
                    frames, chunk=self.limits.body_chunk_bytes, most=max(self.budget.bytes_left, 0), now_us=now.wall_us
                )
            except BaseException:
                self._drop_held()  # (the gateway answers it "store failure" when the turn is rolled back)
                raise
            self.budget.take(self.gateway.big_written)
            self._uploading = answer is None
            if answer is not None:
                self._drop_held()
                self._replies += answer
        self.budget.bytes_left = min(self.budget.bytes_left, 0)  # (what else waits, waits for the next turn)

    def _drop_held(self) -> None:
        self.held.drop_first()
        self._uploading = False

    def _release_held(self, now: Now) -> None:
        """Let in the held messages before the next big one: they were sent after a big one now stored."""
        if not self.held.messages:  # (the usual turn: nothing held, no call)
            return
        if run := self.held.take_run():
            self.budget.take(sum(len(f) for frames in run for f in frames))
            self._replies += self.gateway.received_many(RECEIVE, run, now=now)

    def _read(self, ready: dict, now: Now) -> None:
        names = [RECEIVE, SEND] if self._first == RECEIVE else [SEND, RECEIVE]
        for name in names:
            if name == RECEIVE and self.receive not in ready or name == SEND and not ready.get(self.send, 0) & POLLIN:
                continue
            # Each socket's share: read_batch messages, turn_bytes bytes; the turn's budget may end it first.
            count, share = self.limits.read_batch, self.limits.turn_bytes
            since_dry: list[list[list[bytes]]] = []  # (the runs read since the socket last ran dry)
            refilling = False
            while count > 0 and share > 0:
                run, read, size = self._run(name, min(count, RUN_CHUNK), share)
                count, share = count - read, share - size  # (a chunk at a time: the budget's clock sees it)
                if run:
                    since_dry.append(run)
                    self._replies += self.gateway.received_many(name, run, now=now)
                if not self._dry:
                    if not read:  # (stopped by the budget, a share or what is held)
                        break
                    continue
                # The socket ran dry (no second read to find so: zmq.Again costs ~4 µs, more than a wait)
                if name != RECEIVE:
                    break
                refilling = refilling or self._filled(since_dry)
                since_dry = []
                # (not while messages are held: what a refill brings would only be held behind them)
                if not refilling or self.held.messages or self.budget.spent() or not self._refilled():
                    break
            if self.budget.spent():  # cut short: the other socket goes first next time
                self._first = SEND if name == RECEIVE else RECEIVE
                return

    def _filled(self, runs: list[list[list[bytes]]]) -> bool:
        """Whether one producer sent at least a pipe's depth of the messages read since the socket last
        ran dry: its pipe was full, so libzmq's I/O thread held the rest of its window back and refills
        the pipe now that the reader passed the low-water mark."""
        if sum(map(len, runs)) < self.depth:
            return False
        counts = collections.Counter(frames[0] for run in runs for frames in run)
        return max(counts.values(), default=0) >= self.depth

    def _refilled(self) -> bool:
        """Wait (a few tens of µs at most, no later than the turn's deadline) for libzmq's I/O thread to
        refill the receive socket's pipes; whether it did. Without it a pipe of ``depth`` messages (4 under
        a 16 MiB --max-message-size and 64 MiB pipes) cut every commit to a dozen messages of a pipelining
        producer."""
        self.refill_waits += 1
        sock, fd = self.receive, self._receive_fd
        deadline = min(time.monotonic() + self.limits.refill_wait_s, self.budget.deadline)
        while True:
            # The fd turns readable when libzmq's I/O thread tells the socket its pipe has messages again (at
            # once after a refill); ZMQ_EVENTS then takes that command and says whether a message waits
            left = deadline - time.monotonic()
            if select.select([fd], [], [], max(left, 0.0))[0] and events(sock) & POLLIN:
                self.refills += 1
                return True
            if left <= 0:
                return False

    def _run(self, name: str, most: int, share: int) -> tuple[list[list[bytes]], int, int]:
        """The messages waiting on socket ``name``, up to ``most`` messages and ``share`` bytes, and no
        further than the turn's budget; how many were read (some may be refused) and their size."""
        sock, gate, role = (self.receive if name == RECEIVE else self.send), self._gates[name], _ROLES[name]
        replies = self.replies if name == RECEIVE else None
        budget, batch_most, held_most = self.budget, self.limits.batch_max_messages, self.limits.held_in_bytes
        held = self.held
        behind_most = whole = self.limits.turn_write_bytes
        refused_past = self.refused_past
        run: list[list[bytes]] = []
        read = size = 0
        self._dry = False
        for _ in range(most):
            if size >= share or budget.spent() or held.bytes >= held_most:
                break
            if held.behind >= behind_most and held.waits_a_turn(behind_most):  # (the usual case: nothing held)
                break
            frames: list[bytes] | None
            try:
                if gate is None:  # (without CURVE, straight to the frames: a call less for every message)
                    frames = recv_frames(sock, NOBLOCK)
                elif replies is None:
                    frames = receive(sock, gate, role, NOBLOCK)
                else:  # (a producer's CURVE key names the namespace of its batch ids)
                    frames, key = receive_from(sock, gate, role, NOBLOCK)
                    if frames is not None and key and is_batch(frames):
                        frames = KeyedFrames(frames, key)
            except Again:
                self._dry = True
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
            if length > refused_past and replies is not None and not is_batch(frames):
                # Past --max-message-size (a batch has its own cap, checked when it is let in): the gateway
                # answers it "too large" and stores nothing, so it is neither held nor drawn on the turn's
                # bytes, and the producer hears at once (a client upgraded past the old default of 16 MiB)
                budget.take(0)
                run.append(frames)
                continue
            if replies is not None and (length > budget.bytes_left or frames[0] in held.by_peer):
                # More than the turn may still let in. Past a whole turn's bytes, it is big: committed in turns
                # of its own, so that another producer's small message does not wait for its write; a smaller
                # one waits for the next turn (one held for a turn of its own cost a producer of 256 KiB
                # messages a turn each). Either way its producer's next messages wait behind it, in order.
                big = length > whole
                size -= length if big else 0  # (not let in this turn: it leaves the socket's share to others)
                if (answers := held.busy(frames, length)) is not None:
                    self._replies += [Send(RECEIVE, answer) for answer in answers]
                    continue
                held.hold(frames, big, length)
                if held.bytes >= held_most or held.waits_a_turn(behind_most):
                    break
                continue
            # (a batch draws its messages on the turn's records, as the same messages one by one would)
            budget.take(length, records_of(frames, batch_most))
            run.append(frames)
        return run, read, size

    def work(self, now: Now) -> None:
        if self._waiting:  # (what the socket could not take yet goes first: nothing more until it has)
            return
        # A run at a time (Limits.turn_chunk), each drawn on the turn's budget: a thousand deliveries (or
        # take-backs) in one call held a turn 25 ms past its budget, and their sends after the commit more
        blocked = frozenset() if events(self.send) & POLLOUT else frozenset({SEND})
        # Their bodies draw on the turn's bytes too: reading 16 MiB bodies back costs ~1 ms a MiB
        while most := self.budget.records_for(self.limits.turn_chunk):
            most_bytes = max(self.budget.bytes_left, 1)
            self._deliveries += self.gateway.dispatch(now=now, blocked=blocked, most=most, most_bytes=most_bytes)
            done = self.gateway.dispatched
            self.budget.take(self.gateway.dispatched_bytes, records=done)
            if done < most:  # nothing more to do now (no credit, nothing ready)
                return

    def waiting(self) -> bool:
        # (a big message's part written this turn: committed now, so that no commit carries more)
        return bool(self._replies) or self._uploading

    def wake_at(self, now: float) -> float | None:
        give_back = self._waiting_since + GIVE_BACK_S if self._waiting else None
        wakes = [t for t in (self.replies.wake_at(now), self.gateway.next_wake(now), give_back) if t is not None]
        return min(wakes) if wakes else None

    def revoked(self, users: set[str]) -> None:
        # The DEALER hands deliveries to every connected consumer in turn and cannot skip one: re-bind
        # it, so that every consumer connects again and a revoked key fails its handshake. What was in
        # flight stays in flight (the consumers that hold it may still ack it) until its ack timeout.
        if self._gates[SEND] is not None:
            self.send = self.binder.rebind(self.send)
            self.sockets = [self.receive, self.send]
            log.warning("send socket re-bound: consumers reconnect, those of revoked CURVE keys cannot")

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        # (a producer that lost its right is cut off by the receive socket's gate, message by message)
        if lost.get("send"):
            self.revoked(lost["send"])

    holds_output = True

    def hold(self, commit: int) -> None:
        self._held_replies.hold(commit, self._replies)
        self._held_deliveries.hold(commit, self._deliveries)
        self._replies, self._deliveries = [], []

    def release(self, durable: int) -> None:
        self._replies = self._held_replies.release(durable, self._replies)
        self._deliveries = self._held_deliveries.release(durable, self._deliveries)

    def recover(self) -> None:
        self._waiting = []  # (the broker may have forgotten them: taken again, they would leave twice)
        # (held deliveries of earlier turns stay in flight after a failed commit: those the broker forgot go)
        self._held_deliveries.keep(self.gateway.sendable)
        self.gateway.recover()

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        """The send socket's connections as the native queue's consumers (native_send.py's ``consumers``)."""
        return consumers(self.binder.peers.get(self.send, {}), limit) if queue == self.gateway.queue else ([], 0)

    def stats(self) -> dict:
        return {
            **self.gateway.stats(),
            "busy_refused_total": self.held.busy_refused_total,
            "send_pipe_messages": self.send.getsockopt(zmq.SNDHWM),
            "send_waiting": len(self._waiting),
            "send_stalled_cut_total": self.watch.cut_total,
        }

    def memory(self) -> dict[str, int]:
        return {"native_backlogs": self.replies.backlog_bytes, "native_held": self.held.bytes}

    def rolled_back(self) -> None:
        if self._uploading:  # (its parts are gone with the turn: the gateway answers it "store failure")
            self._drop_held()
        out = self.gateway.rolled_back(self._replies + self._deliveries)
        self._replies = [s for s in out if s.socket == RECEIVE]
        self._deliveries = [s for s in out if s.socket != RECEIVE]

    def flush(self, now: Now) -> None:
        self.replies.flush()
        replies, self._replies = self._replies, []
        self.replies.send_many(map(_FRAMES, replies))
        deliveries, self._deliveries = self._deliveries, []
        if self._waiting:
            deliveries, self._waiting = self.gateway.sendable(self._waiting) + deliveries, []
        sock, i, until = self.send, 0, time.monotonic() + SEND_WAIT_TOTAL_S
        while i < len(deliveries):
            try:
                send_frames(sock, deliveries[i].frames, NOBLOCK)
                i += 1
                continue
            except Again:
                if drained(sock, until):
                    continue
                # Every pipe is full (or no consumer is connected): the rest waits for room, still in flight
                # (its ack timeout runs from its take, so a delivery that waits past it is not sent)
                if i or not self._waiting_since:
                    self._waiting_since = now.mono
                if now.mono - self._waiting_since < GIVE_BACK_S:
                    self._waiting = deliveries[i:]
                else:  # (nobody took any for a while: back to the queue, known never to have left)
                    self._deliveries = self.gateway.unsent_many(deliveries[i:])
                    self._waiting_since = 0.0
                break
        else:
            self._waiting_since = 0.0
        if self.gateway.pool.look_due(now.mono):
            streams = self.watch.streams(self.send, now.mono)
            self.gateway.pool.look(now.mono, streams, closable=not self._waiting)
