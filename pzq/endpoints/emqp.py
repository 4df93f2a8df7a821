"""The eMQP endpoints: clients on the frontend ROUTER, workers on the backend ROUTER, PUBLISH on a PUB.

Every body pzq hands libzmq here is charged once while libzmq holds it: a job to its worker (a delivery),
a REPLY passed on to its client, a PUBLISH to its publisher (pzq/endpoints/handed.py); what waits for a
full pipe is kept and counted (pzq/endpoints/emqp_kept.py). A worker or subscriber that reads nothing is
cut off (pzq/endpoints/stuck.py), and a worker whose connection closes is gone at once (the socket
monitor's DISCONNECTED, tcp://): its jobs go to other workers.
"""

from __future__ import annotations

import logging

import zmq

from pzq.clock import Now
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_from, receive_with_fd
from pzq.endpoints.emqp_kept import KeptJobs, KeptReplies
from pzq.endpoints.emqp_publish import Publisher
from pzq.endpoints.handed import Handed
from pzq.endpoints.replies import RETRY_S, Replies
from pzq.endpoints.stuck import StuckReaders
from pzq.gateways.contract import Send
from pzq.gateways.emqp import BACK, FRONT, PUB, EmqpGateway
from pzq.zmqio import NOBLOCK, POLLIN, Again, events

log = logging.getLogger("pzq.server")

_MAY_FREE = (b"REQUEST", b"READY")  # commands after which a job may go out at once (a job, a free slot)


