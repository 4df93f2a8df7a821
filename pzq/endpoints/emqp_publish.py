"""The eMQP PUB socket (--emqp-publish-dsn): each PUBLISH fanned out to every subscriber, bounded in bytes.

A PUB cannot be told to wait, and ZeroMQ's publish-subscribe is lossy by design: what a subscriber's pipe
cannot take (SNDHWM messages unread) it misses. What pzq adds:

- Its bytes are charged to its publisher while libzmq holds them (pzq/endpoints/handed.py: one buffer
  shared by every subscriber's pipe, sent zero-copy and known gone when libzmq frees it), so they count
  in the memory bound, and a publisher is handed to libzmq at most its share (``Limits.delivery_share``,
  one message at least): a PUBLISH past it is dropped, counted (``publish_refused_total``) and logged.
- A subscriber whose pipe is full is counted and logged (``publish_missed_total``): the socket refuses
  the PUBLISH (XPUB_NODROP) and it is sent again to the others (the one behind misses it, and the next
  ones until it has read past libzmq's low-water mark).
- A subscriber that reads nothing is cut off (pzq/endpoints/stuck.py), counted and logged: what its pipe
  held is dropped, and the PUBLISHes it pinned no longer count against their publishers.
- The socket is polled every turn though it never has input: libzmq ends a departed subscriber's pipe
  (and frees what it held) only when the socket handles its commands, and pzq used to touch it only to
  send, so 700 MiB published to a subscriber that then closed stayed held until the next PUBLISH.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

import zmq

from pzq.config import Config
from pzq.endpoints.base import Sockets
from pzq.endpoints.handed import Handed
from pzq.endpoints.stuck import StuckReaders
from pzq.gateways.contract import BrokerSurface
from pzq.logs import warn_bad
from pzq.zmqio import NOBLOCK, Again, events, send_frames

log = logging.getLogger("pzq.server")

SUBSCRIBER_PIPE = 1000  # messages a subscriber's pipe holds (SNDHWM): libzmq's default, dropped past it
# A subscription (a prefix of the topics wanted, after its 1 byte): libzmq files each one in a trie, ~45
# bytes of memory for each of its bytes, in the thread that uses the socket (the loop); without a bound
# on the frame a subscription of 500 MB grew the server past 13 GB. One past this cuts its subscriber off.
# (Its frame: a byte before the topic under ZMTP 3.0, a SUBSCRIBE command's 10 under 3.1)
SUBSCRIPTION_BYTES = 4096
SUBSCRIPTION_FRAME = SUBSCRIPTION_BYTES + 10


class Publisher:
    """The PUB socket, what its pipes hold, and its subscribers that read nothing."""

    def __init__(self, config: Config, binder: Sockets, broker: BrokerSurface):
        self.binder = binder
        self.dsn = config.emqp_publish_dsn
        # (XPUB_NODROP: a send that a full pipe would drop fails instead, which is how it is counted)
        self.sock = binder.bind(
            zmq.PUB,
            self.dsn,
            "--emqp-publish-dsn",
            SNDHWM=SUBSCRIBER_PIPE,
            RCVHWM=1000,
            MAXMSGSIZE=SUBSCRIPTION_FRAME,
            XPUB_NODROP=1,
        )
        self.handed = Handed(broker)
        self.stuck = StuckReaders(
            "emqp publish", self.dsn, lambda: binder.open_fds.get(self.sock, set()), config.limits
        )
        self.sent_total = 0
        self.refused_total = 0  # PUBLISHes past their publisher's share (dropped, logged)
        self.missed_total = 0  # sends a subscriber's full pipe missed (logged)

    def publish(self, frames: list[bytes], payer: Hashable) -> None:
        """Fan ``[topic, payload]`` out to the subscribers, charged to ``payer`` while libzmq holds it."""
        size = sum(map(len, frames))
        if not self.handed.room(payer, size):
            self.refused_total += 1
            warn_bad(
                "emqp",
                "publish-share",
                f"a PUBLISH of {size} bytes to {frames[0][:40]!r} dropped: its publisher's earlier ones, "
                "not yet taken by every subscriber, fill its share",
            )
            return
        out = self.handed.frames(payer, frames)
        try:
            send_frames(self.sock, out, NOBLOCK)
        except Again:  # a subscriber's pipe is full: it misses this one, the others get it
            self.missed_total += 1
            warn_bad("emqp", "subscriber-behind", "a subscriber's pipe is full: it misses PUBLISHes until it reads")
            self.sock.setsockopt(zmq.XPUB_NODROP, 0)
            try:
                send_frames(self.sock, out, NOBLOCK)
            except Again:  # (a lossy PUB never refuses; kept for safety: the PUBLISH is dropped)
                pass
            finally:
                self.sock.setsockopt(zmq.XPUB_NODROP, 1)
        self.sent_total += 1

    def turn(self, now: float, most: int) -> int:
        """Once a turn: let libzmq end departed subscribers' pipes, release what it freed, look at up to
        ``most`` subscribers' connections (returns how many)."""
        events(self.sock)  # (handles the socket's commands: a pipe ended frees what it held)
        self.handed.collect()
        return self.stuck.check(now, most) if most else 0

    def rebind(self) -> None:
        """Bind a new socket in its place: every subscriber connects (and authenticates) again."""
        self.sock = self.binder.rebind(self.sock)

    def stats(self) -> dict:
        return {
            "publish_total": self.sent_total,
            "publish_held_bytes": self.handed.bytes,
            "publish_refused_total": self.refused_total,
            "publish_missed_total": self.missed_total,
            "publish_subscribers_cut_total": self.stuck.cut_total,
        }
