"""eMQP workers (JobManagers) on the backend: their registration, jobs, REPLYs, heartbeats and drops.

The eMQP gateway (gateways/emqp.py) parses what the backend ROUTER brings and hands workers' commands
to the ``Roster``; it also asks it, each turn, to hand jobs to free workers and to heartbeat them.
A job handed out is recorded in the store's ``EmqpJobs`` table with the turn's commit, so that a REPLY
after a restart still completes it (``restore_jobs``); the book of jobs is gateways/emqp_handed.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from pzq.clock import Now
from pzq.config import Limits
from pzq.errors import ProtocolError
from pzq.gateways.contract import BrokerSurface, Ref, Send
from pzq.gateways.emqp_handed import BACK, FRONT, JobBook, job_request, reply_requested
from pzq.gateways.emqp_rights import unserved
from pzq.gateways.tally import Tally
from pzq.permissions import Permissions
from pzq.protocols import emqp
from pzq.store.emqp_jobs import EmqpJobs

log = logging.getLogger("pzq.emqp")

NO_TIMEOUT_S = 10 * 365 * 86400.0  # eMQP jobs ignore --ack-timeout: they may run for minutes
TIMEOUT_GRACE_S = 5.0  # a timeout:N job is requeued N + this many seconds after its dispatch
# After a restart, a job handed out before it waits this long for its REPLY (a JobManager outlives its
# broker and reconnects, under a fresh identity, with the job still running); then it runs again. A job
# with a timeout:N header waits N + TIMEOUT_GRACE_S instead.
RESTART_GRACE_S = 300.0


@dataclasses.dataclass
class Worker:
    """A JobManager: its queues heaviest first, free slots (one per READY), and whether it drains."""

    identity: bytes
    queues: list[tuple[int, str]]
    last_seen: float
    slots: int = 0
    draining: bool = False
    user: str | None = None  # its CURVE public key (z85), when the backend uses CURVE
    fd: int = -1  # the descriptor of the connection its commands came over (-1: not known)
    connected_us: int = dataclasses.field(default_factory=lambda: time.time_ns() // 1000)  # (since its INFORM)

    @property
    def consumer(self) -> tuple:
        # The key is part of the holder: a ROUTER identity is the peer's choice, and another key
        # reusing it after this connection dropped must not settle what this one held.
        return holder_of(self.identity, self.user)


class Roster:
    """Every eMQP worker of the server, the jobs handed to them, and those that departed."""

    def __init__(
        self,
        broker: BrokerSurface,
        job_table: EmqpJobs,
        *,
        limits: Limits,
        default_queues: list[str],
        heartbeat_s: float,
        liveness: int,
        new_id: Callable[[], str],
        wall_clock: Callable[[], float],
        counters: dict[str, int],
        bad: Callable[[bytes, ProtocolError], None],
        permissions: Permissions | None = None,
    ):
        self.broker = broker
        self.permissions = permissions  # (None: every worker may serve every queue)
        self.job_table = job_table  # jobs handed out, for a REPLY after a restart
        self.limits = limits
        self.default_queues = default_queues
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.new_id = new_id
        self.wall_clock = wall_clock
        self.counters = counters  # the gateway's figures, which these commands count in
        self._bad = bad  # (the gateway's: counted and logged, rate-limited)
        self.workers: Tally[bytes, Worker] = Tally(_queues_of)
        self.book = JobBook(broker, job_table)  # the jobs handed out, and who holds each
        # dropped -> (queues, slots, CURVE key)
        self.departed: dict[bytes, tuple[list[tuple[int, str]], int, str | None]] = {}
        self._fds: dict[int, bytes] = {}  # connection descriptor -> the worker whose commands came over it

    def restore_jobs(self, now: float) -> int:
        """Jobs handed out before a restart (or a rolled-back turn) are held again for their workers:
        a REPLY for one completes it (from its worker, or one that inherits it: see _pop_job); one
        with no REPLY within RESTART_GRACE_S goes back to its queue and runs again."""
        restored = 0
        for ref, (msgid, identity, user) in self.job_table.items():
            message = self.broker.queues.message(ref)
            holder = holder_of(identity, user)
            if message is None:  # completed through another protocol, or its queue was deleted
                self.job_table.delete(ref)
                continue
            holding = self.broker.deliveries.holder(ref)
            if holding is not None:
                if holding == holder:  # (restored already: recover runs twice after a failed turn)
                    self.book.handed(msgid, ref, (identity, user), record=False)
                continue
            if identity not in self.workers:
                # Its JobManager outlived us and will speak again (HEARTBEAT, READY, REPLY) without an
                # INFORM: remembered as departed, it is taken back with the queues of its jobs.
                queues, slots, _ = self.departed.get(identity, ([], 0, user))
                if all(name != message.queue for _, name in queues):
                    queues = [*queues, (0, message.queue)]
                self.departed[identity] = (queues, slots, user)
            timeout = (message.meta or {}).get("timeout")
            # A worker still connected (a rolled-back turn, not a restart) keeps its job as long as ever.
            wait = NO_TIMEOUT_S if identity in self.workers else RESTART_GRACE_S
            self.broker.deliveries.hold(ref, holder, now + (timeout + TIMEOUT_GRACE_S if timeout else wait))
            self.book.handed(msgid, ref, (identity, user), record=False)
            restored += 1
        if restored:
            self.counters["jobs_restored_total"] += restored
            log.info("eMQP: %d job(s) handed out before the restart wait for their REPLY", restored)
        return restored

    def command(self, cmd: emqp.Command, *, now: float, user: str | None) -> list[Send]:
        """A command from a worker; ``user`` is its CURVE public key (z85) when the backend uses CURVE."""
        worker = self.workers.get(cmd.peer)
        known = worker.user if worker is not None else self.departed.get(cmd.peer, (None, None, user))[2]
        if known != user:
            # Its identity was registered by another key: an impostor (a ROUTER identity is the peer's
            # choice), whatever it sends, until that worker is forgotten.
            self._bad(
                cmd.peer,
                ProtocolError(
                    "wrong-key", f"{cmd.name} under a worker identity registered with another CURVE key: ignored"
                ),
            )
            return []
        if worker is not None:
            worker.last_seen = now  # every command counts as a heartbeat
        if cmd.name == "INFORM":
            return self._inform(cmd, now, user)
        if worker is None and cmd.peer in self.departed and cmd.name in ("REPLY", "READY", "HEARTBEAT"):
            # Dropped as silent (a long job, a pause) but alive: take it back with its queues, if its key
            # may still consume from them all (the rules may have changed, or the server restarted).
            queues, slots, _ = self.departed.pop(cmd.peer)
            if self._unserved(user, _names(queues), cmd.name) is not None:
                self.broker.gone(holder_of(cmd.peer, user))  # (jobs held for it since a restart)
            else:
                worker = self.workers[cmd.peer] = Worker(cmd.peer, queues, now, slots, user=user)
                log.info("eMQP worker %r is back", cmd.peer[:40])
        if cmd.name == "REPLY":
            if worker is None:
                self.counters["replies_refused_total"] += 1
                self._bad(
                    cmd.peer, ProtocolError("not-registered", "REPLY from a peer that never sent INFORM: ignored")
                )
                return []
            return self._reply(cmd, worker, now)
        if worker is None:
            log.info("eMQP %s from unknown worker %r: ignored (INFORM first)", cmd.name, cmd.peer[:40])
            return []
        if cmd.name == "READY":
            worker.slots += 1
        elif cmd.name in ("KBYE", "KBAI"):
            worker.draining = True  # finishes and REPLYs what it holds; gets nothing new
            log.info("eMQP worker %r says goodbye: draining", cmd.peer[:40])
        elif cmd.name == "DISCONNECT":
            self._drop(worker, "it disconnected")
        return []

    def _inform(self, cmd: emqp.Command, now: float, user: str | None) -> list[Send]:
        try:
            queues = emqp.parse_queues(cmd.args[0], self.default_queues)
        except ProtocolError as exc:
            self._bad(cmd.peer, exc)
            return []
        if self._unserved(user, _names(queues), "INFORM") is not None:
            return []  # (a worker has no error to read: not registered, nothing changed; counted and logged)
        self.departed.pop(cmd.peer, None)
        old = self.workers.pop(cmd.peer, None)
        if old is not None:
            self.broker.gone(old.consumer)
        self.workers[cmd.peer] = Worker(cmd.peer, queues, now, user=user)
        # The JobManager starts its processes (and sends READY) only once it hears a heartbeat.
        return [
            Send(BACK, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)]),
            Send(BACK, [cmd.peer, *emqp.heartbeat(self.new_id(), self.wall_clock())]),
        ]

    def _reply(self, cmd: emqp.Command, worker: Worker, now: float) -> list[Send]:
        if len(cmd.args) < 2:
            self._bad(cmd.peer, ProtocolError("bad-reply", "REPLY without the request's msgid"))
            return []
        reply_json, request_msgid = cmd.args
        job = self._pop_job(request_msgid, worker, now)
        message = self.broker.queues.message(job[0]) if job is not None else None  # read before the ack deletes it
        if job is None or not self.broker.ack(job[0], by=holder_of(*job[1])):
            self.counters["replies_refused_total"] += 1
            self._bad(
                cmd.peer,
                ProtocolError(
                    "not-held",
                    f"REPLY for job {request_msgid[:60]!r}, which this worker "
                    "does not hold (unknown, done, another's, or given out before a "
                    "restart): ignored",
                ),
            )
            return []
        self.job_table.delete(job[0])
        self.counters["replies_total"] += 1
        meta = message.meta if message is not None else None
        if meta and meta.get("client") and reply_requested(meta):
            self.counters["replies_forwarded_total"] += 1
            client = meta["client"]  # (charged to the client while libzmq holds it: the token names it)
            reply = emqp.reply(self.new_id(), reply_json, request_msgid)
            return [Send(FRONT, [client, *reply], ("emqp-client", client))]
        return []

    def _pop_job(self, msgid: str, worker: Worker, now: float) -> tuple[Ref, tuple[bytes, str | None]] | None:
        """The job (message, (holder identity, its key)) this REPLY completes, taken off the books.

        The replying worker's own job; else one whose holder is no longer live (it said KBYE, was
        dropped, or has missed two heartbeats) and that this worker may have inherited: a JobManager that
        resets reconnects under a fresh identity and INFORMs again, and its REPLYs then come from the
        new one. It must serve the job's queue and, under CURVE, have authenticated with the same key."""
        served = {name for _, name in worker.queues}

        def inherits(ref: Ref, holder: tuple[bytes, str | None]) -> bool:
            identity, user = holder
            live = self.workers.get(identity)
            name = self.broker.queues.name(ref[0])
            gone = live is None or live.draining or now - live.last_seen > 2 * self.heartbeat_s
            return gone and user == worker.user and name is not None and name in served

        return self.book.pop(msgid, (worker.identity, worker.user), inherits)

    def revoke(self, users: set[str]) -> int:
        """Drop every worker that authenticated with one of these (revoked) CURVE keys; returns how many."""
        gone = [w for w in self.workers.values() if w.user is not None and w.user in users]
        for worker in gone:
            worker.draining = True  # not remembered as departed: it may not come back
            self._drop(worker, "its CURVE key was revoked")
        return len(gone)

    def narrow(self) -> int:
        """The permissions were reloaded: drop every worker whose key may no longer consume from one of
        its queues, its jobs requeued at once as a revocation does, and forget departed ones of such keys
        (their held jobs requeued too); returns how many workers were dropped."""
        gone = [(w, q) for w in self.workers.values() if (q := self._unserved(w.user, _queues_of(w))) is not None]
        for worker, queue in gone:
            worker.draining = True  # not remembered as departed: it may not come back
            self._drop(worker, f"its key may no longer consume from {queue!r}")
        for identity, (queues, _, user) in list(self.departed.items()):
            if self._unserved(user, _names(queues)) is not None:
                del self.departed[identity]
                self.broker.gone(holder_of(identity, user))
        return len(gone)

    def _unserved(self, user: str | None, queues: list[str], what: str = "") -> str | None:
        """The first of ``queues`` the key ``user`` may not consume from (see emqp_rights.unserved)."""
        return None if self.permissions is None else unserved(self.permissions, user, queues, what)

    def connection(self, identity: bytes, fd: int) -> None:
        """The commands of worker ``identity`` came over the open connection of descriptor ``fd``."""
        worker = self.workers.get(identity)
        if worker is None or fd < 0 or worker.fd == fd:
            return
        if self._fds.get(worker.fd) == identity:
            del self._fds[worker.fd]
        self._fds[fd] = identity
        worker.fd = fd

    def disconnected(self, fd: int) -> None:
        """The connection of descriptor ``fd`` closed: what its worker was handed over it is gone with it
        (never read, or read by a process that is no longer there to REPLY on it), so the worker is
        dropped and its jobs go back at once, not after liveness x interval. It is remembered as departed:
        a JobManager that reconnects is taken back by its next command, and its REPLYs still count."""
        identity = self._fds.pop(fd, None)
        worker = self.workers.get(identity) if identity is not None else None
        if worker is not None and worker.fd == fd:
            self.counters["worker_connections_closed_total"] += 1
            self._drop(worker, "its connection closed")

    def holds(self, send: Send) -> bool:
        """Whether the job ``send`` carries is still in flight to the worker it was for."""
        return self.book.holds(send)

    def give_back(self, send: Send) -> None:
        """The job ``send`` carries never reached its worker: back to its queue, the worker's slot back."""
        holder = self.book.give_back(send)
        if holder is None:
            return  # (requeued already: its worker was dropped)
        worker = self.workers.get(send.frames[0])
        if worker is not None and worker.consumer == holder:
            worker.slots += 1
        self.counters["jobs_given_back_total"] += 1

    def _drop(self, worker: Worker, why: str) -> None:
        if self._fds.get(worker.fd) == worker.identity:
            del self._fds[worker.fd]
        self.workers.pop(worker.identity, None)
        if not worker.draining:
            self.departed[worker.identity] = (worker.queues, worker.slots, worker.user)
            while len(self.departed) > self.limits.emqp_remembered:
                self.departed.pop(next(iter(self.departed)))
        requeued = self.broker.gone(worker.consumer)
        log.warning("eMQP worker %r dropped (%s); %d job(s) requeued", worker.identity[:40], why, requeued)

    def hand_out(
        self,
        *,
        now: Now,
        most: int | None = None,
        blocked: frozenset = frozenset(),
        most_bytes: int | None = None,
    ) -> list[Send]:
        """Give jobs to workers with free slots, heaviest queue first, least recently served first;
        ``most`` jobs at most (None: as many as there are free slots), none to the ``blocked`` (jobs wait
        for their pipes: their bytes stay in the queue, not in pzq's memory), and none more once their
        payloads reach ``most_bytes`` (the turn's bytes: reading a 1 MiB body and framing it costs the
        loop about a millisecond; one job is always handed out)."""
        out: list[Send] = []
        if most is not None and most <= 0:
            return out
        size = 0
        for worker in list(self.workers.values()):
            if blocked and worker.identity in blocked:
                continue
            while worker.slots > 0 and not worker.draining:
                if most is not None and len(out) >= most or most_bytes is not None and out and size >= most_bytes:
                    return out
                job = self._take_for(worker, now)
                if job is None:
                    break
                out.append(job)
                size += len(job.frames[-1])
                worker.slots -= 1
                self.workers[worker.identity] = self.workers.pop(worker.identity)  # to the back of the line
        return out

    def _take_for(self, worker: Worker, now: Now) -> Send | None:
        for _, queue in worker.queues:
            if self.broker.ready_count(queue) <= 0:
                continue
            taken = self.broker.take(queue, 1, worker.consumer, now=now, timeout_s=NO_TIMEOUT_S)
            if not taken:
                continue
            message = taken[0]
            meta = message.meta or {}
            if meta.get("timeout"):
                deadline = now.mono + meta["timeout"] + TIMEOUT_GRACE_S
                self.broker.deliveries.hold((message.qid, message.seq), worker.consumer, deadline)
            msgid, send = job_request(message, queue, worker.identity, worker.consumer)
            # Durable with the turn's commit, before the job leaves: a REPLY after a restart completes it.
            self.book.handed(msgid, (message.qid, message.seq), (worker.identity, worker.user))
            return send
        return None

    def tick(self, now: float) -> list[Send]:
        """The heartbeat interval came: forget jobs that left without a REPLY, drop workers that
        finished draining or fell silent for ``liveness`` intervals, and heartbeat the others."""
        self.book.forget_left()  # (jobs that left without a REPLY)
        for worker in list(self.workers.values()):
            if worker.draining and not self.broker.deliveries.count(worker.consumer):
                self._drop(worker, "it finished draining")
                continue
            # Draining or not, a worker silent for `liveness` intervals is dead: its jobs go back at
            # once. (A draining JobManager stops heartbeating, but each REPLY counts as one: only a
            # job running longer than liveness x interval after KBYE may run twice.)
            if now - worker.last_seen > self.liveness * self.heartbeat_s:
                self.counters["dead_workers_total"] += 1
                self._drop(worker, f"silent for {now - worker.last_seen:.1f} s")
        return [Send(BACK, [identity, *emqp.heartbeat(self.new_id(), self.wall_clock())]) for identity in self.workers]


def holder_of(identity: bytes, user: str | None) -> tuple:
    """The broker's holder for what a worker connection holds: the key is part of it (see Worker)."""
    return ("emqp", identity, user)


def _queues_of(worker: Worker) -> list[str]:
    """The queues a worker serves (in use while it is registered)."""
    return _names(worker.queues)


def _names(queues: list[tuple[int, str]]) -> list[str]:
    return [name for _, name in queues]
