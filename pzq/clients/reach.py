"""What a client socket's ZeroMQ monitor says about its connection, so that a client tells apart
"nothing listens there", "the server wants a CURVE key (another one, or none)" and "connected, and no
message came": the three look alike on the wire (silence) and must not to the person waiting.

The events: CONNECT_DELAYED and CONNECT_RETRIED until a peer accepts (a refused or absent endpoint retries
every 100 ms for ever), CONNECTED once one did, then HANDSHAKE_SUCCEEDED or HANDSHAKE_FAILED_* (libzmq
4.3: a plain client meeting a CURVE server, or a CURVE client meeting a plain one, fails with PROTOCOL
"mechanism mismatch" at once; a wrong server key with NO_DETAIL; a client key the server does not let in
with AUTH). A handshake failure is final in every client. Giving up on an endpoint where nothing listens
is a choice of the caller: a `pzq` command gives up after ``PATIENCE_S`` (``impatient()``, set by the
command line for its whole run); a library client keeps ZeroMQ's patience and reconnects until its own
timeout (a service may well start before its server).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import time
from collections.abc import Iterator
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from pzq.errors import CurveRefused, NotListening, NotPermitted

PATIENCE_S = 1.0  # a `pzq` command's wait for a connection: a loopback connect takes well under 1 ms
_patience: contextvars.ContextVar[float | None] = contextvars.ContextVar("pzq_reach_patience", default=None)
_watch_ids = itertools.count(1)  # (the inproc addresses of the clients' socket monitors)
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_EVERY = zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED | _FAILED
_MISMATCH = getattr(zmq, "PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", 0x11000002)


@contextlib.contextmanager
def impatient(seconds: float = PATIENCE_S) -> Iterator[None]:
    """Within it, a client socket (``pzq.clients.sockets.connect``) with no connection after ``seconds``
    raises NotListening, and one connected but not handshaken after ``seconds`` raises CurveRefused."""
    token = _patience.set(seconds)
    try:
        yield
    finally:
        _patience.reset(token)


def patience() -> float | None:
    """The wait for a connection in force (None: a library client's, ZeroMQ's own for ever)."""
    return _patience.get()


class Reach:
    """One client socket's connection as its monitor tells it, and the verdict on it (``check``).

    ``eager``: a refused connect (CONNECT_RETRIED before any CONNECTED) is final at once: for a probe
    of an endpoint that may well not be there (consume's batched endpoint beside --send-dsn), which a
    fallback then replaces without the wait."""

    def __init__(self, sock: zmq.Socket, endpoint: str, *, keyed: bool, wait_s: float | None, eager: bool = False):
        self.endpoint = endpoint
        self.keyed = keyed
        self.wait_s = wait_s
        self.eager = eager
        self.started = time.monotonic()
        self.connected_at: float | None = None
        self.handshaken = False
        self.retried = 0
        self.drops = 0  # DISCONNECTED events: a batched consumer starts afresh at each (consume_link.py)
        address = f"inproc://pzq-client-watch-{next(_watch_ids)}"
        sock.monitor(
            address, (_EVERY if wait_s is not None else zmq.EVENT_HANDSHAKE_FAILED_AUTH) | zmq.EVENT_DISCONNECTED
        )
        events = sock.context.socket(zmq.PAIR)
        events.setsockopt(zmq.LINGER, 0)
        # (unbounded, set before the connect: libzmq sends its events from its I/O thread and would block
        # that thread, every socket of the context, on a full pipe; an endpoint refused again and again
        # while its client does not read adds an event of ~100 bytes each reconnection, 10 a second)
        events.setsockopt(zmq.RCVHWM, 0)
        events.connect(address)
        self.events = events

    def check(self) -> None:
        """Read the events so far and raise what they mean: NotPermitted (the key is not let in),
        CurveRefused (a failed handshake, or none completed within the wait), NotListening (no
        connection within the wait); nothing while all may yet be well."""
        while self.events.poll(0):
            self._note(parse_monitor_message(self.events.recv_multipart()))
        if self.wait_s is None or self.handshaken:
            return
        now = time.monotonic()
        if self.connected_at is None:
            if self.eager and self.retried or now - self.started >= max(self.wait_s, 1e-3):
                raise NotListening(self._nothing(now))
        elif now - self.connected_at >= self.wait_s:
            raise CurveRefused(
                f"the server at {self.endpoint} took the connection but no ZeroMQ handshake completed within "
                f"{self.wait_s:g} s: it wants a CURVE key (or refused ours), or it is not a ZeroMQ server"
            )

    def at_end(self) -> None:
        """A wait ended in silence: NotListening if no connection was ever made (a wait shorter than
        the patience), else nothing (the caller says no message came)."""
        self.check()
        if self.wait_s is not None and self.connected_at is None:
            raise NotListening(self._nothing(time.monotonic()))

    def due(self) -> float | None:
        """The monotonic time at which ``check`` may next have a verdict without a new event."""
        if self.wait_s is None or self.handshaken:
            return None
        return (self.connected_at if self.connected_at is not None else self.started) + self.wait_s

    def close(self) -> None:
        self.events.close(linger=0)

    def _note(self, event: Any) -> None:  # (pyzmq's _MonitorMessage: event, value, endpoint)
        kind = event["event"]
        if kind == zmq.EVENT_CONNECTED:
            self.connected_at = time.monotonic()
        elif kind == zmq.EVENT_CONNECT_RETRIED:
            self.retried += 1
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.handshaken = True
        elif kind == zmq.EVENT_DISCONNECTED:
            self.drops += 1
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            raise NotPermitted(
                f"not permitted: pzq at {self.endpoint} refused this client's CURVE key (it is not one of "
                "its clients, or its permissions do not give it this socket's right)"
            )
        elif kind & _FAILED:
            raise CurveRefused(self._failed(kind, int(event["value"])))

    def _failed(self, kind: int, value: int) -> str:
        at = f"the server at {self.endpoint}"
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MISMATCH and self.keyed:
            return f"{at} does not use CURVE: leave out --curve-client-key and --curve-server-key"
        if not self.keyed:  # (a mechanism mismatch, or the server closing on a NULL greeting: errno in value)
            return f"{at} wants a CURVE key: give --curve-client-key and --curve-server-key"
        if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            # (a wrong server key, or a server without CURVE closing on the greeting: ipc says no more)
            return f"{at} refused the CURVE handshake: is --curve-server-key its public key, and does it use CURVE?"
        return f"{at} broke the CURVE handshake (protocol error {value:#x}): is it pzq?"

    def _nothing(self, now: float) -> str:
        waited = f"{now - self.started:.1f} s" if now - self.started >= 0.05 else "at once"
        why = "refused or unreachable" if self.retried else "not answered"
        return f"nothing listens at {self.endpoint} (connecting was {why}, {waited}): is pzq running there?"


class WatchedSocket(zmq.Socket):
    """A client socket with a ``Reach``: its blocking sends (and ``sockets.receive``) give up as soon as
    the monitor has a verdict. A DEALER or REQ whose handshake failed has no pipe left (libzmq drops it)
    and a blocking send would otherwise wait for ever."""

    reach: Reach | None = None

    def watch(self, endpoint: str, *, keyed: bool, eager: bool = False) -> None:
        """Start the monitor (before the connect: the first event may come at once)."""
        self.reach = Reach(self, endpoint, keyed=keyed, wait_s=patience(), eager=eager)

    def send(self, data: Any, flags: int = 0, copy: bool = True, track: bool = False, **kwargs: Any) -> Any:  # type: ignore[override]
        reach = self.reach
        if reach is None or flags & zmq.NOBLOCK:
            return super().send(data, flags, copy=copy, track=track, **kwargs)
        poller = zmq.Poller()
        poller.register(self, zmq.POLLOUT)
        poller.register(reach.events, zmq.POLLIN)
        while True:
            try:
                return super().send(data, flags | zmq.NOBLOCK, copy=copy, track=track, **kwargs)
            except zmq.Again:
                reach.check()
                due = reach.due()
                poller.poll(None if due is None else max(1, round((due - time.monotonic()) * 1000)))

    def close(self, linger: int | None = None) -> None:
        # (the monitor goes first: libzmq would send its events to a reader that is no more)
        reach, self.reach = self.reach, None
        if reach is not None and not self.closed:
            self.monitor(None, 0)
            reach.close()
        super().close(linger=linger)
