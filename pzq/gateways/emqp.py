"""eMQP (EventMQ) clients and workers on the shared store: requests, jobs, replies, heartbeats.

A ``FramesGateway`` (gateways/contract.py): the endpoint feeds ``received`` with what the frontend
ROUTER (clients, FRONT) and the backend ROUTER (workers, BACK) bring, and sends what it and
``dispatch`` return after the turn's commit: a client's ACK therefore always follows the durable
commit of its REQUEST. Rules: shared/specs/emqp.md, "pzq's rules".

Mapping to the store: a REQUEST is a one-frame message (its payload) in its named queue, with the
client's identity, msgid and headers kept as the message's meta; a message from another protocol
reaches workers with its 32-hex id as msgid, no headers, and its frames joined as the payload (bytes
that are not UTF-8 are replaced, since eventmq peers decode every frame).

This module holds the clients' side (FRONT) and the contract; REQUESTs are stored by
gateways/emqp_requests.py, workers and their jobs are kept by gateways/emqp_workers.py, schedules by
gateways/emqp_scheduler.py, the console's tables by gateways/emqp_views.py. Limits come from ``Limits``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways import emqp_views
from pzq.gateways.contract import BrokerSurface, Send
from pzq.gateways.emqp_requests import Requests
from pzq.gateways.emqp_rights import client_refusal
from pzq.gateways.emqp_scheduler import Scheduler
from pzq.gateways.emqp_workers import BACK, FRONT, Roster, Worker
from pzq.logs import warn_bad
from pzq.permissions import Permissions
from pzq.protocols import emqp
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

log = logging.getLogger("pzq.emqp")

PUB = "pub"
__all__ = ["BACK", "FRONT", "PUB", "EmqpGateway"]


class EmqpGateway:
    """Every eMQP client, scheduler daemon and worker, and what they ask of the broker."""

    def __init__(
        self,
        broker: BrokerSurface,
        jobs: EmqpJobs,
        schedules: Schedules,
        *,
        default_queues: list[str],
        heartbeat_s: float,
        liveness: int,
        publish: bool = False,
        cron_timezone: str = "UTC",
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        wall_clock: Callable[[], float] = time.time,
        limits: Limits = DEFAULT_LIMITS,
        permissions: Permissions | None = None,
        max_message_size: int | None = None,
    ):
        """``jobs`` and ``schedules`` are the store's tables of jobs handed out (for a REPLY after a
        restart) and of recurring jobs; ``permissions`` (None: everything allowed) are checked per
        command (gateways/emqp_rights.py); a client's command with a frame past ``max_message_size``
        (None: no limit but the socket's) is refused."""
        self.broker = broker
        self.max_message_size = max_message_size
        self.permissions = permissions
        self.new_id = new_id  # eventmq's msgids are uuid4 strings; tests pass their own
        self.wall_clock = wall_clock  # the time a HEARTBEAT carries (eventmq sends time.time())
        self.limits = limits
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.publish = publish
        # Scheduler daemons (emq-scheduler) on the frontend -> when last heard: pzq runs schedules
        # itself, but a scheduler that hears no heartbeat for 15 s reconnects in a loop.
        self.schedulers: dict[bytes, float] = {}
        self.next_heartbeat = 0.0
        self.scheduler = Scheduler(broker, schedules, cron_timezone, new_id, limits=limits)
        self.counters = {
            "requests_total": 0,
            "replies_total": 0,
            "replies_forwarded_total": 0,
            "dead_workers_total": 0,
            "bad_input_total": 0,
            "replies_refused_total": 0,
            "jobs_restored_total": 0,
            "jobs_given_back_total": 0,  # kept for a worker whose pipe took none of them, or that went
            "worker_connections_closed_total": 0,  # (the socket monitor's: tcp:// only)
        }
        self.roster = Roster(
            broker,
            jobs,
            limits=limits,
            default_queues=default_queues,
            heartbeat_s=heartbeat_s,
            liveness=liveness,
            new_id=new_id,
            wall_clock=wall_clock,
            counters=self.counters,
            bad=self._bad,
            permissions=permissions,
        )
        self.requests = Requests(broker, limits, new_id, self.counters, self._bad)
        self.parts = self.requests.parts  # (big REQUESTs, written a part per turn: the endpoint drives it)
        broker.queues.add_user(self)

    def uses_queue(self, queue: str) -> bool:
        """A queue a worker serves or a schedule runs into is in use (the broker's implicit queues)."""
        return self.roster.workers.counts[queue] > 0 or self.scheduler.timing.counts[queue] > 0

    def queue_expired(self, queue: str) -> None:
        pass  # (nothing is kept for a queue no worker serves and no schedule names)

    @property
    def workers(self) -> dict[bytes, Worker]:
        """Every registered worker, by ROUTER identity."""
        return self.roster.workers

    def restore_jobs(self, now: float) -> int:
        """Jobs handed out before a restart are held again for their workers (see Roster.restore_jobs)."""
        return self.roster.restore_jobs(now)

    # -- clients ----------------------------------------------------------------------------------

    def from_client(self, frames: list[bytes], *, now: Now, user: str | None = None) -> list[Send]:
        """A command from a client; ``user`` is its CURVE key (z85) when the frontend uses CURVE."""
        big = self.requests.big_payload(frames)  # (a big REQUEST's: checked a part at a time)
        try:
            cmd = self._decode(frames if big is None else [*frames[:-1], b""])
        except ProtocolError as exc:
            self._bad(frames[0] if frames else b"?", exc)
            if exc.code == "bad-headers" and frames[3] in (b"REQUEST", b"SCHEDULE", b"UNSCHEDULE"):
                # Refused from its size alone: answered as any refused request, by its msgid.
                msgid, what = frames[4].decode("utf-8", "replace"), frames[3].decode().lower()
                detail = f"{what} refused: {exc.detail}"
                return [Send(FRONT, [frames[0], *emqp.error_reply(self.new_id(), detail, msgid)])]
            return []
        if (most := self.max_message_size) is not None and len(frames) > 5 and max(map(len, frames[5:])) > most:
            # Read (the socket takes frames up to the old default of 16 MiB) to be answered, not cut off
            size = max(map(len, frames[5:]))
            over = ProtocolError("too-large", f"a frame of {size} bytes is over --max-message-size ({most})")
            self._bad(cmd.peer, over)
            if cmd.name in ("REQUEST", "SCHEDULE", "UNSCHEDULE"):
                detail = f"{cmd.name.lower()} refused: {over.detail}"
                return [Send(FRONT, [cmd.peer, *emqp.error_reply(self.new_id(), detail, cmd.msgid)])]
            return []  # (a PUBLISH: fire and forget, nobody reads an answer; counted and logged)
        if self.permissions is not None and (why := client_refusal(self.permissions, cmd, user, self.schedules)):
            if cmd.name == "PUBLISH":  # (fire and forget: nobody reads an answer; counted and logged)
                return []
            return [Send(FRONT, [cmd.peer, *emqp.error_reply(self.new_id(), why, cmd.msgid)])]
        if cmd.name == "REQUEST":
            return self.requests.request(cmd, frames[-1], now.wall_us, checked=big is None)
        if cmd.name == "INFORM":  # a scheduler introducing itself
            if cmd.args and cmd.args[-1] == "scheduler":
                most = self.limits.max_schedulers
                if cmd.peer not in self.schedulers and len(self.schedulers) >= most:
                    self._bad(cmd.peer, ProtocolError("too-many-schedulers", f"at most {most} schedulers"))
                    return []
                self.schedulers[cmd.peer] = now.mono
            return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]
        if cmd.name == "HEARTBEAT":
            if cmd.peer in self.schedulers:
                self.schedulers[cmd.peer] = now.mono
            return []
        if cmd.name == "PUBLISH":
            if self.publish:  # (its bytes are charged to its publisher while libzmq holds them: the token)
                return [Send(PUB, [cmd.args[0].encode(), cmd.args[-1].encode()], publisher(cmd.peer, user))]
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
        elif cmd.name == "SCHEDULE":  # (a share per CURVE key, else per peer: its routing identity)
            return self._schedule(cmd, now.wall_us, user or cmd.peer)
        elif cmd.name == "UNSCHEDULE":
            payload = cmd.args[3] if len(cmd.args) > 3 else ""
            self.scheduler.remove(payload)
            return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]
        return []

    def _schedule(self, cmd: emqp.Command, now_us: int, client: object) -> list[Send]:
        """Store a recurring job; the broker itself enqueues a REQUEST into its queue at each run."""
        queue, headers_text, interval_text = cmd.args[:3]
        payload = cmd.args[3] if len(cmd.args) > 3 else ""
        cron = (cmd.args[4] if len(cmd.args) > 4 else "").strip()
        try:
            self.scheduler.add(queue, headers_text, interval_text, payload, cron, now_us, client)
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
        """Enqueue a REQUEST for the schedules that are due, up to a turn's share (Scheduler.run); returns
        how many ran. Due ones left over make ``next_wake`` say now."""
        return self.scheduler.run(now_us)

    def received(self, socket: str, frames: list[bytes], *, now: Now, user: str | None) -> list[Send]:
        if socket == BACK:
            return self.from_worker(frames, now=now, user=user)
        return self.from_client(frames, now=now, user=user)

    def dispatch(self, *, now: Now, blocked: frozenset = frozenset(), most: int | None = None) -> list[Send]:
        """Due schedules run, heartbeats, and jobs for free workers, ``most`` at most (None: every free
        slot), none for the ``blocked`` ones (their pipes hold jobs kept for them: pzq/endpoints/emqp_kept.py)."""
        self.run_schedules(now.wall_us)
        return self.tick(now.mono) + self.hand_out(now=now, most=most, blocked=blocked)

    def unsent(self, send: Send) -> bool:
        """True: a job its worker's pipe could not take is kept for it (it asked for it with READY), and
        answers wait for their peer; a kept job that never leaves is given back (``give_back``)."""
        return True

    def holds(self, send: Send) -> bool:
        """Whether the job ``send`` carries is still its worker's (not requeued since it was handed out)."""
        return self.roster.holds(send)

    def give_back(self, send: Send) -> None:
        """The job ``send`` carries never left (its worker's pipe took none of it, or its worker is gone):
        back to its queue for another worker, its worker's slot back."""
        self.roster.give_back(send)

    def connection(self, peer: bytes, fd: int) -> None:
        """A worker's commands came over the open connection of descriptor ``fd`` (-1: not known)."""
        self.roster.connection(peer, fd)

    def disconnected(self, fd: int) -> None:
        """The backend connection of descriptor ``fd`` closed: its worker is gone, its jobs go back."""
        self.roster.disconnected(fd)

    def next_wake(self, now: float) -> float | None:
        wake = self.next_heartbeat
        due_us = self.scheduler.next_us()
        if due_us is not None:  # schedules keep wall-clock times (they outlive restarts)
            # (due ones a turn's share left over are in the past: the next turn polls without waiting)
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
        self.roster.book.clear()
        self.restore_jobs(time.monotonic())
        self.scheduler.reload()

    # -- workers ----------------------------------------------------------------------------------

    def from_worker(self, frames: list[bytes], *, now: Now, user: str | None = None) -> list[Send]:
        """A command from a worker; ``user`` is its CURVE public key (z85) when the backend uses CURVE."""
        cmd = self._parse(frames)
        if cmd is None:
            return []
        return self.roster.command(cmd, now=now.mono, user=user)

    def revoke(self, users: set[str]) -> int:
        """Drop every worker that authenticated with one of these (revoked) CURVE keys; returns how many."""
        return self.roster.revoke(users)

    def narrow(self) -> int:
        """The permissions were reloaded: drop every worker whose key may no longer consume from one of its
        queues, its jobs requeued (see Roster.narrow); returns how many."""
        return self.roster.narrow()

    # -- dispatch and time ------------------------------------------------------------------------

    def hand_out(
        self,
        *,
        now: Now,
        most: int | None = None,
        blocked: frozenset = frozenset(),
        most_bytes: int | None = None,
    ) -> list[Send]:
        """Give jobs to workers with free slots, heaviest queue first, least recently served first
        (``most`` at most, none to the ``blocked``, payloads up to ``most_bytes``: see Roster.hand_out)."""
        return self.roster.hand_out(now=now, most=most, blocked=blocked, most_bytes=most_bytes)

    def tick(self, now: float) -> list[Send]:
        """Heartbeat every worker and scheduler daemon each interval; drop the ones silent for
        ``liveness`` intervals."""
        if now < self.next_heartbeat:
            return []
        self.next_heartbeat = now + self.heartbeat_s
        out = self.roster.tick(now)
        for peer, seen in list(self.schedulers.items()):
            if now - seen > self.liveness * self.heartbeat_s:
                del self.schedulers[peer]
                log.info("eMQP scheduler %r silent for %.1f s: forgotten", peer[:40], now - seen)
        beat = [Send(FRONT, [peer, *emqp.heartbeat(self.new_id(), self.wall_clock())]) for peer in self.schedulers]
        return out + beat

    # -- helpers ----------------------------------------------------------------------------------

    def _decode(self, frames: list[bytes]) -> emqp.Command:
        most = self.limits
        return emqp.parse(frames, max_header_bytes=most.emqp_header_bytes, max_header_items=most.emqp_header_items)

    def _parse(self, frames: list[bytes]) -> emqp.Command | None:
        try:
            return self._decode(frames)
        except ProtocolError as exc:
            self._bad(frames[0] if frames else b"?", exc)
            return None

    def _bad(self, peer: bytes, exc: ProtocolError) -> None:
        self.counters["bad_input_total"] += 1
        warn_bad("emqp", exc.code, f"from {peer[:40]!r}: {exc.detail}")

    def queue_consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return emqp_views.queue_consumers(self.workers, self.broker.deliveries.count, queue, limit)

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        held = self.broker.deliveries.count
        return emqp_views.tables(self.workers, held, self.schedules, self.schedulers, now, limit, offset)

    def stats(self) -> dict:
        return {
            "workers": len(self.workers),
            "schedulers": len(self.schedulers),
            "schedules": len(self.schedules),
            "schedules_refused_total": self.scheduler.shares.refused_total,  # (past a client's share)
            "slots": sum(w.slots for w in self.workers.values()),
            "draining": sum(1 for w in self.workers.values() if w.draining),
            "jobs_inflight": sum(self.broker.deliveries.count(w.consumer) for w in self.workers.values()),
            **self.counters,
        }


def publisher(peer: bytes, user: str | None) -> tuple:
    """The payer a PUBLISH's bytes are charged to while libzmq holds them: its client (its CURVE key, else
    its routing identity)."""
    return ("emqp-publisher", user or peer)
