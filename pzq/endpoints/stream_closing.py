"""The connections a raw-TCP endpoint closes itself: a close frame sent to each (tried again next turn
while its pipe is full), and each remembered a while after, since a STREAM socket sends no notice of a
close of ours and the peer's last bytes may still arrive (they are dropped, not read as a new peer's)."""

from __future__ import annotations

import zmq

from pzq.zmqio import NOBLOCK, Again, send_frames

CLOSED_MEMORY_S = 60.0  # how long a connection we closed is remembered (STREAM sends no notice for it)


class Closing:
    """``pending``: connections to close at the next flush; ``closed``: closed by us, and when. Both are
    read by the endpoint's read loop at each chunk, so they are plain attributes."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.closed: dict[bytes, float] = {}

    def send(self, sock: zmq.Socket, now: float) -> None:
        """Send the pending close frames; forget the connections closed more than CLOSED_MEMORY_S ago."""
        closing, self.pending = self.pending, []
        for conn in closing:
            try:
                send_frames(sock, [conn, b""], NOBLOCK)  # an empty frame closes a STREAM peer
            except Again:  # its pipe is full (a slow reader): try again next turn
                self.pending.append(conn)
                continue
            except zmq.ZMQError:  # already gone
                pass
            self.closed[conn] = now
        if self.closed:
            for conn in [c for c, t in self.closed.items() if now - t > CLOSED_MEMORY_S]:
                del self.closed[conn]