class EmqpEndpoint(Endpoint):
    """Feeds the eMQP gateway and sends what it answers once the turn is committed, so a client's
    ACK always follows the durable commit of its REQUEST."""

    name = "emqp"

    def __init__(self, config: Config, gateway: EmqpGateway, binder: Sockets):
        self.limits = config.limits  # (read_batch, turn_bytes: each socket's share of a turn)
        limit = config.max_message_size + 4096
        # Both ROUTERs: libzmq's defaults, set so that the bound is written down (docs/limits.md): a
        # client's pipelined REQUESTs wait in its pipe until a turn reads them; answers and jobs are what
        # the gateway sends, waiting in a backlog past the pipe.
        # (frames past --max-message-size, up to the old default, are read to be answered "too large")
        cap = config.limits.frame_bytes(config.max_message_size) + 4096
        hwm = {"SNDHWM": 1000, "RCVHWM": config.limits.pipe_messages(limit, 1000), "MAXMSGSIZE": cap}
        self.front = binder.bind(zmq.ROUTER, config.emqp_frontend_dsn, "--emqp-frontend-dsn", **hwm)
        self.back = binder.bind(zmq.ROUTER, config.emqp_backend_dsn, "--emqp-backend-dsn", **hwm)
        broker = gateway.broker
        self.publisher = Publisher(config, binder, broker) if config.emqp_publish_dsn else None
        self.replies = {
            FRONT: Replies(self.front, "emqp client", config.limits),
            BACK: Replies(self.back, "emqp worker", config.limits),
        }
        self.handed = Handed(broker)  # (REPLYs passed on to clients)
        self.kept_replies = KeptReplies(self.front, self.handed, self.replies[FRONT], config.limits)
        self.kept_jobs = KeptJobs(self.back, gateway, config.limits)
        self.binder = binder
        self._gates = {FRONT: binder.gate(self.front), BACK: binder.gate(self.back)}
        self.gateway = gateway
        # (tcp://: a worker whose connection closes is gone, and one that reads nothing is cut off)
        binder.on_disconnect[self.back] = gateway.disconnected
        self.stuck_workers = StuckReaders(
            "emqp worker", config.emqp_backend_dsn, lambda: binder.open_fds.get(self.back, set()), config.limits
        )
        self._set_sockets()
        self._out: list[Send] = []
        self._first = FRONT  # the socket read first: the other one when a turn's budget cut this one short
        self._may_free = 0  # REQUESTs and READYs read this turn, not handed a job yet

    def read(self, ready: dict, now: Now) -> None:
        budget = self.limits.turn_bytes  # (this endpoint's share; the turn's budget, shared, may end it first)
        sockets = [(FRONT, self.front), (BACK, self.back)]
        if self._first == BACK:  # (the one a spent budget cut short last time goes first)
            sockets.reverse()
        self._may_free = 0
        self._read(sockets, budget, ready, now)
        self._hand_out_now(now)

    def _read(self, sockets: list, budget: int, ready: dict, now: Now) -> None:
        """What ``read`` reads, the socket a spent budget cut short last turn first."""
        workers: list[tuple[bytes, int]] = []  # (worker, descriptor of the connection its command came over)
        try:
            self._read_sockets(sockets, budget, ready, now, workers)
        finally:
            if workers:
                # Connections that closed before these commands came are known gone first (a descriptor may
                # be reused); one the monitor does not know open is not mapped (its worker goes when silent).
                self.binder.drain_events(self.back)
                open_fds = self.binder.open_fds.get(self.back, set())
                for peer, fd in workers:
                    self.gateway.connection(peer, fd if fd in open_fds else -1)

    def _read_sockets(
        self, sockets: list, budget: int, ready: dict, now: Now, workers: list[tuple[bytes, int]]
    ) -> None:
        for name, sock in sockets:
            # (what came after the turn's poll too: a worker answers a job within a turn, and its REPLY
            # would otherwise wait for the next one, a turn more for each hop of a round trip)
            if sock not in ready and not events(sock) & POLLIN:
                continue
            for _ in range(self.limits.read_batch):
                if budget <= 0 or self.budget.spent():
                    break
                try:  # a worker's key is kept with it: a revocation drops the workers of that key
                    if name == BACK:
                        frames, user, fd = receive_with_fd(sock, self._gates[name], "emqp", NOBLOCK)
                        if frames is not None:
                            workers.append((frames[0], fd))
                    else:
                        frames, user = receive_from(sock, self._gates[name], "emqp", NOBLOCK)
                except Again:
                    break
                if frames is None:
                    continue
                size = sum(map(len, frames))
                budget -= size
                # A REQUEST or a READY may let a job out at once (see _hand_out_now): the record of
                # that job is drawn now, with the request's own, so the turn's records still bound it.
                frees = int(len(frames) > 3 and frames[3] in _MAY_FREE)
                self._may_free += frees
                self.budget.take(size, records=1 + frees)
                # Its ACKs cannot leave: store nothing more for it, rather than answers it would never get.
                if name == FRONT and self.replies[FRONT].refuses(frames[0], "its requests are discarded unstored"):
                    continue
                self._out += self.gateway.received(name, frames, now=now, user=user)
            if self.budget.spent():
                self._first = BACK if name == FRONT else FRONT
                return

    def _hand_out_now(self, now: Now) -> None:
        """Jobs for the REQUESTs and READYs just read, in the turn that read them: one at most for each
        (its record was drawn with it). Waiting for ``work`` would cost a turn whenever the budget ran
        out between the two tasks, and a round trip crosses it twice (a job out, its REPLY back). The
        job leaves after the turn's commit like any other, so it is durable before a worker gets it."""
        if self._may_free:
            jobs = self.gateway.hand_out(
                now=now,
                most=self._may_free,
                blocked=self.kept_jobs.blocked(),
                most_bytes=max(1, self.budget.bytes_left),
            )
            self._out += jobs
            self.budget.take(_bytes_of(jobs), records=0)  # (their records were drawn as they were read)
            self._may_free = 0

    def work(self, now: Now) -> None:
        # Connections of workers and subscribers that read nothing (a look is two system calls: each one
        # draws a record), then due schedules and heartbeats, then jobs a run at a time
        # (Limits.turn_chunk), each run drawn on the turn's records: workers may hold many free slots when
        # a backlog arrives at once.
        most = self.budget.records_for(self.limits.stuck_checks_per_turn)
        looked = self.publisher.turn(now.mono, most) if self.publisher is not None else 0
        looked += self.stuck_workers.check(now.mono, most - looked)
        if looked:
            self.budget.take(records=looked)
        blocked = self.kept_jobs.blocked()
        self._out += self.gateway.dispatch(now=now, most=0, blocked=blocked)
        while most := self.budget.records_for(self.limits.turn_chunk):
            # (their bodies draw on the turn's bytes, as native deliveries do: a 1 MiB job costs ~1 ms)
            jobs = self.gateway.hand_out(now=now, most=most, blocked=blocked, most_bytes=max(1, self.budget.bytes_left))
            self._out += jobs
            self.budget.take(_bytes_of(jobs), records=len(jobs))
            if len(jobs) < most:  # no free slot, nothing ready for one, or the turn's bytes are used
                break
        if self.gateway.parts.pending:  # big REQUESTs, a part per turn (gateways/parted.py)
            self._out += self.gateway.parts.step(self.budget, now.wall_us)

    def waiting(self) -> bool:
        # (a big REQUEST's part written this turn: committed now, so that no commit carries more)
        return bool(self._out) or self.gateway.parts.writing

    def rolled_back(self) -> None:
        out, self._out = self._out, []
        self._out = self.gateway.rolled_back(out) + self.gateway.parts.rolled_back()

    def recover(self) -> None:
        self.gateway.recover()

    def output_waiting(self) -> bool:
        return bool(self._out)

    def flush(self, now: Now) -> None:
        self.handed.collect()
        self.gateway.parts.flushed()
        for replies in self.replies.values():
            replies.flush()
        self.kept_replies.flush(now.mono)  # (after the answers: a REPLY never overtakes one waiting for its client)
        self.kept_jobs.flush(now.mono)
        out, self._out = self._out, []
        for send in out:
            if send.socket == PUB:  # (the gateway says PUBLISH only when there is a publish socket)
                if self.publisher is not None:
                    self.publisher.publish(send.frames, send.token)
            elif send.token is None:  # answers, heartbeats: small
                self.replies[send.socket].send(send.frames)
            elif send.socket == BACK:  # a job, charged to its worker as a delivery
                self.kept_jobs.send(send, now.mono)
            else:  # a worker's REPLY passed on, charged to its client while libzmq holds it
                self.kept_replies.send(send.frames, send.token, now.mono)

    def wake_at(self, now: float) -> float | None:
        if self.gateway.parts.pending:
            return now
        wake = self.gateway.next_wake(now)
        kept = self.kept_jobs.waiting() or self.kept_replies.waiting()
        if kept or any(r.wake_at(now) for r in self.replies.values()):  # a backlog waits for its peer
            wake = now + RETRY_S if wake is None else min(wake, now + RETRY_S)
        return wake

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        return [{**table, "gateway": self.name} for table in self.gateway.clients(now, limit, offset)]

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return self.gateway.queue_consumers(queue, limit)

    def stats(self) -> dict:
        figures = {
            **self.gateway.stats(),
            **self.gateway.parts.stats(),
            "jobs_kept_total": self.kept_jobs.kept_total,
            "workers_cut_total": self.stuck_workers.cut_total,  # (read nothing: pzq/endpoints/stuck.py)
            "replies_held_bytes": self.handed.bytes,  # (REPLYs passed on that libzmq still holds)
            "replies_dropped_total": self.kept_replies.dropped_total,
        }
        if self.publisher is not None:
            figures.update(self.publisher.stats())
        return figures

    def memory(self) -> dict[str, int]:
        # (jobs, and what libzmq holds of REPLYs and PUBLISHes, are charged to their payers: "deliveries")
        held = sum(r.backlog_bytes for r in self.replies.values()) + self.kept_replies.backlog_bytes
        return {
            "emqp_backlogs": held,
            "emqp_big": self.gateway.parts.held_bytes,  # (big REQUESTs and what waits behind them)
        }

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        # (a worker's right is on the queues it serves: the gateway re-checks each)
        dropped = self.gateway.narrow()
        if dropped:
            log.warning("eMQP: %d worker(s) whose key lost a queue's consume right dropped, jobs requeued", dropped)
        if lost.get("emqp-publish") and self.publisher is not None:
            self._rebind_pub()  # (a subscriber that may no longer read every topic fails its handshake)

    def revoked(self, users: set[str]) -> None:
        dropped = self.gateway.revoke(users)
        if dropped:
            log.warning("eMQP: %d worker(s) of revoked CURVE keys dropped, their jobs requeued", dropped)
        if self.publisher is not None and self.binder.gate(self.publisher.sock) is not None:
            self._rebind_pub()

    def _rebind_pub(self) -> None:
        # PUB sends to every subscriber alike: re-bind it so that every one authenticates again.
        if self.publisher is not None:
            self.publisher.rebind()
            self._set_sockets()

    def _set_sockets(self) -> None:
        # (the PUB never has input: it is polled so that libzmq handles its commands while the loop waits,
        # ending a departed subscriber's pipe and freeing what it held)
        self.sockets = [self.front, self.back] + ([self.publisher.sock] if self.publisher is not None else [])


def _bytes_of(jobs: list[Send]) -> int:
    return sum(len(send.frames[-1]) for send in jobs)
