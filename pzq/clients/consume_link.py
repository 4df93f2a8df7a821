"""A batched consumer's connection as its ZeroMQ socket monitor tells it: ``Link`` reads the socket and the
monitor's DISCONNECTED in one wait, so that a consumer whose server went away (killed, restarted, a power
cut, the network) hears it at once and starts afresh, instead of at its next keepalive (a third of the
server's ``idle_us``: 20 s, while it waited with its credit granted and nothing came).

ZeroMQ reconnects a DEALER by itself, but a new connection is a new consumer to the server: what the old
one held went back to the queue (at the disconnect over tcp://, at the restart's recovery) and its credit
is forgotten; nothing on the wire says so until the consumer speaks. The monitor does.
"""

from __future__ import annotations

import itertools
import time

import zmq

from pzq.clients.reach import WatchedSocket

_ids = itertools.count(1)  # (the inproc addresses of these monitors)
# A connection to a host that lost power (or froze, or a server stopped) is not closed: nothing tells the
# monitor. A ZMTP PING each second (answered by the server's libzmq I/O thread: no Python on either side,
# nothing on the receive loop) and SILENCE_S without a word from the server drops it (DISCONNECTED); each
# reconnection attempt gives up after a second, so that one lost to a host still down (its SYNs
# unanswered, retried by the kernel for minutes) does not hold the next one back once the host is up.
HEARTBEAT_S = 1.0
SILENCE_S = 5.0
OPTIONS: dict[int, int] = {
    zmq.HEARTBEAT_IVL: round(HEARTBEAT_S * 1000),
    zmq.HEARTBEAT_TIMEOUT: round(SILENCE_S * 1000),
    zmq.CONNECT_TIMEOUT: 1000,
}


class Dropped:
    """What a consumer's wait returns when its connection dropped (its state on the server is gone)."""


DROPPED = Dropped()


class Link:
    """One consumer socket and its monitor's DISCONNECTED events. A ``WatchedSocket`` (CURVE, or a `pzq`
    command's) has its monitor already, its ``Reach`` counting the drops; any other gets one of its own,
    told only DISCONNECTED (nothing read while all is well)."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        self.reach = sock.reach if isinstance(sock, WatchedSocket) else None
        self.own: zmq.Socket | None = None
        if self.reach is not None:
            self.events = self.reach.events
            self._drops = self.reach.drops
        else:
            address = f"inproc://pzq-consume-link-{next(_ids)}"
            sock.monitor(address, zmq.EVENT_DISCONNECTED)
            events = sock.context.socket(zmq.PAIR)
            events.setsockopt(zmq.LINGER, 0)
            events.setsockopt(zmq.RCVHWM, 0)  # (libzmq's I/O thread must never block on it: reach.py says why)
            events.connect(address)
            self.events = self.own = events
        self.dropped = False
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self.events, zmq.POLLIN)

    def read(self, timeout_ms: int) -> list[bytes] | None:
        """The next message, or None if none came within ``timeout_ms`` or the connection dropped
        (``dropped`` then says so); a ``WatchedSocket``'s verdicts (NotListening, ...) as ``receive``."""
        deadline = time.monotonic() + timeout_ms / 1000
        reach = self.reach
        wake = deadline
        while True:
            if reach is not None:
                reach.check()  # (its sends read the events too: the count tells what they saw)
                if reach.drops != self._drops:
                    self.dropped = True
                    return None
                due = reach.due()
                wake = deadline if due is None else min(deadline, due)
            # (one poll of both, a poller kept: no dearer than the socket's own poll, which makes a poller)
            ready = dict(self._poller.poll(max(0, round((wake - time.monotonic()) * 1000))))
            if self.events in ready:
                self._note()
            if self.sock in ready:
                return self.sock.recv_multipart()
            if self.dropped:
                return None
            if time.monotonic() >= deadline:
                if reach is not None:
                    reach.at_end()
                return None

    def sockets(self) -> tuple[zmq.Socket, zmq.Socket]:
        """What to poll to learn that ``read`` has something: the socket and its monitor."""
        return self.sock, self.events

    def _note(self) -> None:
        if self.reach is not None:
            self.reach.check()
            self.dropped = self.dropped or self.reach.drops != self._drops
            return
        assert self.own is not None
        while self.own.poll(0):
            self.own.recv_multipart()  # (only DISCONNECTED is asked for)
            self.dropped = True

    def close(self) -> None:
        """Stop the monitor this link started (a WatchedSocket's goes with the socket)."""
        own, self.own = self.own, None
        if own is not None:
            if not self.sock.closed:
                self.sock.disable_monitor()
            own.close(linger=0)
