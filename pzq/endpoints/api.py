"""The API endpoint: request/reply for the Spark connector, answered by the API gateway."""

from __future__ import annotations

import collections
import time

import zmq

from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_with_fd
from pzq.endpoints.replies import Replies
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import ONLY, Send
from pzq.protocols import api as api_proto
from pzq.zmqio import NOBLOCK, Again, keep_big_frames

# Limits.api_turn_work_s: the time one turn spends carrying out API requests before it lets others in;
# Limits.api_replies_unread: replies (up to api_reply_bytes each) waiting in one client's pipe.
BIG_REPLIES = (b"SNAPSHOT", b"FETCH")  # commands whose reply may be api_reply_bytes and a message
# Read-only commands whose reply is weighed once built (WHERE of a list of 1,024 shards: ~113 KB): past
# WEIGHED_FROM bytes it is sent only if the memory bound has room for it, else ERR busy (nothing was done)
WEIGHED = (b"WHERE",)
WEIGHED_FROM = 64 << 10
# Commands that write nothing a client is told of: their replies need no commit of their own. (What they
# return was durable before: a lease or a message is committed before the reply that tells of it.)
# (WHERE too: names and counts, asked of every shard every few seconds a queue by each cluster client; a
# depth it tells that is not committed yet is a figure, as the monitor's, not a promise)
READ_ONLY = (b"SNAPSHOT", b"FETCH", b"WHERE")
REQUESTS_UNREAD = 16  # requests waiting in one client's pipe (each up to a PRODUCE's size: see docs/limits.md)
COMMANDS_KEPT = 32  # commands whose cost is remembered (unknown ones are refused anyway)
TAGS_KEPT = 4096  # peers whose tags are remembered while they have nothing waiting
PENDING = 256  # requests read and not yet carried out, all clients together (and a turn's share of bytes)
BIG_FRAME = 64 << 10  # frames of this size and more stay in libzmq's buffer (a big PRODUCE's body: no copy)
# Each client's own share of them: Limits.api_pending_per_peer requests and api_pending_peer_bytes.


