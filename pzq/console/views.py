"""The console's pages as data: pure functions from one STATS snapshot (and the on-demand reads) to a
dict that the templates render and that is, as it is, the page's JSON twin. A page's figures and its
charts are drawn from the same snapshot, so they agree. Every figure is a preformatted string under a
key (``figures``), which the templates put in ``data-figure`` cells and console.js updates in place."""

from __future__ import annotations

import base64
import datetime
from typing import Any

from pzq.console.history import History
from pzq.console.reader import Snapshot

QUEUE_COLUMNS = ("depth", "inflight", "dead_letters", "bytes", "oldest_age_s")
COLUMN_LABELS = {"dead_letters": "dead letters", "oldest_age_s": "oldest, s"}
QUEUES_PER_PAGE = 100
CLIENT_ROWS = 100  # rows of each client list a page shows
PEEKED = 20  # messages a queue's page peeks at
DEAD_PER_PAGE = 25
BODY_CHARS = 200

OVERVIEW_CHARTS = (
    ("produced_total", "produced", "msg/s"),
    ("delivered_total", "delivered", "msg/s"),
    ("acked_total", "acked", "msg/s"),
    ("messages", "messages stored", "messages"),
    ("commit_ms", "commit latency", "ms"),
)
QUEUE_CHARTS = (
    ("depth", "depth", "messages"),
    ("inflight", "in flight", "messages"),
    ("dead_letters", "dead letters", "letters"),
)


def number(value: Any) -> str:
    if not is_number(value):
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:,.2f}"


def size(value: Any) -> str:
    if not is_number(value):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return "-"


