"""The console's pages as data: pure functions from one STATS snapshot (and the on-demand reads) to a
dict that the templates render and that is, as it is, the page's JSON twin. A page's figures and its
charts are drawn from the same snapshot, so they agree. Figures are numbers (``figures``) with their
units apart (``units``; pzq/console/formats.py shows them), which console.js updates in place with the
page's live tables (their rows, numbers too) and its charts over the range asked for (``?range=``)."""

from __future__ import annotations

import base64
from typing import Any

from pzq.console import history as ranges
from pzq.console.formats import is_number, unit_of, when
from pzq.console.history import History
from pzq.console.reader import Snapshot

QUEUE_COLUMNS = ("depth", "inflight", "dead_letters", "bytes", "oldest_age_s", "in_per_s", "out_per_s")
COLUMN_LABELS = {
    "inflight": "in flight",
    "dead_letters": "dead letters",
    "oldest_age_s": "oldest",
    "in_per_s": "in / s",
    "out_per_s": "out / s",
}
QUEUE_UNITS = {"bytes": "bytes", "oldest_age_s": "s", "in_per_s": "msg/s", "out_per_s": "msg/s"}
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


def _state(snap: Snapshot, range_name: str = ranges.DEFAULT_RANGE) -> dict:
    return {
        "at": snap.at,
        "at_text": when(snap.at * 1e6),
        "polls": snap.polls,
        "error": snap.error,
        "range": range_name,
    }


def _num(value: Any) -> int | float | None:
    return value if is_number(value) else None


OVERVIEW_UNITS = {
    "uptime": "s",
    "store_bytes": "bytes",
    "store_limit_bytes": "bytes",
    "produce_rate": "msg/s",
    "deliver_rate": "msg/s",
    "ack_rate": "msg/s",
    "commit_ms": "ms",
}


def overview(snap: Snapshot, history: History, range_name: str = ranges.DEFAULT_RANGE) -> dict:
    """Totals, the store against its limit, the rates and their charts over ``range_name``."""
    s = snap.stats
    rates = history.latest_rates()
    figures = {
        "uptime": _num(s.get("uptime_seconds")),
        "messages": _num(s.get("messages")),
        "inflight": _num(s.get("messages_inflight")),
        "queues": len(s.get("queues") or {}),
        "store_bytes": _num(s.get("db_size")),
        "store_limit_bytes": _num(s.get("store_limit_bytes")),
        "produced_total": _num(s.get("produced_total")),
        "delivered_total": _num(s.get("delivered_total")),
        "acked_total": _num(s.get("acked_total")),
        "produce_rate": rates["produced_total"],
        "deliver_rate": rates["delivered_total"],
        "ack_rate": rates["acked_total"],
        "dead_lettered_total": _num(s.get("dead_lettered_total")),
        "redelivered_total": _num(s.get("redelivered_total")),
        "commit_ms": _num(s.get("commit_ms_last")),
    }
    series = history.series(range_name)
    charts = {key: _chart(series[key], title, unit) for key, title, unit in OVERVIEW_CHARTS}
    return {
        "page": "overview",
        "title": "Overview",
        "snapshot": _state(snap, range_name),
        "figures": figures,
        "units": {k: OVERVIEW_UNITS.get(k, "count") for k in figures},
        "charts": charts,
    }


