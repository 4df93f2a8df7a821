"""What every endpoint adapter offers the server loop; each step has a do-nothing default."""
from __future__ import annotations

import zmq

from pzq.errors import ConfigError


class Sockets:
    """Makes the server's bound sockets: remembers them (to close them), and sets options before the
    bind, where libzmq copies them into the listener (options set later never reach the connections
    it accepts). With CURVE configured, every tcp:// ZeroMQ endpoint is a CURVE server."""

    def __init__(self, ctx: zmq.Context, curve: dict[str, object] | None = None):
        self.ctx = ctx
        self.curve = curve
        self.owned: list[zmq.Socket] = []

    def bind(self, kind: int, endpoint: str, option: str, **options) -> zmq.Socket:
        """A socket of ``kind`` bound to ``endpoint`` (linger 0 unless given); ConfigError naming
        ``option`` if it cannot bind."""
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve and endpoint.startswith("tcp://") and kind != zmq.STREAM:
            options = {**self.curve, **options}
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            sock.close()
            raise ConfigError(f"{option} {endpoint}: cannot bind: {exc}") from None
        self.owned.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.owned:
            sock.close()
        self.owned.clear()


class Endpoint:
    """One endpoint's turn: ``read`` and ``work`` before the commit, ``flush`` after it (or
    ``rolled_back`` first, when the commit failed and the turn's writes are gone)."""

    name = ""
    sockets: list[zmq.Socket]  # polled for input

    def before_poll(self, poller: zmq.Poller) -> None:
        """Adjust what the poller waits for (e.g. writability) before the turn's poll."""

    def read(self, ready: dict, now: float, now_us: int) -> None:
        """Read what arrived on this endpoint's sockets (bounded per turn)."""

    def work(self, now: float, now_us: int) -> None:
        """Hand out messages, heartbeats and schedules: the turn's writes before the commit."""

    def waiting(self) -> bool:
        """True if output of this turn waits for the commit (a producer's ack, a delivery)."""
        return False

    def rolled_back(self) -> None:
        """The turn's writes were rolled back: turn pending acks into errors, drop deliveries."""

    def flush(self, now: float, now_us: int) -> None:
        """Send the turn's output; the commit it depends on is done."""

    def recover(self) -> None:
        """The broker restarted from the disk (a failed turn): forget what was in flight."""

    def wake_at(self, now: float) -> float | None:
        """The monotonic time this endpoint needs a turn by, if any (heartbeats, schedules)."""
        return None

    def stats(self) -> dict | None:
        """This endpoint's monitor figures, or None to report nothing."""
        return None
