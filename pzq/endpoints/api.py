"""The API endpoint: request/reply for the Spark connector, answered by the API gateway."""

from __future__ import annotations

import time

import zmq

from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive_from
from pzq.endpoints.replies import Replies
from pzq.gateways.contract import ONLY, FramesGateway, Send
from pzq.zmqio import NOBLOCK, Again

# Limits.api_turn_work_s: the time one turn spends carrying out API requests before it lets others in;
# Limits.api_replies_unread: replies (up to api_reply_bytes each) waiting in one client's pipe.


class ApiEndpoint(Endpoint):
    """Every reply leaves after the commit of what its request changed."""

    name = "api"

    def __init__(self, config: Config, gateway: FramesGateway, binder: Sockets):
        self.limits = config.limits  # (read_batch, turn_bytes: each socket's share of a turn)
        self.gateway = gateway
        self.turn_work_s = config.limits.api_turn_work_s
        self.sock = binder.bind(
            zmq.ROUTER,
            config.api_dsn,
            "--api-dsn",
            MAXMSGSIZE=config.max_message_size + (8 << 20),
            SNDHWM=config.limits.api_replies_unread,
        )  # replies may be MiBs: few wait in a client's pipe
        self.sockets = [self.sock]
        self.replies = Replies(self.sock, "api", config.limits)
        self._gate = binder.gate(self.sock)
        self._out: list[Send] = []

    def read(self, ready: dict, now: float, now_us: int) -> None:
        if self.sock not in ready:
            return
        budget, started = self.limits.turn_bytes, time.perf_counter()
        for _ in range(self.limits.read_batch):
            # One LEASE or PRODUCE may take a while: after turn_work_s of them, the rest wait for the
            # next turn, so that pipelined requests cannot hold every other client for seconds.
            if budget <= 0 or time.perf_counter() - started > self.turn_work_s or self.budget.spent():
                return
            try:  # the client's key goes with the request: consumer groups belong to one key
                frames, user = receive_from(self.sock, self._gate, "api", NOBLOCK)
            except Again:
                return
            size = sum(map(len, frames or ()))
            budget -= size
            self.budget.take(size)  # (the turn's budget, shared by every endpoint)
            if frames is None:
                continue
            if self.replies.refuses(frames[0], "its requests are dropped unanswered (it resends)"):
                continue
            self._out += self.gateway.received(ONLY, frames, now=now, now_us=now_us, user=user)

    def waiting(self) -> bool:
        return bool(self._out)

    def rolled_back(self) -> None:
        out, self._out = self._out, []
        self._out = self.gateway.rolled_back(out)

    def recover(self) -> None:
        self.gateway.recover()

    def flush(self, now: float, now_us: int) -> None:
        self.replies.flush()
        out, self._out = self._out, []
        for send in out:
            self.replies.send(send.frames)

    def wake_at(self, now: float) -> float | None:
        return self.replies.wake_at(now)

    def clients(self, now: float, limit: int) -> list[dict]:
        return [{**table, "gateway": self.name} for table in self.gateway.clients(now, limit)]

    def stats(self) -> dict:
        return self.gateway.stats()
