"""The eMQP endpoints: clients on the frontend ROUTER, workers on the backend ROUTER, PUBLISH on a PUB."""

from __future__ import annotations

import logging

import zmq

from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_from
from pzq.endpoints.replies import RETRY_S, Replies
from pzq.gateways.contract import Send
from pzq.gateways.emqp import BACK, FRONT, EmqpGateway
from pzq.zmqio import NOBLOCK, POLLIN, Again, events, send_frames

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
        # PUB drops what a subscriber cannot take past SNDHWM (fire and forget); it reads subscriptions only.
        self.pub = (
            binder.bind(zmq.PUB, config.emqp_publish_dsn, "--emqp-publish-dsn", SNDHWM=1000, RCVHWM=1000)
            if config.emqp_publish_dsn
            else None
        )
        self.sockets = [self.front, self.back]
        self.replies = {
            FRONT: Replies(self.front, "emqp client", config.limits),
            BACK: Replies(self.back, "emqp worker", config.limits),
        }
        self.binder = binder
        self._gates = {FRONT: binder.gate(self.front), BACK: binder.gate(self.back)}
        self.gateway = gateway
        self._out: list[Send] = []
        self._first = FRONT  # the socket read first: the other one when a turn's budget cut this one short
        self._may_free = 0  # REQUESTs and READYs read this turn, not handed a job yet

    def read(self, ready: dict, now: float, now_us: int) -> None:
        budget = self.limits.turn_bytes  # (this endpoint's share; the turn's budget, shared, may end it first)
        sockets = [(FRONT, self.front), (BACK, self.back)]
        if self._first == BACK:  # (the one a spent budget cut short last time goes first)
            sockets.reverse()
        self._may_free = 0
        self._read(sockets, budget, ready, now, now_us)
        self._hand_out_now(now, now_us)

    def _read(self, sockets: list, budget: int, ready: dict, now: float, now_us: int) -> None:
        """What ``read`` reads, the socket a spent budget cut short last turn first."""
        for name, sock in sockets:
            # (what came after the turn's poll too: a worker answers a job within a turn, and its REPLY
            # would otherwise wait for the next one, a turn more for each hop of a round trip)
            if sock not in ready and not events(sock) & POLLIN:
                continue
            for _ in range(self.limits.read_batch):
                if budget <= 0 or self.budget.spent():
                    break
                try:  # a worker's key is kept with it: a revocation drops the workers of that key
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
                self._out += self.gateway.received(name, frames, now=now, now_us=now_us, user=user)
            if self.budget.spent():
                self._first = BACK if name == FRONT else FRONT
                return

    def _hand_out_now(self, now: float, now_us: int) -> None:
        """Jobs for the REQUESTs and READYs just read, in the turn that read them: one at most for each
        (its record was drawn with it). Waiting for ``work`` would cost a turn whenever the budget ran
        out between the two tasks, and a round trip crosses it twice (a job out, its REPLY back). The
        job leaves after the turn's commit like any other, so it is durable before a worker gets it."""
        if self._may_free:
            self._out += self.gateway.hand_out(now=now, now_us=now_us, most=self._may_free)
            self._may_free = 0

    def work(self, now: float, now_us: int) -> None:
        # Due schedules and heartbeats, then jobs a run at a time (Limits.turn_chunk), each run drawn on
        # the turn's records: workers may hold many free slots when a backlog arrives at once.
        self._out += self.gateway.dispatch(now=now, now_us=now_us, most=0)
        while most := self.budget.records_for(self.limits.turn_chunk):
            jobs = self.gateway.hand_out(now=now, now_us=now_us, most=most)
            self._out += jobs
            self.budget.take(records=len(jobs))
            if len(jobs) < most:  # no free slot, or nothing ready for one
                return

    def waiting(self) -> bool:
        return bool(self._out)

    def rolled_back(self) -> None:
        out, self._out = self._out, []
        self._out = self.gateway.rolled_back(out)

    def recover(self) -> None:
        self.gateway.recover()

    def flush(self, now: float, now_us: int) -> None:
        for replies in self.replies.values():
            replies.flush()
        out, self._out = self._out, []
        for target, frames, _, _ in out:
            if target in self.replies:
                self.replies[target].send(frames)
                continue
            if self.pub is None:
                continue  # (the gateway says PUBLISH only when there is a publish socket)
            try:  # PUB: fire and forget, as ZeroMQ's publish-subscribe is (a slow subscriber misses some)
                send_frames(self.pub, frames, NOBLOCK)
            except Again:
                log.warning("eMQP publish socket full: a PUBLISH to %r was dropped", frames[0][:40])

    def wake_at(self, now: float) -> float | None:
        wake = self.gateway.next_wake(now)
        if any(r.wake_at(now) for r in self.replies.values()):  # a backlog waits for its peer
            wake = now + RETRY_S if wake is None else min(wake, now + RETRY_S)
        return wake

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]:
        return [{**table, "gateway": self.name} for table in self.gateway.clients(now, limit, offset)]

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]:
        return self.gateway.queue_consumers(queue, limit)

    def stats(self) -> dict:
        return self.gateway.stats()

    def memory(self) -> dict[str, int]:
        return {"emqp_backlogs": sum(r.backlog_bytes for r in self.replies.values())}

    def narrowed(self, lost: dict[str, set[str]]) -> None:
        # (a worker's right is on the queues it serves: the gateway re-checks each)
        dropped = self.gateway.narrow()
        if dropped:
            log.warning("eMQP: %d worker(s) whose key lost a queue's consume right dropped, jobs requeued", dropped)
        if lost.get("emqp-publish") and self.pub is not None:
            self._rebind_pub()  # (a subscriber that may no longer read every topic fails its handshake)

    def revoked(self, users: set[str]) -> None:
        dropped = self.gateway.revoke(users)
        if dropped:
            log.warning("eMQP: %d worker(s) of revoked CURVE keys dropped, their jobs requeued", dropped)
        if self.pub is not None and self.binder.gate(self.pub) is not None:
            self._rebind_pub()

    def _rebind_pub(self) -> None:
        # PUB sends to every subscriber alike: re-bind it so that every one authenticates again.
        if self.pub is not None:
            self.pub = self.binder.rebind(self.pub)