def queues(snap: Snapshot, sort: str, descending: bool, page: int, contains: str = "") -> dict:
    """Every queue (whose name has ``contains`` in it), sorted by ``sort`` (a QUEUE_COLUMNS name or
    ``name``), QUEUES_PER_PAGE a page. Its rows are the live table ``queues``."""
    key = sort if sort in QUEUE_COLUMNS else "name"
    rows = _TABLE.rows(snap, key, descending)
    if contains:
        rows = [r for r in rows if contains in r["name"]]
    pages = max(1, -(-len(rows) // QUEUES_PER_PAGE))
    page = min(max(1, page), pages)
    shown = rows[(page - 1) * QUEUES_PER_PAGE : page * QUEUES_PER_PAGE]
    return {
        "page": "queues",
        "title": "Queues",
        "snapshot": _state(snap),
        "figures": {"queues": len(rows)},
        "units": {"queues": "count"},
        "charts": {},
        "rows": shown,
        "columns": [
            {"key": c, "label": COLUMN_LABELS.get(c, c), "unit": QUEUE_UNITS.get(c, "count" if c != "name" else "text")}
            for c in ("name", *QUEUE_COLUMNS)
        ],
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


CONSUMER_COLUMNS = (
    ("protocol", "protocol", "text"),
    ("client", "client", "text"),
    ("address", "address", "text"),
    ("connected_us", "connected since", "time_us"),
    ("held", "held", "count"),
)
TRAIL = 20  # earlier dead-letter pages a queue's page remembers for "previous" (in its URL)


def queue(
    snap: Snapshot,
    history: History,
    name: str,
    info: dict | None,
    peek: dict | None,
    dead: dict | None,
    dead_after: str,
    trail: tuple[str, ...] = (),
    range_name: str = ranges.DEFAULT_RANGE,
) -> dict:
    """One queue: its figures and charts (one snapshot), its consumers (``info``: pzq's QUEUE answer; the
    live table ``consumers``), the first messages (``peek``) and a page of its dead letters (``dead``,
    after id ``dead_after``; ``trail``: the after-ids of the pages before it, for "previous"). A read
    that pzq did not answer is None: the page says so."""
    q = (snap.stats.get("queues") or {}).get(name)
    q = q if isinstance(q, dict) else (info or {}).get("figures") or {}
    figures = {k: _num(q.get(k)) for k in QUEUE_COLUMNS}
    series = history.queue_series(name, snap.at, q if q else None, range_name)
    charts = {key: _chart(series[key], title, unit) for key, title, unit in QUEUE_CHARTS}
    consumers = None
    if info is not None:
        consumers = {
            "rows": [_consumer(c) for c in info.get("consumers") or () if isinstance(c, dict)],
            "total": info.get("consumers_total", 0),
            "columns": [{"key": k, "label": label, "unit": unit} for k, label, unit in CONSUMER_COLUMNS],
        }
    messages = None if peek is None else [_message(m) for m in peek.get("messages") or ()]
    return {
        "page": "queue",
        "title": f"Queue {name}",
        "name": name,
        "snapshot": _state(snap, range_name),
        "figures": figures,
        "units": {k: QUEUE_UNITS.get(k, "count") for k in figures},
        "charts": charts,
        "consumers": consumers,
        "messages": messages,
        "peek_more": bool(peek and peek.get("more")),
        "dead": None if dead is None else _letters(name, dead, dead_after, trail),
    }


def _consumer(c: dict) -> dict:
    row = {k: c.get(k) for k, _, _ in CONSUMER_COLUMNS}
    # (a connection is known by what it is and where from; the DEALER's by its address and time alone)
    row["key"] = f"{row['protocol']} {row['client']} {row['address']} {row['connected_us']}"
    return row


def _letters(name: str, dead: dict, after: str, trail: tuple[str, ...]) -> dict:
    """A page of dead letters with its links: first, previous (the trail's last) and next."""
    rows = [_message(m) for m in dead.get("letters") or ()]
    more = bool(dead.get("more"))
    following = str(dead.get("next_after") or (rows[-1]["id"] if rows else "")) if more else ""
    trail = trail[-TRAIL:]
    links = {}
    if after:
        links["first"] = {"name": name}
        links["previous"] = (
            {"name": name, "dead_after": trail[-1], "dead_trail": ",".join(trail[:-1])} if trail else {"name": name}
        )
    if following:
        links["next"] = {
            "name": name,
            "dead_after": following,
            "dead_trail": ",".join([*trail, after] if after else trail),
        }
    return {
        "rows": rows,
        "more": more,
        "total": dead.get("total", len(rows)),
        "after": after,
        "page": len(trail) + (2 if after else 1),
        "next": following,
        "links": links,
    }


def _message(m: Any) -> dict:
    if not isinstance(m, dict):
        return {"id": "?", "body": "", "size": 0, "deliveries": 0, "enqueued_us": 0, "dead_at_us": 0, "reason": ""}
    total = m.get("size", 0) if is_number(m.get("size")) else 0
    return {
        "id": str(m.get("id", "")),
        "enqueued_us": _num(m.get("enqueued_us")) or 0,
        "dead_at_us": _num(m.get("dead_at_us")) or 0,
        "reason": str(m.get("reason", "")),
        "deliveries": _num(m.get("deliveries")) or 0,
        "size": total,
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
    """Who is connected first: every gateway's lists of its clients (``answer``: pzq's CLIENTS reply, None
    when pzq was too busy or does not know CLIENTS; a page of rows at ``offset``, each a live table), the
    Spark/API consumer groups; then each gateway's counters (folded on the page), numbers with units."""
    gateways = dict((answer or {}).get("figures") or {})
    for key in ("native", "connections", "phpmq", "mqks", "emqp", "api"):
        if key not in gateways and isinstance(snap.stats.get(key), dict):
            gateways[key] = snap.stats[key]
    figures: dict[str, int | float] = {}
    units: dict[str, str] = {}
    blocks = []
    for gateway, values in gateways.items():
        if not isinstance(values, dict):
            continue
        rows = []
        for k, v in values.items():
            if is_number(v):
                figures[f"{gateway}:{k}"], units[f"{gateway}:{k}"] = v, unit_of(k)
                rows.append({"key": f"{gateway}:{k}", "label": k.replace("_", " ")})
        blocks.append({"gateway": gateway, "title": GATEWAYS.get(gateway, gateway), "figures": rows})
    tables = [_clients_table(t, offset) for t in (answer or {}).get("tables") or () if isinstance(t, dict)]
    total = max((t["total"] for t in tables if is_number(t["total"])), default=0)
    groups = (snap.stats.get("api") or {}).get("groups") or {}
    depths = snap.stats.get("queues") or {}
    leases = [
        {
            "group": name,
            "base": _num(g.get("base")),
            "end": _num(g.get("end")),
            "held": _num(g.get("held")),
            "lag": max(0, _depth(depths, name.rsplit("/", 1)[0]) - (g.get("held") or 0)),
        }
        for name, g in sorted(groups.items())[:CLIENT_ROWS]
        if isinstance(g, dict)
    ]
    return {
        "page": "clients",
        "title": "Clients",
        "snapshot": _state(snap),
        "figures": figures,
        "units": units,
        "charts": {},
        "gateways": blocks,
        "counters": len(figures),
        "tables": tables,
        "listed": answer is not None,
        "groups": leases,
        "paging": {"offset": offset, "per_page": CLIENT_ROWS, "total": total},
    }


COLUMNS = {"connected_us": "connected since", "connection": "connection"}


def _clients_table(t: dict, offset: int) -> dict:
    """One of CLIENTS' lists as a live table: its rows as objects by column, numbers as numbers."""
    names = [str(c) for c in t.get("columns") or ()]
    rows = []
    for values in t.get("rows") or ():
        row = {c: (v if is_number(v) or isinstance(v, str) else str(v)) for c, v in zip(names, values, strict=False)}
        row["key"] = " ".join(str(v) for v in values[:1]) + (f" {row.get('connected_us', '')}" if names else "")
        rows.append(row)
    return {
        "kind": str(t.get("kind", "")),
        "gateway": str(t.get("gateway", "")),
        "title": str(t.get("title", "")),
        "columns": [
            {"key": c, "label": COLUMNS.get(c, c), "unit": _column_unit(c, t.get("rows") or (), i)}
            for i, c in enumerate(names)
        ],
        "rows": rows,
        "total": t.get("total", 0),
        "offset": t.get("offset", offset),
    }


def _column_unit(column: str, rows: Any, at: int) -> str:
    """A column's unit from its name, or text when its values are not numbers (an id, an address)."""
    if column == "connection" or not any(is_number(r[at]) for r in rows if len(r) > at):
        return "time_us" if column.endswith(("_us", "since")) else "text"
    return unit_of(column)


def _depth(queues: dict, name: str) -> int:
    figures = queues.get(name)
    depth = figures.get("depth") if isinstance(figures, dict) else 0
    return depth if isinstance(depth, int) else 0
