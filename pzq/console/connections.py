"""The console's HTTP connections: uvicorn's h11 protocol with two bounds uvicorn lacks. uvicorn times
out only an idle kept-alive connection: one that opens and never finishes a request (or sends it a
byte at a time) would hold one of its LIMIT_CONCURRENCY places for ever, and 64 of them would leave
every other browser with 503. Here each request, from the moment the connection waits for it to the
end of its answer, has ``limits.console_connection_s`` (15 s); and one address (an IPv6 /64) holds at
most MAX_PER_ADDRESS connections at once, so that a single client cannot take every place."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from pzq.config import DEFAULT_LIMITS
from pzq.console.auth import source_of

log = logging.getLogger("pzq.console")

MAX_PER_ADDRESS = 16  # connections from one address (a browser opens up to 6 to a host)
REQUEST_S = DEFAULT_LIMITS.console_connection_s


class Connection(H11Protocol):
    """One HTTP connection of the console (uvicorn's h11 protocol, bounded as the module says)."""

    per_address: collections.Counter[str] = collections.Counter()  # (one event loop: no lock needed)
    refused_total = 0
    cut_total = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._source = source_of(self.client[0]) if self.client else "?"
        if Connection.per_address[self._source] >= MAX_PER_ADDRESS:
            Connection.refused_total += 1
            self._source = ""  # (not counted: nothing to give back)
            transport.close()
            return
        Connection.per_address[self._source] += 1
        self._await_request()

    def _await_request(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(REQUEST_S, self._cut)

    def _cut(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            Connection.cut_total += 1
            log.debug("console: a request from %s took over %g s: connection closed", self._source, REQUEST_S)
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._await_request()  # (the next request on this connection has its own REQUEST_S)

    def connection_lost(self, exc: Any) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._source:
            Connection.per_address[self._source] -= 1
            if Connection.per_address[self._source] <= 0:
                del Connection.per_address[self._source]
            self._source = ""
        super().connection_lost(exc)
