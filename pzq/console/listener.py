"""The console's listening socket and its connection limits: how many connections at once (in all and
from one address), how many a second (in all and from one address), and each connection's whole life.
A connection past a limit is closed before it costs a thread: the loop shares the interpreter's lock
with every request handled."""

from __future__ import annotations

import collections
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.console.auth import source_of

log = logging.getLogger("pzq.console")

MAX_CONNECTIONS = 16
RENDERING = 2  # requests handled at once (the rest wait their turn): the loop shares the GIL with them
MAX_SOURCES = 4096  # addresses whose rate is remembered (the least recent are forgotten)
SOURCE_PER_S = 20  # accepted a second from one address (an IPv6 /64), in bursts of twice that
MAX_PER_ADDRESS = 8  # connections from one address: one client cannot take every slot


class Listener(ThreadingHTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS of them and MAX_PER_ADDRESS from one address:
    one past that is closed at once, so that connections that never finish a request cannot pile up
    threads. Each connection has ``limits.console_connection_s`` in all (not per read: a client that
    sends a byte every few seconds is cut off all the same), and ``limits.console_connections_per_s``
    are accepted a second in all, in bursts of as many."""

    daemon_threads = True
    request_queue_size = 128  # (the listen backlog: socketserver's 5 drops a browser's burst)

    def __init__(self, address: tuple[str, int], handler: type, limits: Limits = DEFAULT_LIMITS) -> None:
        self.connection_s = limits.console_connection_s
        self.connections_per_s = limits.console_connections_per_s
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.rendering = threading.BoundedSemaphore(RENDERING)
        self.tokens, self.filled = float(self.connections_per_s), time.monotonic()
        self.sources: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        self.trusted: Callable[[str], bool] = lambda address: False  # (the console's logins say)
        self.per_address: collections.Counter[str] = collections.Counter()
        self.count_lock = threading.Lock()
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self.spend(client_address[0]):
            self.shutdown_request(request)
            return
        address = client_address[0]
        with self.count_lock:
            crowded = self.per_address[address] >= MAX_PER_ADDRESS
            if not crowded:
                self.per_address[address] += 1
        if crowded or not self.slots.acquire(blocking=False):
            if not crowded:
                self._forget(address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            self._forget(address)
            raise

    def process_request_thread(self, request, client_address) -> None:
        deadline = threading.Timer(self.connection_s, _cut, (request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self.slots.release()
            self._forget(client_address[0])

    def spend(self, address: str) -> bool:
        """Take a connection's tokens: False past SOURCE_PER_S from its address, or past
        ``connections_per_s`` in all unless the address has logged in before (a flood is closed before
        it costs a thread: the loop shares the GIL with every request handled; and a flood from one
        address, or from strangers, leaves the operator's browser served)."""
        source, trusted = source_of(address), self.trusted(address)
        per_s = self.connections_per_s
        with self.count_lock:
            now = time.monotonic()
            tokens, filled = self.sources.pop(source, (2.0 * SOURCE_PER_S, now))
            tokens = min(2.0 * SOURCE_PER_S, tokens + (now - filled) * SOURCE_PER_S)
            self.tokens = min(float(per_s), self.tokens + (now - self.filled) * per_s)
            self.filled = now
            allowed = tokens >= 1 and (trusted or self.tokens >= 1)
            if allowed:
                tokens -= 1
                self.tokens = max(0.0, self.tokens - 1)
            self.sources[source] = (tokens, now)
            while len(self.sources) > MAX_SOURCES:
                self.sources.popitem(last=False)
            return allowed

    def _forget(self, address: str) -> None:
        with self.count_lock:
            self.per_address[address] -= 1
            if self.per_address[address] <= 0:
                del self.per_address[address]

    def handle_error(self, request, client_address) -> None:
        # (a browser that went away mid-answer, a connection cut at its deadline: one line, not a trace)
        log.debug("console: connection from %s ended: %s", client_address[0], sys.exc_info()[1])


def _cut(connection: socket.socket) -> None:
    """End a connection past its deadline: its thread's blocked read or write returns at once."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