class ApiEndpoint(Endpoint):
    """Every reply leaves after the commit of what its request changed.

    Requests are taken in as they come (up to PENDING requests or a turn's share of bytes), and carried
    out within the turn's budget, the rest first next turn: so that a client that sends a request before
    it has read the answer to its last is seen doing so (the memory bound counts its unread replies,
    pzq/endpoints/memory.py), however slowly the loop gets round to its requests.

    Fair between clients: each client's requests wait in a queue of its own, and the queues share the
    loop's time by start-time fair queueing (the client whose requests have cost least goes next; an idle
    client saves no credit), so a lock-step client of cheap requests is served before a crowd of clients
    of costly ones, and requests left when the turn's budget ends go on next turn in the same order. A
    client that has its share of requests waiting (Limits.api_pending_per_peer, api_pending_peer_bytes)
    gets ``ERR busy`` for any more, nothing done (libzmq's ROUTER cannot stop reading one peer), so that
    a client pipelining hundreds of requests cannot make another's wait behind them all.

    A PRODUCE of one big message is written a part per turn (``work``: gateways/parted.py); its client's
    next requests wait in its queue until it is answered, in order."""

    name = "api"

    def __init__(self, config: Config, gateway: ApiGateway, binder: Sockets):
        self.limits = config.limits  # (read_batch, turn_bytes: each socket's share of a turn)
        self.gateway = gateway
        self.turn_work_s = config.limits.api_turn_work_s
        self.sock = binder.bind(
            zmq.ROUTER,
            config.api_dsn,
            "--api-dsn",
            MAXMSGSIZE=config.limits.frame_bytes(config.max_message_size) + (8 << 20),  # (read to be refused)
            SNDHWM=config.limits.api_replies_unread,  # replies may be MiBs: few wait in a client's pipe
            # (a lock-step client sends one at a time; a PRODUCE may be MiBs: Limits.pipe_in_bytes of them)
            RCVHWM=config.limits.pipe_messages(config.max_message_size + (8 << 20), REQUESTS_UNREAD),
        )
        self.sockets = [self.sock]
        keep_big_frames(self.sock, BIG_FRAME)
        self.replies = Replies(self.sock, "api", config.limits, pipes=True)
        binder.on_disconnect[self.sock] = self.replies.disconnected
        # A big reply is about this big (it stops growing past api_reply_bytes of bodies).
        self.big_reply = config.limits.api_reply_bytes + (64 << 10)
        self._gate = binder.gate(self.sock)
        self.binder = binder
        self._out: list[Send] = []
        # Requests waiting, one queue per peer, served by start-time fair queueing on the loop's time:
        # each peer's tag is the time its requests have cost so far, never behind the tag of the request
        # last served (``_now_tag``: an idle peer saves no credit), and the lowest tag plus what its next
        # request is likely to cost (``_costs``: each command's recent cost) goes next. So a lock-step
        # client of cheap requests goes before clients of 10 ms SNAPSHOTs however many of them came at
        # once, and pipelining buys nothing.
        self._queues: dict[bytes, collections.deque[tuple[list[bytes], str | None]]] = {}
        self._tags: dict[bytes, float] = {}
        self._now_tag = 0.0
        self._costs: dict[bytes, float] = {}  # each command's recent cost on the loop (a moving average)
        self._peer_bytes: dict[bytes, int] = {}
        self._pending = 0
        self._pending_bytes = 0
        self.most_per_peer = config.limits.api_pending_per_peer
        self.most_bytes_per_peer = config.limits.api_pending_peer_bytes
        self.refused_busy = 0  # requests past their client's share, answered ERR busy
        self._granted: dict[bytes, int] = {}  # big replies admitted this turn, not sent yet, per peer
        self._writes = False  # a reply of this turn tells of a write: it waits for the commit

    def read(self, ready: dict, now: Now) -> None:
        if self.sock in ready:
            self._take_in()
        started = time.perf_counter()
        while self._pending:
            # One LEASE or PRODUCE may take a while: after turn_work_s of them, the rest wait for the
            # next turn, so that pipelined requests cannot hold every other client for seconds.
            if time.perf_counter() - started > self.turn_work_s or self.budget.spent():
                return
            request = self._next()
            if request is None:  # (every client with requests waiting has a big message being written)
                return
            frames, user = request
            size = sum(map(len, frames))
            self.budget.take(size)  # (the turn's budget, shared by every endpoint)
            if _big(frames) and not self._room_for_big_reply(frames[0]):
                self._out.append(Send(ONLY, _memory_busy(frames, self.alarm.total)))
                continue
            began = time.perf_counter()
            command = _command(frames)
            sends = self.gateway.received(ONLY, frames, now=now, user=user)
            if command in WEIGHED and not self._room_for_reply(frames[0], sends):
                sends = [Send(ONLY, _memory_busy(frames, self.alarm.total))]
            self._out += sends
            cost = time.perf_counter() - began
            self._tags[frames[0]] = self._now_tag + cost
            # (a LEASE with durable 0 is answered at once: its writes gather as consumer acks do)
            self._writes = self._writes or (command not in READ_ONLY and getattr(self.gateway, "reply_waits", True))
            if command in self._costs or len(self._costs) < COMMANDS_KEPT:
                self._costs[command] = 0.8 * self._costs.get(command, cost) + 0.2 * cost

    def _take_in(self) -> None:
        """Read what waits, without decoding it: up to PENDING requests and a turn's share of bytes."""
        came: list[tuple[bytes, int]] = []  # (peer, descriptor of its connection) of each request
        # Read on when the waiting pool is full (a turn's share of bytes at most): a client with nothing
        # waiting must still be found among them (it is let in past the pool: room for one each).
        read = 0
        for _ in range(self.limits.read_batch):
            if read >= self.limits.turn_bytes:
                break
            try:  # the client's key goes with the request: consumer groups belong to one key
                frames, user, fd = receive_with_fd(self.sock, self._gate, "api", NOBLOCK)
            except Again:
                break
            if frames is None:
                continue
            read += sum(map(len, frames))
            if self.replies.refuses(frames[0], "its requests are dropped unanswered (it resends)"):
                continue
            came.append((frames[0], fd))
            if not self._queue(frames, user):
                self.refused_busy += 1
                busy = _busy(frames, "its share of requests waiting, or the server its requests' (PENDING)")
                if busy is not None:
                    self._out.append(Send(ONLY, busy))
        if not came:
            return
        # Every connection that closed before these requests came is known gone first (its descriptor
        # may be the one a request came over now); a request over a descriptor the monitor does not
        # know open came from a connection gone since (its replies will find nobody: EHOSTUNREACH).
        self.binder.drain_events(self.sock)
        open_fds = self.binder.open_fds.get(self.sock, set())
        for peer, fd in came:
            self.replies.read(peer, fd if fd in open_fds else -1)

    def _queue(self, frames: list[bytes], user: str | None) -> bool:
        """Put a request in its peer's queue, or False when the peer has its share waiting already, or
        the pool of every peer's is full. A peer with none waiting always has room for one, however big
        (a PRODUCE may be MiBs), so that a lock-step client is never refused for what others sent: the
        pool may hold one more per peer (whose requests libzmq's pipes would hold anyway)."""
        peer, size = frames[0], sum(map(len, frames))
        queue = self._queues.get(peer)
        if queue is None:
            queue = self._queues[peer] = collections.deque()
            self._tags[peer] = max(self._tags.get(peer, 0.0), self._now_tag)
        elif (
            len(queue) >= self.most_per_peer
            or self._peer_bytes[peer] >= self.most_bytes_per_peer
            or self._pending >= PENDING
            or self._pending_bytes >= self.limits.turn_bytes
        ):
            return False
        queue.append((frames, user))
        self._peer_bytes[peer] = self._peer_bytes.get(peer, 0) + size
        self._pending += 1
        self._pending_bytes += size
        return True

    def _next(self) -> tuple[list[bytes], str | None] | None:
        """The next request: the oldest of the peer with the lowest tag (see __init__), of the peers
        without a big message being written (None when there is none)."""
        tags, costs, busy = self._tags, self._costs, self.gateway.parts.busy
        queues = self._queues
        ready = [p for p in queues if not busy(p)] if self.gateway.parts.pending else queues
        if not ready:
            return None
        peer = min(ready, key=lambda p: (tags[p] + costs.get(_command(queues[p][0][0]), 0.0), len(queues[p])))
        self._now_tag = tags[peer]
        queue = queues[peer]
        frames, user = queue.popleft()
        size = sum(map(len, frames))
        self._pending -= 1
        self._pending_bytes -= size
        if queue:
            self._peer_bytes[peer] -= size
        else:
            del queues[peer], self._peer_bytes[peer]
            if len(tags) > TAGS_KEPT:  # (a tag at or behind _now_tag says nothing: forget those first)
                self._tags = {p: t for p, t in tags.items() if t > self._now_tag or p in queues}
                if len(self._tags) > TAGS_KEPT:
                    self._tags = {p: t for p, t in self._tags.items() if p in queues}
        return frames, user

    def _room_for_big_reply(self, peer: bytes, size: int = 0) -> bool:
        """A SNAPSHOT or FETCH is carried out only if its reply (``size``: the biggest it may be) finds
        room: the client's unread replies under its share, and the memory bound's ceiling (see
        MemoryAlarm.admit)."""
        size = size or self.big_reply
        granted = self._granted.get(peer, 0)
        if not self.alarm.admit(self.replies.held(peer) + granted, size):
            return False
        self._granted[peer] = granted + size
        return True

    def _room_for_reply(self, peer: bytes, sends: list[Send]) -> bool:
        """A WHERE's reply, built, is sent if it is small or finds room as a SNAPSHOT's would: so that
        clients asking and never reading cannot hold its answers past the memory bound."""
        size = sum(len(frame) for send in sends for frame in send.frames)
        return size < WEIGHED_FROM or self._room_for_big_reply(peer, size)

    def work(self, now: Now) -> None:
        if self.gateway.parts.pending:  # big PRODUCEs, a part per turn (gateways/parted.py)
            self._out += self.gateway.parts.step(self.budget, now.wall_us)

    def memory(self) -> dict[str, int]:
        return {
            "api_big": self.gateway.parts.held_bytes,
            "api_requests": self._pending_bytes,
            "api_backlogs": self.replies.backlog_bytes,
            "api_pipes": self.replies.pipe_bytes(),
            "api_pipes_unconfirmed": self.replies.unconfirmed_bytes(),  # (room kept for it, not held)
        }

    def waiting(self) -> bool:
        """Replies wait for the commit when one of them tells of a write (LEASE, ACK_UPTO, PRODUCE...).
        FETCH and SNAPSHOT replies alone do not make the turn commit: while acknowledged messages are
        deleted a share a turn, a streaming read's every FETCH would otherwise wait for an fsync of
        those deletions (which gather for --commit-interval instead, as consumer acks do)."""
        return self._writes or self.gateway.parts.writing

    def rolled_back(self) -> None:
        out, self._out = self._out, []
        self._out = self.gateway.rolled_back(out) + self.gateway.parts.rolled_back()

    def recover(self) -> None:
        self.gateway.recover()

    def output_waiting(self) -> bool:
        return bool(self._out)

    def flush(self, now: Now) -> None:
        self._writes = False
        self.gateway.parts.flushed()
        self._granted.clear()  # (sent now: counted by the pipe estimate from here on)
        self.replies.flush()
        out, self._out = self._out, []
        for send in out:
            self.replies.send(send.frames)

    def wake_at(self, now: float) -> float | None:
        return now if self._pending or self.gateway.parts.pending else self.replies.wake_at(now)

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        # (``lost`` names the native sockets' keys; a group's right is on its own queue)
        self.gateway.narrow()  # (each group given back is logged)

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        return [{**table, "gateway": self.name} for table in self.gateway.clients(now, limit, offset)]

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return self.gateway.queue_consumers(queue, limit)

    def stats(self) -> dict:
        return {**self.gateway.stats(), **self.gateway.parts.stats(), "busy_refused": self.refused_busy}


