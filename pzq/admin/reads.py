"""The monitor's reads for the console and the CLI: one queue with its consumers (QUEUE), pages of its
ready messages and dead letters (PEEK, DEAD), and pages of every gateway's clients (CLIENTS).

Each answer is bounded (``Limits.admin_rows`` rows, ``admin_head_bytes`` of each body) and reads the
committed store only; every refusal is one ``error:`` line.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from pzq.admin.rates import QueueRates
from pzq.broker import Broker
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.protocols import monitor as monitor_proto
from pzq.store import QueueInfo, Store, message_id
from pzq.store.previews import Preview


class Listed(Protocol):
    """What the admin asks of the server's endpoints (pzq/endpoints/base.py): their clients' lists and
    the consumers of one queue."""

    def clients(self, now: float, limit: int, offset: int = 0) -> list[dict]: ...

    def consumers(self, queue: str, limit: int) -> tuple[list[dict], int]: ...


class Refused(Exception):
    """A request refused: its text is the ``error:`` line's detail."""


def no_queue(name: str) -> Refused:
    return Refused(f"there is no queue {name!r}")  # (the console turns exactly this prefix into a 404)


def number(args: list[str], at: int, name: str, default: int, most: int, least: int = 1) -> int:
    """The argument at ``at`` as a whole number (``default`` when absent) no greater than ``most``: a
    bigger one is cut to it (the answer is bounded, not refused); a word or one below ``least`` is
    refused."""
    if len(args) <= at:
        return default
    text = args[at]
    # (ASCII digits only: "²" is a digit to str.isdigit but not to int(), whose ValueError rolled the turn back)
    if not (text.isascii() and text.isdigit()) or len(text) > 18 or int(text) < least:
        raise Refused(f"{name} must be a whole number of at least {least}, got {text[:40]!r}")
    return min(int(text), most)


class Reads:
    """QUEUE, PEEK, DEAD and CLIENTS (a part of ``Admin``, which sets what is declared here)."""

    broker: Broker
    store: Store
    gateways: Callable[[], dict]
    endpoints: Callable[[], Sequence[Listed]]
    limits: Limits = DEFAULT_LIMITS
    oldest_age: Callable[[QueueInfo, int], float]
    rates: QueueRates

    def read(self, request: monitor_proto.Request) -> str | None:
        """The JSON answer to one of these requests, or its ``error:`` line; None for another request."""
        handler = {"QUEUE": self._queue, "PEEK": self._peek, "DEAD": self._dead, "CLIENTS": self._clients}.get(
            request.command
        )
        if handler is None:
            return None
        try:
            return monitor_proto.render_json(handler(request.args))
        except Refused as exc:
            return monitor_proto.error_text(str(exc))

    def _info(self, args: list[str], most: int, usage: str):
        if not 1 <= len(args) <= most:
            raise Refused(f"usage: {usage}")
        info = self.store.queue(args[0], create=False)
        if info is None:
            raise no_queue(args[0])
        return info

    def _queue(self, args: list[str]) -> dict:
        info = self._info(args, 1, "QUEUE <queue>")
        figures = {**self.broker.queue_figures(info), "oldest_age_s": self.oldest_age(info, time.time_ns() // 1000)}
        figures["in_per_s"], figures["out_per_s"] = self.rates.of(info.name)
        rows: list[dict] = []
        total = 0
        for endpoint in self.endpoints():
            found, count = endpoint.consumers(info.name, self.limits.admin_rows - len(rows))
            rows += [_consumer(row) for row in found[: self.limits.admin_rows - len(rows)]]
            total += count
        return {"name": info.name, "figures": figures, "consumers": rows, "consumers_total": total}

    def _page(self, args: list[str], dead: bool):
        info = self._info(args, 3, f"{'DEAD' if dead else 'PEEK'} <queue> [limit] [after-id]")
        rows = self.limits.admin_rows
        limit = number(args, 1, "limit", min(50, rows), rows)
        after = None
        if len(args) > 2:
            ref = self.store.catalog.ref_in(info.name, args[2])
            if ref is None:
                raise Refused(f"{args[2][:80]!r} is not a message id of queue {info.name!r}")
            after = ref[1]
        qid, holder_of = info.qid, self.broker.holder_of
        page = self.store.previews.page(
            info.name,
            limit,
            self.limits.admin_head_bytes,
            dead=dead,
            after=after,
            # (PEEK shows what a consumer would be given next: what is in flight or leased is left out)
            skip=None if dead else lambda seq: holder_of((qid, seq)) is not None,
            walk=2 * limit + (0 if dead else self.limits.admin_skip_walk),
            # (a page of 1,000 rows takes ~15 ms to read and render: it ends at the reads' share of the turn,
            # with "more", once it has 100 rows)
            deadline=time.perf_counter() + self.limits.admin_read_s,
        )
        listed = [_row(p, dead) for p in page.previews]
        last = None if page.last is None else message_id(info.qid, page.last)
        return info, listed, page.more, last

    def _peek(self, args: list[str]) -> dict:
        info, messages, more, last = self._page(args, dead=False)
        # ("next_after": the last record walked, in flight or not: the next page's after-id when every one
        # walked was in flight and none is listed)
        return {"queue": info.name, "messages": messages, "more": more, "next_after": last}

    def _dead(self, args: list[str]) -> dict:
        info, letters, more, last = self._page(args, dead=True)
        return {"queue": info.name, "letters": letters, "more": more, "total": info.dead_count, "next_after": last}

    def _clients(self, args: list[str]) -> dict:
        if len(args) > 2:
            raise Refused("usage: CLIENTS [limit] [offset]")
        limit = number(args, 0, "limit", min(200, self.limits.admin_rows), self.limits.admin_rows)
        offset = number(args, 1, "offset", 0, 1 << 40, least=0)
        now = time.monotonic()
        tables = [
            {**table, "offset": offset}
            for endpoint in self.endpoints()
            for table in endpoint.clients(now, limit, offset)
        ]
        return {"figures": self.gateways(), "tables": tables}


def _consumer(row: dict) -> dict:
    """A consumer row with every field (an endpoint leaves out what its protocol does not know)."""
    return {
        "protocol": str(row.get("protocol", "")),
        "client": str(row.get("client", "")),
        "address": str(row.get("address", "")),
        "connected_us": int(row.get("connected_us", 0)),
        # (None: not known apart, the native send socket's consumers share what they hold)
        "held": None if row.get("held", 0) is None else int(row.get("held", 0)),
    }


def _row(preview: Preview, dead: bool) -> dict:
    row = {
        "id": preview.id,
        "enqueued_us": preview.enqueued_us,
        "deliveries": preview.deliveries,
        "size": preview.body_size,
        "size_exact": preview.size_exact,
        "head_b64": base64.b64encode(preview.body_head).decode("ascii"),
    }
    if dead:
        row.update(reason=preview.reason, dead_at_us=preview.dead_at_us)
    return row