def when(us: Any) -> str:
    """An epoch time in µs as UTC text ("-" for 0 or nothing: not known)."""
    if not is_number(us) or us <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def show_body(head_b64: str, total: int, exact: bool = True) -> str:
    """A body's first bytes as text when printable UTF-8, else as hex; truncated, with its size.
    (Plain text: the templates escape it.)"""
    try:
        head = base64.b64decode(head_b64 or "", validate=False)
    except ValueError:
        head = b""
    cut = 3 if total > len(head) else 0  # (a character cut at the end of the head is left out)
    text, printable = "", False
    for end in range(len(head), max(-1, len(head) - cut - 1), -1):
        try:
            text = head[:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
        printable = text.isprintable()
        break
    shown = text if printable else "hex " + head[: BODY_CHARS // 2].hex(" ")
    more = len(shown) > BODY_CHARS or total > len(head) or (not printable and total > BODY_CHARS // 2)
    about = "" if exact else "about "
    return shown[:BODY_CHARS] + (f" … ({about}{total:,} bytes)" if more or not exact else "")


def _chart(series: dict[str, list[float]], title: str, unit: str) -> dict:
    return {"title": title, "unit": unit, "t": series["t"], "v": series["v"]}


def _state(snap: Snapshot) -> dict:
    return {"at": snap.at, "at_text": when(snap.at * 1e6), "polls": snap.polls, "error": snap.error}


def overview(snap: Snapshot, history: History) -> dict:
    """Totals, the store against its limit, the rates and their last 15 minutes."""
    s = snap.stats
    rates = history.latest_rates()
    figures = {
        "uptime": f"{number(s.get('uptime_seconds'))} s",
        "messages": number(s.get("messages")),
        "inflight": number(s.get("messages_inflight")),
        "queues": number(len(s.get("queues") or {})),
        "store": f"{size(s.get('db_size'))} / {size(s.get('store_limit_bytes'))}",
        "produced_total": number(s.get("produced_total")),
        "delivered_total": number(s.get("delivered_total")),
        "acked_total": number(s.get("acked_total")),
        "produce_rate": f"{number(rates['produced_total'])} msg/s",
        "deliver_rate": f"{number(rates['delivered_total'])} msg/s",
        "ack_rate": f"{number(rates['acked_total'])} msg/s",
        "dead_lettered_total": number(s.get("dead_lettered_total")),
        "redelivered_total": number(s.get("redelivered_total")),
        "commit_ms": f"{number(s.get('commit_ms_last'))} ms",
    }
    series = history.series()
    charts = {key: _chart(series[key], title, unit) for key, title, unit in OVERVIEW_CHARTS}
    return {"page": "overview", "title": "Overview", "snapshot": _state(snap), "figures": figures, "charts": charts}


def queues(snap: Snapshot, sort: str, descending: bool, page: int, contains: str = "") -> dict:
    """Every queue (whose name has ``contains`` in it), sorted by ``sort`` (a QUEUE_COLUMNS name or
    ``name``), QUEUES_PER_PAGE a page."""
    key = sort if sort in QUEUE_COLUMNS else "name"
    rows = _TABLE.rows(snap, key, descending)
    if contains:
        rows = [r for r in rows if contains in r["name"]]
    pages = max(1, -(-len(rows) // QUEUES_PER_PAGE))
    page = min(max(1, page), pages)
    shown = rows[(page - 1) * QUEUES_PER_PAGE : page * QUEUES_PER_PAGE]
    figures = {"queues": number(len(rows))}
    for r in shown:
        for c in QUEUE_COLUMNS:
            figures[f"{c}:{r['name']}"] = size(r[c]) if c == "bytes" else number(r[c])
    return {
        "page": "queues",
        "title": "Queues",
        "snapshot": _state(snap),
        "figures": figures,
        "charts": {},
        "rows": shown,
        "columns": [{"key": c, "label": COLUMN_LABELS.get(c, c)} for c in ("name", *QUEUE_COLUMNS)],
        "sort": key,
        "order": "desc" if descending else "asc",
        "filter": contains,
        "paging": {"page": page, "pages": pages, "total": len(rows), "per_page": QUEUES_PER_PAGE},
    }


class _Table:
    """The queues' rows of the last snapshot, in each order asked for since it came: every page view (and
    console.js asks each open page's twin every 2 s) built and sorted them all, 30-70 ms for 9,000
    queues; now once a snapshot and order. (Rows are shared: read, never changed.)"""

    def __init__(self) -> None:
        self.snap: Snapshot | None = None
        self.orders: dict[tuple[str, bool], list[dict]] = {}

    def rows(self, snap: Snapshot, key: str, descending: bool) -> list[dict]:
        if snap is not self.snap:
            self.snap, self.orders = snap, {}
        order = self.orders.get((key, descending))
        if order is None:
            plain = self.orders.get(("", False))
            if plain is None:
                plain = self.orders[("", False)] = [
                    {"name": name, **{c: q.get(c, 0) if is_number(q.get(c)) else 0 for c in QUEUE_COLUMNS}}
                    for name, q in (snap.stats.get("queues") or {}).items()
                    if isinstance(q, dict)
                ]
            order = self.orders[(key, descending)] = sorted(plain, key=lambda r: r[key], reverse=descending)
        return order


_TABLE = _Table()  # (one console, one event loop: one table)


def queue(
    snap: Snapshot,
    history: History,
    name: str,
    info: dict | None,
    peek: dict | None,
    dead: dict | None,
    dead_after: str,
) -> dict:
    """One queue: its figures and charts (one snapshot), its consumers (``info``: pzq's QUEUE answer),
    the first messages (``peek``) and a page of its dead letters (``dead``, after id ``dead_after``).
    A read that pzq did not answer is None: the page says so."""
    q = (snap.stats.get("queues") or {}).get(name)
    q = q if isinstance(q, dict) else (info or {}).get("figures") or {}
    figures = {
        "depth": number(q.get("depth")),
        "inflight": number(q.get("inflight")),
        "dead_letters": number(q.get("dead_letters")),
        "bytes": size(q.get("bytes")),
        "oldest_age_s": f"{number(q.get('oldest_age_s', 0))} s",
    }
    series = history.queue_series(name, snap.at, q if q else None)
    charts = {key: _chart(series[key], title, unit) for key, title, unit in QUEUE_CHARTS}
    consumers = None
    if info is not None:
        consumers = {
            "rows": [
                {**c, "connected": when(c.get("connected_us"))}
                for c in info.get("consumers") or ()
                if isinstance(c, dict)
            ],
            "total": info.get("consumers_total", 0),
        }
    messages = None if peek is None else [_message(m) for m in peek.get("messages") or ()]
    letters = None
    if dead is not None:
        rows = [_message(m) for m in dead.get("letters") or ()]
        letters = {
            "rows": rows,
            "more": bool(dead.get("more")),
            "total": dead.get("total", len(rows)),
            "after": dead_after,
            "next": str(dead.get("next_after") or (rows[-1]["id"] if rows else "")) if dead.get("more") else "",
        }
    return {
        "page": "queue",
        "title": f"Queue {name}",
        "name": name,
        "snapshot": _state(snap),
        "figures": figures,
        "charts": charts,
        "consumers": consumers,
        "messages": messages,
        "peek_more": bool(peek and peek.get("more")),
        "dead": letters,
    }


def _message(m: Any) -> dict:
    if not isinstance(m, dict):
        return {"id": "?", "body": ""}
    total = m.get("size", 0) if is_number(m.get("size")) else 0
    return {
        "id": str(m.get("id", "")),
        "enqueued": when(m.get("enqueued_us")),
        "dead_at": when(m.get("dead_at_us")),
        "reason": str(m.get("reason", "")),
        "deliveries": number(m.get("deliveries", 0)),
        "size": size(total),
        "body": show_body(str(m.get("head_b64", "")), total, bool(m.get("size_exact", True))),
    }


GATEWAYS = {
    "native": "Native PZQ",
    "native_batch": "Native PZQ, batched consumers",
    "connections": "TCP connections (PHPMQ, MQKS)",
    "phpmq": "PHPMQ",
    "mqks": "MQKS",
    "emqp": "eMQP (workers, schedules, jobs)",
    "api": "API (Spark and batch clients)",
    "memory": "Memory",
}


def clients(snap: Snapshot, answer: dict | None, offset: int) -> dict:
    """What every gateway reports of its clients, and its lists of them a page at a time (``answer``:
    pzq's CLIENTS reply; None when pzq was too busy or does not know CLIENTS)."""
    gateways = dict((answer or {}).get("figures") or {})
    for key in ("native", "connections", "phpmq", "mqks", "emqp", "api"):
        if key not in gateways and isinstance(snap.stats.get(key), dict):
            gateways[key] = snap.stats[key]
    figures: dict[str, str] = {}
    blocks = []
    for gateway, values in gateways.items():
        if not isinstance(values, dict):
            continue
        rows = []
        for k, v in values.items():
            if is_number(v):
                figures[f"{gateway}:{k}"] = number(v)
                rows.append({"key": f"{gateway}:{k}", "label": k.replace("_", " ")})
        blocks.append({"gateway": gateway, "title": GATEWAYS.get(gateway, gateway), "figures": rows})
    tables = []
    for t in (answer or {}).get("tables") or ():
        if isinstance(t, dict):
            tables.append(
                {
                    "kind": str(t.get("kind", "")),
                    "gateway": str(t.get("gateway", "")),
                    "title": str(t.get("title", "")),
                    "columns": [COLUMNS.get(str(c), str(c)) for c in t.get("columns") or ()],
                    "rows": [
                        [_cell(c, v) for c, v in zip(t.get("columns") or (), row, strict=False)]
                        for row in t.get("rows") or ()
                    ],
                    "total": t.get("total", 0),
                    "offset": t.get("offset", offset),
                }
            )
    total = max((t["total"] for t in tables if is_number(t["total"])), default=0)
    groups = (snap.stats.get("api") or {}).get("groups") or {}
    depths = snap.stats.get("queues") or {}
    leases = [
        {
            "group": name,
            "base": number(g.get("base")),
            "end": number(g.get("end")),
            "held": number(g.get("held")),
            "lag": number(max(0, _depth(depths, name.rsplit("/", 1)[0]) - (g.get("held") or 0))),
        }
        for name, g in sorted(groups.items())[:CLIENT_ROWS]
        if isinstance(g, dict)
    ]
    return {
        "page": "clients",
        "title": "Clients",
        "snapshot": _state(snap),
        "figures": figures,
        "charts": {},
        "gateways": blocks,
        "tables": tables,
        "listed": answer is not None,
        "groups": leases,
        "paging": {"offset": offset, "per_page": CLIENT_ROWS, "total": total},
    }


COLUMNS = {"connected_us": "connected since"}


def _depth(queues: dict, name: str) -> int:
    figures = queues.get(name)
    depth = figures.get("depth") if isinstance(figures, dict) else 0
    return depth if isinstance(depth, int) else 0


def _cell(column: Any, value: Any) -> str:
    if isinstance(column, str) and column.endswith(("since", "_us")) and is_number(value) and value > 1e12:
        return when(value)
    return number(value) if is_number(value) else str(value)
