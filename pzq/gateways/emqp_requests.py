"""eMQP REQUESTs stored: each a one-frame message (its payload, the frame as it came: parse found it to
be UTF-8, so it is stored without a second copy) in its named queue, with the client's identity, msgid
and headers as the message's meta, ACKed after the commit that stored it or refused with an error REPLY.

A payload past ``Limits.body_chunk_bytes`` is written a part per turn (gateways/parted.py, driven by the
endpoint), its ACK after the commit of its last part; the client's REQUESTs after it wait behind it, in
order, and past its share of what may wait (``Parted.room``) are refused "busy" (sent again once acked).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pzq.broker import Broker
from pzq.config import Limits
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.contract import Send
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
        broker: Broker,
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

    def request(self, cmd: emqp.Command, payload: bytes, now_us: int) -> list[Send]:
        """A REQUEST (``payload``: its frame): stored and ACKed after the commit, or refused."""
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
        return parts.after(cmd.peer, lambda now: self._store(cmd, queue, payload, meta, now), size, now_us)

    def _store(self, cmd: emqp.Command, queue: str, payload: bytes, meta: dict, now_us: int) -> list[Send]:
        """Store a REQUEST's payload (a big one a part per turn, ACKed with its last part)."""
        try:
            if self.broker.queue_info(queue) is None:  # made on this client's share of --max-queues
                self.broker.create_queue(queue, owner=("emqp", cmd.peer))
            if self.parts.big(len(payload)):

                def finish(upload: Upload, now: int) -> list[Send]:
                    self.broker.produce_big(queue, upload, now_us=now, meta=meta)
                    return self._stored(cmd)

                def failed() -> list[Send]:
                    return self._error(cmd, "store failure: nothing was stored, try again")

                self.parts.write(cmd.peer, [payload], Big(finish, lambda _: self._full(cmd, queue), failed))
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
