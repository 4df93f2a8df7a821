"""The monitor endpoint: REQ clients asking MONITOR, STATS, DEADLETTERS or REQUEUE."""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from pzq.admin import Admin
from pzq.config import Config
from pzq.endpoints.base import Endpoint, Sockets, receive
from pzq.endpoints.replies import Replies
from pzq.errors import StoreError
from pzq.protocols import monitor as monitor_proto

log = logging.getLogger("pzq.server")

READ_BATCH = 64


class MonitorEndpoint(Endpoint):
    """Answers after the turn's commit, so the figures include the turn. A REQUEUE commits on its own:
    ``wrote`` is then called; a store failure while answering calls ``failed`` (the server's rollback)."""

    name = "monitor"

    def __init__(
        self, config: Config, admin: Admin, binder: Sockets, *, wrote: Callable[[], None], failed: Callable[[], None]
    ):
        self.admin = admin
        # Answers may be large (a line per queue): only a few wait in one client's pipe.
        self.sock = binder.bind(zmq.ROUTER, config.monitor_dsn, "--monitor-dsn", SNDHWM=16)
        self.sockets = [self.sock]
        self.replies = Replies(self.sock, "monitor")
        self._gate = binder.gate(self.sock)
        self._wrote = wrote
        self._failed = failed
        self._requests: list[monitor_proto.Request] = []

    def read(self, ready: dict, now: float, now_us: int) -> None:
        if self.sock not in ready:
            return
        for _ in range(READ_BATCH):
            try:
                frames = receive(self.sock, self._gate, "monitor", zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames is not None and not self.replies.refuses(frames[0], "its requests go unanswered"):
                self._requests.append(monitor_proto.parse_request(frames))

    def flush(self, now: float, now_us: int) -> None:
        self.replies.flush()
        requests, self._requests = self._requests, []
        for request in requests:
            try:
                text, wrote = self.admin.answer(request)
                if wrote:
                    self._wrote()
            except StoreError as exc:
                log.exception("monitor request %s failed", request.command)
                self._failed()
                text = monitor_proto.error_text(str(exc))
            self.replies.send(monitor_proto.reply(request, text))

    def wake_at(self, now: float) -> float | None:
        return self.replies.wake_at(now)
