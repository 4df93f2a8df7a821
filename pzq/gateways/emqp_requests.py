"""eMQP REQUESTs stored: each a one-frame message (its payload, the frame as it came: parse found it to
be UTF-8, so it is stored without a second copy) in its named queue, with the client's identity, msgid
and headers as the message's meta, ACKed after the commit that stored it or refused with an error REPLY.

A payload past ``Limits.body_chunk_bytes`` is written a part per turn (gateways/parted.py, driven by the
endpoint), its ACK after the commit of its last part; the client's REQUESTs after it wait behind it, in
order, and past its share of what may wait (``Parted.room``) are refused "busy" (sent again once acked).
Such a payload is not decoded with the rest of its command (a 15 MiB str built in the turn that read it):
one of ASCII (a look at it, about 1 ms) goes on at once, any other is checked as UTF-8 a part at a time
as its parts are written, and one that is not UTF-8 is dropped at its last part, unanswered and logged,
as parse drops a small one.
"""

from __future__ import annotations

import codecs
import logging
from collections.abc import Callable

from pzq.config import Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import BrokerSurface, Send
from pzq.gateways.emqp_workers import FRONT
from pzq.gateways.parted import Big, Parted
from pzq.protocols import emqp
from pzq.store import Upload

log = logging.getLogger("pzq.emqp")

BUSY = "request refused: busy: your earlier big requests are still being stored; send it again once they are acked"


class Requests:
    """The clients' REQUESTs, and the big ones among them being written (``parts``)."""

    def __init__(
        self,
        broker: BrokerSurface,
        limits: Limits,
        new_id: Callable[[], str],
        counters: dict[str, int],
        bad: Callable[[bytes, ProtocolError], None],
    ):
        """``counters`` and ``bad`` are the gateway's (its figures, and how it logs bad input)."""
        self.broker = broker
        self.new_id = new_id
        self.counters = counters
        self.bad = bad
        self.parts = Parted(broker, limits)

    def big_payload(self, frames: list[bytes]) -> bytes | None:
        """The payload of a REQUEST past one chunk, which parse is not to decode (None for any other)."""
        if len(frames) == 8 and frames[3] == b"REQUEST" and self.parts.big(len(frames[7])):
            return frames[7]
        return None

    def request(self, cmd: emqp.Command, payload: bytes, now_us: int, checked: bool = True) -> list[Send]:
        """A REQUEST (``payload``: its frame): stored and ACKed after the commit, or refused; a big
        payload not ``checked`` as UTF-8 yet is checked as it is written."""
        queue, headers_text, _ = cmd.args
        try:
            headers = emqp.parse_headers(headers_text)  # once: the job keeps what dispatch needs of it
            retries = emqp.header_int(headers, "retry-count")
            timeout = emqp.header_int(headers, "timeout")
            if not queue or len(queue.encode()) > 255:
                raise ProtocolError("bad-queue", "queue names are 1 to 255 bytes")
        except ProtocolError as exc:
            self.bad(cmd.peer, exc)
            return self._error(cmd, f"request refused: {exc.detail}")
        # The headers the worker gets (with reply-requested) and whether the client asked for the REPLY:
        # neither dispatch nor the REPLY parses them again. (Jobs stored without "reply" are older.)
        meta: dict[str, object] = {
            "client": cmd.peer,
            "msgid": cmd.msgid,
            "headers": emqp.with_header(headers_text, "reply-requested", headers),
            "reply": "reply-requested" in headers,
        }
        if retries:
            meta["max_deliveries"] = retries + 1
        if timeout:
            meta["timeout"] = timeout
        size, parts = len(payload), self.parts
        if (parts.busy(cmd.peer) or parts.big(size)) and not parts.room(cmd.peer, size):
            return self._error(cmd, BUSY)
        # (behind a big REQUEST of this client still being written, it waits its turn: in order)
        checked = checked or payload.isascii()
        return parts.after(cmd.peer, lambda now: self._store(cmd, queue, payload, meta, now, checked), size, now_us)

    def _store(
        self, cmd: emqp.Command, queue: str, payload: bytes, meta: dict, now_us: int, checked: bool = True
    ) -> list[Send]:
        """Store a REQUEST's payload (a big one a part per turn, ACKed with its last part)."""
        try:
            if self.broker.queues.info(queue) is None:  # made on this client's share of --max-queues
                self.broker.queues.create(queue, owner=("emqp", cmd.peer))
            if self.parts.big(len(payload)):
                utf8 = None if checked else _Utf8()

                def finish(upload: Upload, now: int) -> list[Send]:
                    if utf8 is not None and not utf8.whole():  # (eventmq peers decode every frame)
                        self.broker.drop_big(upload)
                        self.bad(cmd.peer, ProtocolError("not-utf8", "REQUEST has a frame that is not UTF-8"))
                        return []
                    self.broker.produce(queue, upload, now_us=now, meta=meta)
                    return self._stored(cmd)

                def failed() -> list[Send]:
                    return self._error(cmd, "store failure: nothing was stored, try again")

                each = None if utf8 is None else utf8.part
                self.parts.write(cmd.peer, [payload], Big(finish, lambda _: self._full(cmd, queue), failed, each))
                return []
            self.broker.produce(queue, [payload], now_us=now_us, meta=meta)
        except StoreFull:
            return self._full(cmd, queue)
        return self._stored(cmd)

    def _stored(self, cmd: emqp.Command) -> list[Send]:
        self.counters["requests_total"] += 1
        return [Send(FRONT, [cmd.peer, *emqp.ack(self.new_id(), cmd.msgid)])]

    def _full(self, cmd: emqp.Command, queue: str) -> list[Send]:
        log.warning("eMQP REQUEST %s for %r refused: queue full", cmd.msgid, queue)
        return self._error(cmd, "request refused: queue full, try again later")

    def _error(self, cmd: emqp.Command, detail: str) -> list[Send]:
        return [Send(FRONT, [cmd.peer, *emqp.error_reply(self.new_id(), detail, cmd.msgid)])]


class _Utf8:
    """UTF-8 checked a part at a time (each part decoded and dropped: a chunk's worth of str at most)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.valid = True

    def part(self, view: memoryview) -> None:
        if self.valid:
            try:
                self._decoder.decode(view)
            except UnicodeDecodeError:
                self.valid = False

    def whole(self) -> bool:
        """Whether every part was UTF-8, ending on a whole character."""
        self.part(memoryview(b""))
        if self.valid:
            try:
                self._decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                self.valid = False
        return self.valid