def _command(frames: list[bytes]) -> bytes:
    """A request's command frame, read without decoding (b"" when it is not well-formed)."""
    return frames[-2] if len(frames) >= 5 and frames[-4] == b"" else b""


def _big(frames: list[bytes]) -> bool:
    """A well-formed SNAPSHOT or FETCH (routing, "", id, command, arguments), told from its command frame
    before anything is decoded."""
    return len(frames) >= 5 and frames[-4] == b"" and frames[-2] in BIG_REPLIES


def _memory_busy(frames: list[bytes], held: int) -> list[bytes]:
    """The ERR for a big request refused for want of memory (nothing was done: the client may retry)."""
    request = api_proto.Request(tuple(frames[:-4]), frames[-3], "", {})
    return api_proto.error(
        request,
        "busy",
        f"not now: pzq holds {held} bytes of replies that clients have not read, or this client's own unread "
        "replies are past its share; read your replies, try again later",
    )


def _busy(frames: list[bytes], why: str) -> list[bytes] | None:
    """The ERR for a request refused unread because its client has ``why`` (nothing was done: the client
    asks again); None for one that cannot be answered (no delimiter before its id, command and arguments)."""
    if len(frames) < 5 or frames[-4] != b"":
        return None
    request = api_proto.Request(tuple(frames[:-4]), frames[-3], "", {})
    return api_proto.error(request, "busy", f"not now: this client has {why}; read your replies, try again later")
