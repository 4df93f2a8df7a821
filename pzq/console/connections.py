"""The console's HTTP connections: uvicorn's h11 protocol with two bounds uvicorn lacks. uvicorn times
out only an idle kept-alive connection: one that opens and never finishes a request (or sends it a
byte at a time) would hold one of its LIMIT_CONCURRENCY places for ever, and 64 of them would leave
every other browser with 503. Here each request, from the moment the connection waits for it to the
end of its answer, has ``limits.console_connection_s`` (15 s); and once MOST connections are open, a
new one closes the one that has waited longest for its client: for a request not yet whole (half sent,
or none yet on a kept-alive connection) or for its answer to be read. A browser sends its request as
soon as it connects, so the newest is never the one closed: a slow or half-sent request never refuses
a fast one, whatever address each comes from. (A cap of 16 connections an address did: 16 half-sent
requests held open from 127.0.0.1 refused 38 of 40 page loads, and every loopback browser, and every
browser behind a proxy, has that address.)"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from pzq.config import DEFAULT_LIMITS
from pzq.console.auth import source_of

log = logging.getLogger("pzq.console")

# Connections kept open at once: one under uvicorn's limit_concurrency (pzq/console/server.py), whose
# count includes the connection a request comes on, so that a request on the newest is never a 503
MOST = 63
REQUEST_S = DEFAULT_LIMITS.console_connection_s


class Connection(H11Protocol):
    """One HTTP connection of the console (uvicorn's h11 protocol, bounded as the module says)."""

    # Connections waiting for their client (a request not yet whole, an answer not read), the one that
    # has waited longest first; and the count of those open (one event loop: no lock needed)
    waiting: ClassVar[collections.OrderedDict[Connection, None]] = collections.OrderedDict()
    opened = 0
    evicted_total = 0
    cut_total = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._source = source_of(self.client[0]) if self.client else "?"
        self._counted = True
        Connection.opened += 1
        self._await_request()
        if Connection.opened > MOST:
            self._make_room()

    def _make_room(self) -> None:
        """Close the connection that has waited longest for its client (none: every other one is in a
        request the console answers, and uvicorn says 503 to this one's until one ends)."""
        for oldest in Connection.waiting:
            if oldest is self:
                return
            Connection.evicted_total += 1
            log.debug("console: %d connections open: the one from %s waiting longest closed", MOST, oldest._source)
            oldest._close()
            return

    def _await_request(self) -> None:
        """The connection waits for its next request: from now, REQUEST_S for it and its answer."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(REQUEST_S, self._cut)
        Connection.waiting.pop(self, None)
        Connection.waiting[self] = None

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            Connection.waiting.pop(self, None)  # (a whole request: the console is answering it)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._counted:
            Connection.waiting.pop(self, None)
            Connection.waiting[self] = None  # (its client does not read its answer: waits for it from now)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.cycle is not None and not self.cycle.response_complete:
            Connection.waiting.pop(self, None)

    def _cut(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            Connection.cut_total += 1
            log.debug("console: a request from %s took over %g s: connection closed", self._source, REQUEST_S)
            self._close()

    def _close(self) -> None:
        self._release()
        self.transport.close()

    def _release(self) -> None:
        """No longer counted (closed by the console, or gone): once, whichever comes first."""
        Connection.waiting.pop(self, None)
        if self._counted:
            self._counted = False
            Connection.opened -= 1

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._await_request()  # (the next request on this connection has its own REQUEST_S)
        super().on_response_complete()  # (which may begin a request the client sent already)

    def connection_lost(self, exc: Any) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._release()
        super().connection_lost(exc)
