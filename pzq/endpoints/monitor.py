"""The monitor endpoint: REQ clients asking MONITOR, STATS and the admin requests (pzq/admin/)."""

from __future__ import annotations

import logging
import time
from typing import cast

import zmq

from pzq.admin import Admin
from pzq.admin.figures import KINDS
from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_with_fd
from pzq.endpoints.replies import Replies
from pzq.permissions import CONSUME, MANAGE, PRODUCE, Permissions
from pzq.protocols import monitor as monitor_proto

log = logging.getLogger("pzq.server")

READ_BATCH = 64
SNAPSHOT_READS = frozenset({"PEEK", "DEAD"})
# reads whose replies may be big (~1.5 MB a page; DEADLETTERS to 4 MiB, ROUTES 1,000 names of 255 bytes: 8
# clients asking ROUTES of such an event and never reading had raised the memory alarm, refusing producers)
PAGES = frozenset({"QUEUE", "PEEK", "DEAD", "CLIENTS", "DEADLETTERS", "ROUTES", "WHERE"})
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
    "CREATE": MANAGE,  # (a queue made or deleted: the operator's, as a purge is)
    "DELETE": MANAGE,
    "PUBLISH": PRODUCE,
}


class MonitorEndpoint(Endpoint):
    """Answers after the turn's commit, so the figures include the turn. A write (REQUEUE, DELETEDEAD,
    PURGE, PUBLISH) is carried out in the turn (``work``) and answered after its commit (the broker's
    ``readiness`` tells every gateway what became ready); a purge goes on a share a turn. Reads are
    answered after the commit for ``Limits.admin_read_s`` at most (the first always): the rest wait for
    the next turn. STATS and MONITOR are built over turns (pzq/admin/figures.py), a slice of
    ``Limits.admin_figures_s`` after each commit, each answered when the pass begun after it came ends.
    Every answer past BIG_REPLY is charged to its client, and refused ``busy`` past its room (``_room``)."""

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
        # STATS and MONITOR (pzq/admin/figures.py): the pass each waiting request's answer is (by id of the
        # request, which stays in _requests until answered), the bytes promised to its client, the passes
        # promised ((kind, pass) -> [size, requests waiting]), and the key the last answer was sent with
        self._tickets: dict[int, int] = {}
        self._promised: dict[bytes, int] = {}
        self._passes: dict[tuple[str, int], list[int]] = {}
        self._sent_key: tuple[str, int] = ("", 0)
        self.busy_total = 0

    def read(self, ready: dict, now: Now) -> None:
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

    def work(self, now: Now) -> None:
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

    def output_waiting(self) -> bool:
        return bool(self._requests)

    def flush(self, now: Now) -> None:
        self.replies.flush()
        requests, self._requests = self._requests, []
        who, self._who = self._who, []
        written, self._written = self._written, {}
        done, self._done = self._done, {}
        started = time.perf_counter()
        deadline, read = started + self.read_s, False
        figures_until, worked = started + self.limits.admin_figures_s, False
        behind: set[bytes] = set()  # peers with a request left for a later turn
        for i, request in enumerate(requests):
            peer = request.envelope[0]
            text: str | bytes | bytearray | None = written.get(i, done.get(i))
            if text is None and peer not in behind and not self.admin.writes(request):
                if request.command in KINDS:  # (built over turns: answered once its pass has every queue)
                    text = self._figures(request, figures_until, least=not worked)
                    worked = True
                elif not read or time.perf_counter() <= deadline:
                    text, read = self._answer(request), True
            if text is None or peer in behind:
                # (a write not carried out yet, the turn's budget ran out first; a read past this turn's share
                # of reading; STATS waiting for its pass; or what its peer asked after one of those: a DEALER
                # that pipelines is answered in its order, it had a PUBLISH's answer before four PEEKs' it
                # sent first. An answer made waits in ``_done``: its write is committed)
                behind.add(peer)
                if text is not None:
                    self._done[len(self._requests)] = text if isinstance(text, str) else bytes(text).decode()
                self._requests.append(request)
                self._who.append(who[i])
                continue
            if not isinstance(text, str):  # (one buffer for every client its pass answers: sent without a copy)
                self.replies.send([*request.envelope, cast(bytes, text)], key=self._sent_key)  # (a buffer as bytes)
            else:
                self.replies.send(monitor_proto.reply(request, text))

    def _figures(self, request: monitor_proto.Request, until: float, *, least: bool) -> str | bytes | bytearray | None:
        """STATS or MONITOR: its answer once the pass begun after it came has every queue (None until
        then), or ``busy`` when its client has no room for it (weighed as the last answer of its kind)."""
        figures, kind, peer = self.admin.figures, request.command, request.envelope[0]
        ticket = self._tickets.get(id(request))
        if ticket is None:
            pending = (kind, figures.passes[kind].begun + 1)  # (the pass its ticket will be)
            size = figures.estimate(kind)
            if not self._room(peer, size, shared=pending in self._passes):
                return BUSY
            ticket = self._tickets[id(request)] = figures.ticket(kind)
            self._promised[peer] = size
            self._passes.setdefault((kind, ticket), [size, 0])[1] += 1
        figures.work(until, least=least)
        answer = figures.ready(kind, ticket)
        if answer is None:
            return None
        del self._tickets[id(request)]
        self._promised.pop(peer, None)
        promise = self._passes[(kind, ticket)]
        promise[1] -= 1
        if not promise[1]:
            del self._passes[(kind, ticket)]
        self._sent_key = (kind, figures.passes[kind].done)
        return answer

    def _answer(self, request: monitor_proto.Request) -> str:
        """The answer to a read, or a ``busy`` refusal when it is a big page the memory bound has no room
        for: its client's unread replies past their share, or the total past the low-water mark. (Pages for
        clients that never read them grew the monitor's backlogs past --memory-high-water, and the alarm
        refused every producer.) A PEEK or DEAD page is weighed before it is read, by its rows: one refused
        after it was read still cost the loop its reading, a flood of them a page a turn."""
        peer = request.envelope[0]
        if request.command in ("PEEK", "DEAD"):
            word = request.args[1] if len(request.args) > 1 else ""
            rows = min(int(word), self.limits.admin_rows) if word.isascii() and word.isdigit() and len(word) < 9 else 50
            size = rows * (self.limits.admin_head_bytes * 4 // 3 + 200)  # (a row: its head in base64, its fields)
            return self.admin.answer(request) if self._room(peer, size) else BUSY
        text = self.admin.answer(request)
        return text if request.command not in PAGES or self._room(peer, len(text)) else BUSY

    def _room(self, peer: bytes, size: int, *, shared: bool = False) -> bool:
        """May ``peer`` be sent an answer of ``size`` bytes (``shared``: one already promised to others,
        which adds nothing to what pzq holds)? Small ones always. A big one not past the client's share of
        unread answers (``Limits.memory_peer_share``; a client holding none may always have one), nor past
        ``Limits.monitor_answers_bytes`` of unread answers in all, of which the last
        ``monitor_answers_reserve_part``-th is kept for clients that hold none (a lock-step client, as
        the console's, that reads what it asks for: those that never read cannot take it from it), nor
        past the memory bound's ceiling. So a few clients that ask and never read hold a bounded part of
        memory, never raise the alarm that refuses producers, and leave room for a reader."""
        if size <= BIG_REPLY:
            return True
        limits = self.limits
        held = self.replies.held(peer) + self._promised.get(peer, 0)
        unread = self.unread()
        more = 0 if shared else size
        pool = limits.monitor_answers_bytes
        if held:
            kept = pool // limits.monitor_answers_reserve_part
            room = held + size <= limits.memory_peer_share and unread + more <= pool - kept
        else:
            room = not unread or unread + more <= pool
        if room and self.alarm.admit(held, more):
            return True
        self.busy_total += 1
        return False

    def unread(self) -> int:
        """Bytes of answers pzq holds for the monitor's clients: what their pipes may hold, its backlogs,
        and the passes of STATS promised to requests that wait for them."""
        promised = sum(size for size, _ in self._passes.values())
        return self.replies.pipe_bytes() + self.replies.backlog_bytes + promised

    def memory(self) -> dict[str, int]:
        return {
            "monitor_backlogs": self.replies.backlog_bytes,
            "monitor_pipes": self.replies.pipe_bytes(),  # (an answer sent to many clients: once)
            "monitor_pipes_unconfirmed": self.replies.unconfirmed_bytes(),  # (room kept for it, not held)
            # (PUBLISH bodies waiting their turn: 64 requests of 1 MiB at most)
            "monitor_requests": sum(len(request.body or b"") for request in self._requests),
            "monitor_figures": self.admin.figures.held_bytes(),  # (STATS being built, and the last answers)
        }

    def stats(self) -> dict:
        figures = self.admin.figures
        return {
            "busy_total": self.busy_total,  # big answers refused: their client, or every client, had no room
            "answers_unread_bytes": self.replies.pipe_bytes() + self.replies.backlog_bytes,
            "figures_passes_total": figures.passes_total,  # STATS and MONITOR built
            "figures_slices_total": figures.slices_total,
        }

    def wake_at(self, now: float) -> float | None:
        if self._requests or self.admin.purging():  # a write read after this turn's work, reads left, a purge
            return now  # (or a STATS whose pass goes on)
        return self.replies.wake_at(now)
