"""The monitor endpoint: REQ clients asking MONITOR, STATS and the admin requests (pzq/admin/)."""

from __future__ import annotations

import logging
import time

import zmq

from pzq.admin import Admin
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_with_fd
from pzq.endpoints.replies import Replies
from pzq.permissions import CONSUME, MANAGE, PRODUCE, Permissions
from pzq.protocols import monitor as monitor_proto

log = logging.getLogger("pzq.server")

READ_BATCH = 64
SNAPSHOT_READS = frozenset({"PEEK", "DEAD"})
PAGES = frozenset({"QUEUE", "PEEK", "DEAD", "CLIENTS"})  # reads whose replies may be big (~1.5 MB a page)
STORE_FAILED = monitor_proto.error_text("store failure: nothing was changed, try again")
BIG_REPLY = 64 << 10  # a page past this is sent only if the memory bound has room for it (MemoryAlarm.admit)
BUSY = monitor_proto.error_text(
    "busy: not now, pzq holds its bound of replies that clients have not read, or this client's own unread "
    "replies are past its share; read your replies, ask again later or for fewer rows"
)
# The right each request needs on the queue it names first (docs/permissions.md). The figures (MONITOR,
# STATS, QUEUE, CLIENTS) show names and counts, never bodies: any client let onto the socket sees them.
RIGHT_OF = {
    "PEEK": CONSUME,  # (they show bodies)
    "DEAD": CONSUME,
    "DEADLETTERS": CONSUME,
    "PURGE": MANAGE,
    "DELETEDEAD": MANAGE,
    "REQUEUE": MANAGE,
    "PUBLISH": PRODUCE,
}


