"""eMQP (EventMQ) clients and workers on the shared store: requests, jobs, replies, heartbeats.

A ``FramesGateway`` (gateways/contract.py): the endpoint feeds ``received`` with what the frontend
ROUTER (clients, FRONT) and the backend ROUTER (workers, BACK) bring, and sends what it and
``dispatch`` return after the turn's commit: a client's ACK therefore always follows the durable
commit of its REQUEST. Rules: shared/specs/emqp.md, "pzq's rules".

Mapping to the store: a REQUEST is a one-frame message (its payload) in its named queue, with the
client's identity, msgid and headers kept as the message's meta; a message from another protocol
reaches workers with its 32-hex id as msgid, no headers, and its frames joined as the payload (bytes
that are not UTF-8 are replaced, since eventmq peers decode every frame).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import time
import uuid
from collections.abc import Callable

from pzq.broker import Broker, Ref
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import Send
from pzq.gateways.emqp_scheduler import Scheduler
from pzq.logs import warn_bad
from pzq.protocols import emqp
from pzq.store.emqp_jobs import EmqpJobs

log = logging.getLogger("pzq.emqp")

FRONT, BACK, PUB = "front", "back", "pub"
NO_TIMEOUT_S = 10 * 365 * 86400.0  # eMQP jobs ignore --ack-timeout: they may run for minutes
TIMEOUT_GRACE_S = 5.0  # a timeout:N job is requeued N + this many seconds after its dispatch
REMEMBERED = 1024  # dropped workers whose queues are kept, to take them back if they speak again
MAX_SCHEDULERS = 100  # scheduler daemons heartbeaten at once
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

    @property
    def consumer(self) -> tuple:
        # The key is part of the holder: a ROUTER identity is the peer's choice, and another key
        # reusing it after this connection dropped must not settle what this one held.
        return holder_of(self.identity, self.user)


class EmqpGateway:
    """Every eMQP worker and what clients ask of the broker."""

    def __init__(
        self,
        broker: Broker,
        *,
        default_queues: list[str],
        heartbeat_s: float,
        liveness: int,
        publish: bool = False,
        cron_timezone: str = "UTC",
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        wall_clock: Callable[[], float] = time.time,
    ):
        self.broker = broker
        self.job_table = EmqpJobs(broker.store)  # jobs handed out, for a REPLY after a restart
        self.new_id = new_id  # eventmq's msgids are uuid4 strings; tests pass their own
        self.wall_clock = wall_clock  # the time a HEARTBEAT carries (eventmq sends time.time())
        self.default_queues = default_queues
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.publish = publish
        self.workers: dict[bytes, Worker] = {}
        # Scheduler daemons (emq-scheduler) on the frontend -> when last heard: pzq runs schedules
        # itself, but a scheduler that hears no heartbeat for 15 s reconnects in a loop.
        self.schedulers: dict[bytes, float] = {}
        # msgid a worker was given -> {stored message: (worker identity, its CURVE key)}. Client msgids
        # are not ours to trust unique, so a REPLY completes the job with that msgid held by the replying
        # worker (or by its earlier connection: see _pop_job).
        self.jobs: dict[str, dict[Ref, tuple[bytes, str | None]]] = {}
        # dropped -> (queues, slots, CURVE key)
        self.departed: dict[bytes, tuple[list[tuple[int, str]], int, str | None]] = {}
        self.next_heartbeat = 0.0
        self.scheduler = Scheduler(broker, cron_timezone, new_id)
        self.counters = {
            "requests_total": 0,
            "replies_total": 0,
            "replies_forwarded_total": 0,
            "dead_workers_total": 0,
            "bad_input_total": 0,
            "replies_refused_total": 0,
            "jobs_restored_total": 0,
        }

    def restore_jobs(self, now: float) -> int:
        """Jobs handed out before a restart (or a rolled-back turn) are held again for their workers:
        a REPLY for one completes it (from its worker, or one that inherits it: see _pop_job); one
        with no REPLY within RESTART_GRACE_S goes back to its queue and runs again."""
        restored = 0
        for ref, (msgid, identity, user) in self.job_table.items():
            message = self.broker.stored(ref)
            holder = holder_of(identity, user)
            if message is None:  # completed through another protocol, or its queue was deleted
                self.job_table.delete(ref)
                continue
            if ref in self.broker.inflight:
                if self.broker.holds(ref, holder):  # (restored already: recover runs twice after a failed turn)
                    self.jobs.setdefault(msgid, {})[ref] = (identity, user)
                continue
            self.broker.hold(ref, holder)
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
            self.broker.set_deadline(ref, now + (timeout + TIMEOUT_GRACE_S if timeout else wait))
            self.jobs.setdefault(msgid, {})[ref] = (identity, user)
            restored += 1
        if restored:
            self.counters["jobs_restored_total"] += restored
            log.info("eMQP: %d job(s) handed out before the restart wait for their REPLY", restored)
        return restored

    # -- clients ----------------------------------------------------------------------------------

    def from_client(self, frames: list[bytes], *, now: float, now_us: int) -> list[Send]:
        cmd = self._parse(frames)
        if cmd is None:
            return []
        if cmd.name == "REQUEST":
            return self._request(cmd, now_us)
        if cmd.name == "INFORM":  # a scheduler introducing itself
            if cmd.args and cmd.args[-1] == "scheduler":
                if cmd.peer not in self.schedulers and len(self.schedulers) >= MAX_SCHEDULERS:
                    self._bad(cmd.peer, ProtocolError("too-many-schedulers", f"at most {MAX_SCHEDULERS} schedulers"))
                    return []
                self.schedulers[cmd.peer] = now
            return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]
        if cmd.name == "HEARTBEAT":
            if cmd.peer in self.schedulers:
                self.schedulers[cmd.peer] = now
            return []
        if cmd.name == "PUBLISH":
            if self.publish:
                return [Send(PUB, [cmd.args[0].encode(), cmd.args[-1].encode()])]
            log.info("eMQP PUBLISH to %r dropped: no --emqp-publish-dsn", cmd.args[0])
        elif cmd.name == "DISCONNECT":
            log.warning("eMQP client %r sent DISCONNECT: ignored (only a signal stops pzq)", cmd.peer[:40])
            return [
                Send(
                    FRONT,
                    [
                        cmd.peer,
                        *emqp.error_reply(self.new_id(), "DISCONNECT refused: pzq stops on a signal only", cmd.msgid),
                    ],
                )
            ]
        elif cmd.name == "SCHEDULE":
            return self._schedule(cmd, now_us)
        elif cmd.name == "UNSCHEDULE":
            payload = cmd.args[3] if len(cmd.args) > 3 else ""
            self.scheduler.remove(payload)
            return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]
        return []

    def _schedule(self, cmd: emqp.Command, now_us: int) -> list[Send]:
        """Store a recurring job; the broker itself enqueues a REQUEST into its queue at each run."""
        queue, headers_text, interval_text = cmd.args[:3]
        payload = cmd.args[3] if len(cmd.args) > 3 else ""
        cron = (cmd.args[4] if len(cmd.args) > 4 else "").strip()
        try:
            self.scheduler.add(queue, headers_text, interval_text, payload, cron, now_us)
        except ProtocolError as exc:
            self._bad(cmd.peer, exc)
            detail = f"schedule refused: {exc.detail}"
            return [Send(FRONT, [cmd.peer, *emqp.error_reply(self.new_id(), detail, cmd.msgid)])]
        except StoreFull as exc:
            self._bad(cmd.peer, ProtocolError("queue-full", str(exc)))
            detail = f"schedule refused: {exc}"
            return [Send(FRONT, [cmd.peer, *emqp.error_reply(self.new_id(), detail, cmd.msgid)])]
        return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]

    @property
    def schedules(self) -> dict[str, dict]:
        """Every schedule's timing (see Scheduler)."""
        return self.scheduler.timing

    def run_schedules(self, now_us: int) -> int:
        """Enqueue a REQUEST for every schedule that is due; returns how many ran."""
        return self.scheduler.run(now_us)

    def received(self, socket: str, frames: list[bytes], *, now: float, now_us: int, user: str | None) -> list[Send]:
        if socket == BACK:
            return self.from_worker(frames, now=now, now_us=now_us, user=user)
        return self.from_client(frames, now=now, now_us=now_us)

    def dispatch(self, *, now: float, now_us: int, blocked: frozenset = frozenset()) -> list[Send]:
        """Due schedules run, heartbeats, and jobs for free workers (``blocked``: the endpoint's
        Replies keep a backlog per peer, so nothing is held back here)."""
        self.run_schedules(now_us)
        return self.tick(now) + self.hand_out(now=now, now_us=now_us)

    def unsent(self, send: Send) -> bool:
        return True  # (the endpoint's Replies keep what a peer has not read yet)

    def next_wake(self, now: float) -> float | None:
        wake = self.next_heartbeat
        due_us = self.scheduler.next_us()
        if due_us is not None:  # schedules keep wall-clock times (they outlive restarts)
            wake = min(wake, now + (due_us - self.wall_clock() * 1e6) / 1e6)
        return wake

    def rolled_back(self, sends: list[Send]) -> list[Send]:
        """Jobs that never left give their workers' slots back. A client's ACK promised a durable
        REQUEST or SCHEDULE that the rollback took back: it gets an error REPLY instead (as a native
        producer gets "store failure"), never silence."""
        out = []
        for send in sends:
            frames = send.frames
            if send.socket == BACK and len(frames) > 3 and frames[3] == b"REQUEST":
                worker = self.workers.get(frames[0])
                if worker is not None:
                    worker.slots += 1
            elif send.socket == FRONT and len(frames) > 5 and frames[3] == b"ACK":
                detail = "store failure: nothing was stored, try again"
                out.append(
                    Send(
                        FRONT,
                        [frames[0], *emqp.error_reply(self.new_id(), detail, frames[5].decode("utf-8", "replace"))],
                    )
                )
        return out

    def recover(self) -> None:
        """The turn was rolled back: forget the jobs handed out (the broker forgot every delivery; the
        durable ones are held again) and reload the schedules as they are on disk."""
        self.jobs.clear()
        self.restore_jobs(time.monotonic())
        self.scheduler.reload()

    def _request(self, cmd: emqp.Command, now_us: int) -> list[Send]:
        queue, headers_text, payload = cmd.args
        try:
            headers = emqp.parse_headers(headers_text)
            retries = emqp.header_int(headers, "retry-count")
            timeout = emqp.header_int(headers, "timeout")
            if not queue or len(queue.encode()) > 255:
                raise ProtocolError("bad-queue", "queue names are 1 to 255 bytes")
        except ProtocolError as exc:
            self._bad(cmd.peer, exc)
            return [
                Send(FRONT, [cmd.peer, *emqp.error_reply(self.new_id(), f"request refused: {exc.detail}", cmd.msgid)])
            ]
        meta: dict[str, object] = {"client": cmd.peer, "msgid": cmd.msgid, "headers": headers_text}
        if retries:
            meta["max_deliveries"] = retries + 1
        if timeout:
            meta["timeout"] = timeout
        try:
            self.broker.produce(queue, [payload.encode()], now_us=now_us, meta=meta)
        except StoreFull:
            log.warning("eMQP REQUEST %s for %r refused: queue full", cmd.msgid, queue)
            return [
                Send(
                    FRONT,
                    [
                        cmd.peer,
                        *emqp.error_reply(self.new_id(), "request refused: queue full, try again later", cmd.msgid),
                    ],
                )
            ]
        self.counters["requests_total"] += 1
        return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]

    # -- workers ----------------------------------------------------------------------------------

    def from_worker(self, frames: list[bytes], *, now: float, now_us: int, user: str | None = None) -> list[Send]:
        """A command from a worker; ``user`` is its CURVE public key (z85) when the backend uses CURVE."""
        cmd = self._parse(frames)
        if cmd is None:
            return []
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
            # Dropped as silent (a long job, a pause) but alive: take it back with its queues.
            queues, slots, _ = self.departed.pop(cmd.peer)
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
        self.departed.pop(cmd.peer, None)
        old = self.workers.pop(cmd.peer, None)
        if old is not None:
            self.broker.consumer_gone(old.consumer)
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
        message = self.broker.stored(job[0]) if job is not None else None  # read before the ack deletes it
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
        if meta and meta.get("client") and "reply-requested" in emqp.parse_headers(meta.get("headers", "")):
            self.counters["replies_forwarded_total"] += 1
            return [Send(FRONT, [meta["client"], *emqp.reply(self.new_id(), reply_json, request_msgid)])]
        return []

    def _pop_job(self, msgid: str, worker: Worker, now: float) -> tuple[Ref, tuple[bytes, str | None]] | None:
        """The job (message, (holder identity, its key)) this REPLY completes, taken off the books.

        The replying worker's own job; else one whose holder is no longer live (it said KBYE, was
        dropped, or has missed two heartbeats) and that this worker may have inherited: a JobManager that
        resets reconnects under a fresh identity and INFORMs again, and its REPLYs then come from the
        new one. It must serve the job's queue and, under CURVE, have authenticated with the same key."""
        holders = self.jobs.get(msgid)
        if not holders:
            return None
        chosen = next((ref for ref, holder in holders.items() if holder == (worker.identity, worker.user)), None)
        if chosen is None:
            served = {name for _, name in worker.queues}
            for ref, (identity, user) in holders.items():
                live = self.workers.get(identity)
                info = self.broker.store.queue_by_id(ref[0])
                gone = live is None or live.draining or now - live.last_seen > 2 * self.heartbeat_s
                if gone and user == worker.user and info is not None and info.name in served:
                    chosen = ref
                    break
        if chosen is None:
            return None
        holder = holders.pop(chosen)
        if not holders:
            del self.jobs[msgid]
        return chosen, holder

    def revoke(self, users: set[str]) -> int:
        """Drop every worker that authenticated with one of these (revoked) CURVE keys; returns how many."""
        gone = [w for w in self.workers.values() if w.user is not None and w.user in users]
        for worker in gone:
            worker.draining = True  # not remembered as departed: it may not come back
            self._drop(worker, "its CURVE key was revoked")
        return len(gone)

    def _drop(self, worker: Worker, why: str) -> None:
        self.workers.pop(worker.identity, None)
        if not worker.draining:
            self.departed[worker.identity] = (worker.queues, worker.slots, worker.user)
            while len(self.departed) > REMEMBERED:
                self.departed.pop(next(iter(self.departed)))
        requeued = self.broker.consumer_gone(worker.consumer)
        log.warning("eMQP worker %r dropped (%s); %d job(s) requeued", worker.identity[:40], why, requeued)

    # -- dispatch and time ------------------------------------------------------------------------

    def hand_out(self, *, now: float, now_us: int) -> list[Send]:
        """Give jobs to workers with free slots, heaviest queue first, least recently served first."""
        out: list[Send] = []
        for worker in list(self.workers.values()):
            while worker.slots > 0 and not worker.draining:
                job = self._take_for(worker, now, now_us)
                if job is None:
                    break
                out.append(job)
                worker.slots -= 1
                self.workers[worker.identity] = self.workers.pop(worker.identity)  # to the back of the line
        return out

    def _take_for(self, worker: Worker, now: float, now_us: int) -> Send | None:
        for _, queue in worker.queues:
            if not self.broker.has_ready(queue):
                continue
            taken = self.broker.take(queue, 1, worker.consumer, now=now, now_us=now_us, timeout_s=NO_TIMEOUT_S)
            if not taken:
                continue
            message = taken[0]
            meta = message.meta or {}
            if meta.get("timeout"):
                self.broker.set_deadline((message.qid, message.seq), now + meta["timeout"] + TIMEOUT_GRACE_S)
            msgid = meta.get("msgid") or message.id
            headers = emqp.with_header(meta.get("headers", ""), "reply-requested")
            payload = b"".join(message.frames).decode("utf-8", "replace")
            self.jobs.setdefault(msgid, {})[(message.qid, message.seq)] = (worker.identity, worker.user)
            # Durable with the turn's commit, before the job leaves: a REPLY after a restart completes it.
            self.job_table.put((message.qid, message.seq), (msgid, worker.identity, worker.user))
            return Send(BACK, [worker.identity, *emqp.request(msgid, queue, headers, payload)])
        return None

    def tick(self, now: float) -> list[Send]:
        """Heartbeat every worker each interval; drop the ones silent for ``liveness`` intervals."""
        if now < self.next_heartbeat:
            return []
        self.next_heartbeat = now + self.heartbeat_s
        # Jobs that left without a REPLY (dead-lettered, acked through another protocol) are forgotten.
        for msgid in [m for m, holders in self.jobs.items() if not any(r in self.broker.inflight for r in holders)]:
            for ref in self.jobs.pop(msgid):
                self.job_table.delete(ref)
        for worker in list(self.workers.values()):
            if worker.draining and not self.broker.inflight.count(worker.consumer):
                self._drop(worker, "it finished draining")
                continue
            # Draining or not, a worker silent for `liveness` intervals is dead: its jobs go back at
            # once. (A draining JobManager stops heartbeating, but each REPLY counts as one: only a
            # job running longer than liveness x interval after KBYE may run twice.)
            if now - worker.last_seen > self.liveness * self.heartbeat_s:
                self.counters["dead_workers_total"] += 1
                self._drop(worker, f"silent for {now - worker.last_seen:.1f} s")
        for peer, seen in list(self.schedulers.items()):
            if now - seen > self.liveness * self.heartbeat_s:
                del self.schedulers[peer]
                log.info("eMQP scheduler %r silent for %.1f s: forgotten", peer[:40], now - seen)
        return [
            Send(BACK, [identity, *emqp.heartbeat(self.new_id(), self.wall_clock())]) for identity in self.workers
        ] + [Send(FRONT, [peer, *emqp.heartbeat(self.new_id(), self.wall_clock())]) for peer in self.schedulers]

    # -- helpers ----------------------------------------------------------------------------------

    def _parse(self, frames: list[bytes]) -> emqp.Command | None:
        try:
            return emqp.parse(frames)
        except ProtocolError as exc:
            self._bad(frames[0] if frames else b"?", exc)
            return None

    def _bad(self, peer: bytes, exc: ProtocolError) -> None:
        self.counters["bad_input_total"] += 1
        warn_bad("emqp", exc.code, f"from {peer[:40]!r}: {exc.detail}")

    def clients(self, now: float, limit: int) -> list[dict]:
        workers = [
            [
                _shown(w.identity),
                ", ".join(f"{name} ({weight})" for weight, name in w.queues)[:200],
                w.slots,
                "yes" if w.draining else "no",
                round(now - w.last_seen, 1),
                self.broker.inflight.count(w.consumer),
            ]
            for w in itertools.islice(self.workers.values(), limit)
        ]
        schedules = [
            [
                key,
                t.get("queue", ""),
                f"cron {t['cron']}" if t.get("cron") else f"every {t.get('interval', 0)} s",
                "forever" if t.get("remaining", -1) < 0 else t.get("remaining"),
                _utc(t.get("next_us", 0)),
            ]
            for key, t in itertools.islice(self.schedules.items(), limit)
        ]
        schedulers = [[_shown(p), round(now - seen, 1)] for p, seen in itertools.islice(self.schedulers.items(), limit)]
        return [
            {
                "kind": "emqp-workers",
                "title": "Workers",
                "columns": ["worker", "queues (weight)", "free slots", "draining", "heard, s ago", "jobs in flight"],
                "rows": workers,
                "total": len(self.workers),
            },
            {
                "kind": "emqp-schedules",
                "title": "Schedules",
                "columns": ["schedule", "queue", "when", "runs left", "next run"],
                "rows": schedules,
                "total": len(self.schedules),
            },
            {
                "kind": "emqp-schedulers",
                "title": "Scheduler daemons",
                "columns": ["scheduler", "last heard, s ago"],
                "rows": schedulers,
                "total": len(self.schedulers),
            },
        ]

    def stats(self) -> dict:
        return {
            "workers": len(self.workers),
            "schedulers": len(self.schedulers),
            "schedules": len(self.schedules),
            "slots": sum(w.slots for w in self.workers.values()),
            "draining": sum(1 for w in self.workers.values() if w.draining),
            "jobs_inflight": sum(self.broker.inflight.count(w.consumer) for w in self.workers.values()),
            **self.counters,
        }


def _shown(identity: bytes) -> str:
    """A peer's identity for a page: as text when printable (eventmq's are), else hex."""
    text = identity[:64].decode("ascii", "replace")
    return text if text.isprintable() and "\ufffd" not in text else identity[:32].hex()


def _utc(us: int) -> str:
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if us else "-"


def holder_of(identity: bytes, user: str | None) -> tuple:
    """The broker's holder for what a worker connection holds: the key is part of it (see Worker)."""
    return ("emqp", identity, user)
