"""The eMQP endpoints: clients on the frontend ROUTER, workers on the backend ROUTER, PUBLISH on a PUB."""

from __future__ import annotations

import logging

import zmq

from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_from
from pzq.endpoints.replies import RETRY_S, Replies
from pzq.gateways.contract import Send
from pzq.gateways.emqp import BACK, FRONT, EmqpGateway
from pzq.zmqio import NOBLOCK, Again, send_frames

log = logging.getLogger("pzq.server")


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
        hwm = {"SNDHWM": 1000, "RCVHWM": config.limits.pipe_messages(limit, 1000), "MAXMSGSIZE": limit}
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

    def read(self, ready: dict, now: float, now_us: int) -> None:
        budget = self.limits.turn_bytes  # (this endpoint's share; the turn's budget, shared, may end it first)
        sockets = [(FRONT, self.front), (BACK, self.back)]
        if self._first == BACK:  # (the one a spent budget cut short last time goes first)
            sockets.reverse()
        for name, sock in sockets:
            if sock not in ready:
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
                self.budget.take(size)
                # Its ACKs cannot leave: store nothing more for it, rather than answers it would never get.
                if name == FRONT and self.replies[FRONT].refuses(frames[0], "its requests are discarded unstored"):
                    continue
                self._out += self.gateway.received(name, frames, now=now, now_us=now_us, user=user)
            if self.budget.spent():
                self._first = BACK if name == FRONT else FRONT
                return

    def work(self, now: float, now_us: int) -> None:
        self._out += self.gateway.dispatch(now=now, now_us=now_us)

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

    def clients(self, now: float, limit: int) -> list[dict]:
        return [{**table, "gateway": self.name} for table in self.gateway.clients(now, limit)]

    def stats(self) -> dict:
        return self.gateway.stats()

    def memory(self) -> dict[str, int]:
        return {"emqp_backlogs": sum(r.backlog_bytes for r in self.replies.values())}

    def revoked(self, users: set[str]) -> None:
        dropped = self.gateway.revoke(users)
        if dropped:
            log.warning("eMQP: %d worker(s) of revoked CURVE keys dropped, their jobs requeued", dropped)
        if self.pub is not None and self.binder.gate(self.pub) is not None:
            # PUB sends to every subscriber alike: re-bind it so that every one authenticates again.
            self.pub = self.binder.rebind(self.pub)