class MonitorEndpoint(Endpoint):
    """Answers after the turn's commit, so the figures include the turn. A write (REQUEUE, DELETEDEAD,
    PURGE, PUBLISH) is carried out in the turn (``work``) and answered after its commit (the broker's
    ``readiness`` tells every gateway what became ready); a purge goes on a share a turn. Reads are
    answered after the commit for ``Limits.admin_read_s`` at most (the first always): the rest wait for
    the next turn."""

    name = "monitor"

    def __init__(self, config: Config, admin: Admin, binder: Sockets, permissions: Permissions | None = None):
        self.admin = admin
        self.permissions = permissions  # (None: every client may do anything, as without a file)
        # Answers may be large (a line per queue): only a few wait in one client's pipe; requests are a
        # few words each: 16 of at most 1 MiB are what one client's pipe may hold. (Its clients connect
        # for one request each, so their pipes are not estimated, only its backlog counted: a REQ
        # client asks again only after reading, and one whose pipe is full is refused, ``refuses``.)
        self.sock = binder.bind(
            zmq.ROUTER, config.monitor_dsn, "--monitor-dsn", SNDHWM=16, RCVHWM=16, MAXMSGSIZE=1 << 20
        )
        self.sockets = [self.sock]
        # (the pipes are estimated: 17 pages of 1.5 MB wait in the pipe of a client that never reads)
        self.replies = Replies(self.sock, "monitor", config.limits, pipes=True)
        binder.on_disconnect[self.sock] = self.replies.disconnected  # (a one-request client's pipe goes with it)
        self._gate = binder.gate(self.sock)
        self._curve = binder.curve  # (names the key a write came with, in the log)
        self.read_s = config.limits.admin_read_s
        self.limits = config.limits
        self._requests: list[monitor_proto.Request] = []
        # who sent each of _requests: its CURVE key's name (or "anonymous") and the key (z85; None: no key)
        self._who: list[tuple[str, str | None]] = []
        self._purgers: dict[str, str | None] = {}  # queue -> the key whose PURGE of it is under way
        self._written: dict[int, str] = {}  # index of a write in _requests -> its answer
        self._done: dict[int, str] = {}  # index in _requests -> its answer, made and committed in an earlier turn

    def read(self, ready: dict, now: float, now_us: int) -> None:
        if self.sock not in ready:
            return
        for _ in range(READ_BATCH):
            # (the rest: next turn. Requests waiting here are capped too: a flood of PEEKs answered one or
            # two a turn grew this list by 64 a turn, thousands, an honest STATS behind them for minutes and
            # every PUBLISH body held; past the cap a flood waits in the socket, bounded by its RCVHWM)
            if self.budget.spent() or len(self._requests) >= READ_BATCH:
                return
            try:
                frames, user, fd = receive_with_fd(self.sock, self._gate, "monitor", zmq.NOBLOCK)
            except zmq.Again:
                return
            self.budget.take(sum(map(len, frames or ())))
            if frames is not None:
                self.replies.read(frames[0], fd)  # (a lock-step client shows it read its last reply)
            if frames is not None and not self.replies.refuses(frames[0], "its requests go unanswered"):
                request = monitor_proto.parse_request(frames)
                refusal = self._refusal(request, user)
                if refusal is not None:  # (answered in its turn like any other, never carried out)
                    self._done[len(self._requests)] = refusal
                self._requests.append(request)
                self._who.append((self._name(user), user))

    def _name(self, user: str | None) -> str:
        if user is None or self._curve is None:
            return "anonymous"
        return self._curve.names.get(user, f"CURVE key {user[:8]}...")

    def _refusal(self, request: monitor_proto.Request, user: str | None) -> str | None:
        """The ``error: not permitted`` answer to a request its client has not the right for (checked
        before anything is read or changed, even before the queue is looked up), or None."""
        permissions = self.permissions
        right = RIGHT_OF.get(request.command)
        if permissions is None or not permissions.enabled or right is None or not request.args:
            return None  # (no args: its usage error names no queue)
        queue = request.args[0]
        if permissions.key_may(user, right, queue, "monitor", request.command):
            return None
        who = permissions.key_name(user) or "a client without a CURVE key"
        return monitor_proto.error_text(
            f"not permitted: {who} has no {right} right on queue {queue[:255]!r} ({request.command})"
        )

    def work(self, now: float, now_us: int) -> None:
        if self.admin.purging():
            self.admin.work(self.budget)
        for i, request in enumerate(self._requests):
            if i not in self._written and i not in self._done and self.admin.writes(request):
                if self.budget.spent():  # (the rest: carried out and answered in a later turn)
                    return
                # (answered as rolled back should the write itself fail the turn: it was carried out again
                # each turn, each failing, the loop rolling back 9,000 turns a second, the request unanswered)
                self._written[i] = STORE_FAILED
                self._written[i], _ = self.admin.write(request, self.budget, self._who[i][0])
                if request.command == "PURGE" and request.args and self.admin.purging(request.args[0]):
                    self._purgers[request.args[0]] = self._who[i][1]  # (a SIGHUP may take its right away)

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        """A purge under way goes on over turns: one whose key lost the manage right on its queue stops
        (what it purged so far stays purged), as its next PURGE would be refused."""
        for queue, user in list(self._purgers.items()):
            if not self.admin.purging(queue):
                del self._purgers[queue]
            elif self.permissions is not None and not self.permissions.allows_key(user, MANAGE, queue):
                del self._purgers[queue]
                self.admin.stop_purge(queue, f"{self.permissions.key_name(user) or 'anonymous'} lost its manage right")

    def waiting(self) -> bool:
        # A write's answer waits for the commit; so does a PEEK or DEAD, which reads the committed store:
        # what the figures say is there (a dead letter of this turn) is on its page too.
        return bool(self._written) or self.admin.purging() or any(r.command in SNAPSHOT_READS for r in self._requests)

    def rolled_back(self) -> None:
        for i in self._written:
            self._written[i] = STORE_FAILED
        self.admin.writes_rolled_back()

    def recover(self) -> None:
        self.admin.writes_rolled_back()

    def flush(self, now: float, now_us: int) -> None:
        self.replies.flush()
        requests, self._requests = self._requests, []
        who, self._who = self._who, []
        written, self._written = self._written, {}
        done, self._done = self._done, {}
        deadline, read = time.perf_counter() + self.read_s, False
        behind: set[bytes] = set()  # peers with a request left for a later turn
        for i, request in enumerate(requests):
            peer = request.envelope[0]
            text = written.get(i, done.get(i))
            if text is None and peer not in behind and not self.admin.writes(request):
                if not read or time.perf_counter() <= deadline:
                    text, read = self._answer(request), True
            if text is None or peer in behind:
                # (a write not carried out yet, the turn's budget ran out first; a read past this turn's share
                # of reading; or what its peer asked after one of those: a DEALER that pipelines is answered in
                # its order, it had a PUBLISH's answer before four PEEKs' it sent first. An answer made waits
                # in ``_done``: its write is committed)
                behind.add(peer)
                if text is not None:
                    self._done[len(self._requests)] = text
                self._requests.append(request)
                self._who.append(who[i])
                continue
            self.replies.send(monitor_proto.reply(request, text))

    def _answer(self, request: monitor_proto.Request) -> str:
        """The answer to a read, or a ``busy`` refusal when it is a big page the memory bound has no room
        for: its client's unread replies past their share, or the total past the low-water mark. (Pages for
        clients that never read them grew the monitor's backlogs past --memory-high-water, and the alarm
        refused every producer.) A PEEK or DEAD page is weighed before it is read, by its rows: one refused
        after it was read still cost the loop its reading, a flood of them a page a turn."""
        if request.command in ("PEEK", "DEAD"):
            word = request.args[1] if len(request.args) > 1 else ""
            rows = min(int(word), self.limits.admin_rows) if word.isascii() and word.isdigit() and len(word) < 9 else 50
            size = rows * (self.limits.admin_head_bytes * 4 // 3 + 200)  # (a row: its head in base64, its fields)
            return self.admin.answer(request) if self._room(request, size) else BUSY
        text = self.admin.answer(request)
        return text if request.command not in PAGES or self._room(request, len(text)) else BUSY

    def _room(self, request: monitor_proto.Request, size: int) -> bool:
        return size <= BIG_REPLY or self.alarm.admit(self.replies.held(request.envelope[0]), size)

    def memory(self) -> dict[str, int]:
        return {
            "monitor_backlogs": self.replies.backlog_bytes,
            "monitor_pipes": self.replies.pipe_bytes(),
            # (PUBLISH bodies waiting their turn: 64 requests of 1 MiB at most)
            "monitor_requests": sum(len(request.body or b"") for request in self._requests),
        }

    def wake_at(self, now: float) -> float | None:
        if self._requests or self.admin.purging():  # a write read after this turn's work, reads left, a purge
            return now
        return self.replies.wake_at(now)
