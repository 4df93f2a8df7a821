"""The console's pages, rendered from the loop's published snapshot. Pure: figures in, HTML out.

Every value that came from a client (queue names above all) goes through ``html.escape``; the pages
carry no script, so a hostile queue name can only ever show as text. Charts are inline SVG drawn here.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import urllib.parse

QUEUE_COLUMNS = (
    "depth",
    "inflight",
    "dead_letters",
    "bytes",
    "oldest_s",
    "produce_rate",
    "ack_rate",
    "produced",
    "acked",
)
QUEUE_CHARTS = (("produced", "produced", "msg/s"), ("acked", "acked", "msg/s"), ("depth", "depth", "messages"))
CHART_W, CHART_H = 600, 120


@dataclasses.dataclass(frozen=True)
class Viewer:
    """Who looks: with ``csrf`` a logged-in operator (the pages offer changes, each form carrying the
    token), else a reader; ``notice`` is what the operator's last change did."""

    csrf: str | None = None
    can_log_in: bool = False
    notice: str = ""


READER = Viewer()


def page(title: str, body: str, viewer: Viewer = READER) -> str:
    """A page of the console: the navigation (with the viewer's login or logout) around ``body``."""
    return _page(title, body, viewer)


def _page(title: str, body: str, viewer: Viewer = READER) -> str:
    if viewer.csrf:
        account = _form("/logout", viewer, "", "Log out", css="inline")
    elif viewer.can_log_in:
        account = '<a href="/login">Log in</a>'
    else:
        account = "<span class=muted>read-only</span>"
    notice = f"<p class=notice role=status>{html.escape(viewer.notice)}</p>" if viewer.notice else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)} - pzq</title>"
        '<link rel=stylesheet href="/static/console.css"></head><body>'
        '<nav><a href="/">Overview</a> <a href="/queues">Queues</a> <a href="/clients">Clients</a> '
        f'<a href="/api/stats">JSON</a> <span class=account>{account}</span></nav>'
        f"<h1>{html.escape(title)}</h1>{notice}{body}</body></html>"
    )


def _form(action: str, viewer: Viewer, fields: str, label: str, *, confirm: str = "", css: str = "") -> str:
    """A POST form for a change: the session's CSRF token, ``fields`` (hidden inputs), and a button
    (with ``confirm``, a box that must be ticked too)."""
    box = f"<label><input type=checkbox name=confirm value=yes> {html.escape(confirm)}</label> " if confirm else ""
    return (
        f'<form method=post action="{action}" class="{css}">'
        f'<input type=hidden name=csrf value="{html.escape(viewer.csrf or "")}">{fields}{box}'
        f'<button type=submit data-action="{html.escape(action)}">{html.escape(label)}</button></form>'
    )


def _hidden(**fields: str) -> str:
    return "".join(f'<input type=hidden name="{k}" value="{html.escape(v)}">' for k, v in fields.items())


def login(enabled: bool, viewer: Viewer) -> str:
    """The login form (the operator's secret from --http-auth-file)."""
    if not enabled:
        return _page("Log in", "<p>This console is read-only: the server was started without --http-auth-file.</p>")
    form = (
        '<form method=post action="/login"><label>Secret <input type=password name=secret '
        "autocomplete=current-password required autofocus></label> <button type=submit>Log in</button></form>"
    )
    return _page("Log in", form, Viewer(notice=viewer.notice))


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:,.2f}"


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{value:,.0f} B"
        value /= 1024
    return f"{value:,.1f} GiB"


def _figures(rows: list[tuple[str, str]]) -> str:
    """A two-column table of named figures; each value cell carries its name for tests and scripts."""
    cells = "".join(
        f'<tr><th>{html.escape(k)}</th><td data-figure="{html.escape(k)}">{html.escape(v)}</td></tr>' for k, v in rows
    )
    return f"<table class=figures>{cells}</table>"


def _when(us: int) -> str:
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _q(name: str) -> str:
    return html.escape(urllib.parse.urlencode({"name": name}))


def chart(name: str, points: list[tuple[float, float]], unit: str) -> str:
    """An SVG line of ``(seconds ago, value)`` over the last 15 minutes, with its latest value."""
    label = f"{html.escape(name)}: {_number(points[-1][1]) if points else '-'} {html.escape(unit)}"
    if len(points) < 2:
        return f"<figure class=chart><figcaption>{label}</figcaption><p class=empty>collecting</p></figure>"
    top = max(v for _, v in points) or 1.0
    span = 900.0
    coords = " ".join(f"{CHART_W * (1 - min(ago, span) / span):.1f},{CHART_H * (1 - v / top):.1f}" for ago, v in points)
    return (
        f"<figure class=chart><figcaption>{label} (max {_number(top)})</figcaption>"
        f'<svg viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role=img '
        f'aria-label="{html.escape(name)}"><polyline fill=none stroke=currentColor points="{coords}"/></svg>'
        "</figure>"
    )


def overview(
    stats: dict, series: dict[str, list[tuple[float, float]]], disk_free: int | None, *, viewer: Viewer = READER
) -> str:
    """Totals, the store against its limit, disk free, uptime, and the last 15 minutes' rates."""
    return _page("Overview", overview_body(stats, series, disk_free), viewer)


def overview_body(stats: dict, series: dict[str, list[tuple[float, float]]], disk_free: int | None) -> str:
    """The body of the overview (the same for every viewer: the console keeps it for a snapshot)."""
    limit = stats.get("store_limit_bytes", 0)
    rows = [
        ("uptime", f"{_number(stats.get('uptime_seconds', 0))} s"),
        ("messages stored", _number(stats.get("messages", 0))),
        ("in flight", _number(stats.get("messages_inflight", 0))),
        ("queues", _number(len(stats.get("queues", {})))),
        ("store size / limit", f"{_bytes(stats.get('db_size', 0))} / {_bytes(limit)}"),
        ("disk free", "-" if disk_free is None else _bytes(disk_free)),
        (
            "produced / acked since start",
            f"{_number(stats.get('produced_total', 0))} / {_number(stats.get('acked_total', 0))}",
        ),
        (
            "dead-lettered / redelivered",
            f"{_number(stats.get('dead_lettered_total', 0))} / {_number(stats.get('redelivered_total', 0))}",
        ),
        ("commits", _number(stats.get("syncs", 0))),
    ]
    charts = "".join(
        chart(title, series.get(key, []), unit)
        for key, title, unit in (
            ("produced_total", "produced", "msg/s"),
            ("delivered_total", "delivered", "msg/s"),
            ("acked_total", "acked", "msg/s"),
            ("commit_ms", "commit latency", "ms"),
        )
    )
    return _figures(rows) + "<section class=charts>" + charts + "</section>"


def queues(
    stats: dict,
    oldest: dict[str, float],
    per_queue: dict[str, dict],
    sort: str,
    descending: bool,
    *,
    viewer: Viewer = READER,
    page: int = 1,
    rates: dict[str, tuple[float, float]] | None = None,
) -> str:
    """The queues in a table sorted by ``sort`` (a QUEUE_COLUMNS name or ``name``), QUEUES_PER_PAGE
    to a page; ``rates``: each queue's produce and ack rates (msg/s over the last 10 s)."""
    return _page("Queues", queues_table(stats, oldest, per_queue, sort, descending, page, rates), viewer)


QUEUES_PER_PAGE = 200
COLUMN_LABELS = {"oldest_s": "oldest, s", "produce_rate": "produced/s", "ack_rate": "acked/s"}


def queues_table(
    stats: dict,
    oldest: dict[str, float],
    per_queue: dict[str, dict],
    sort: str,
    descending: bool,
    page: int,
    rates: dict[str, tuple[float, float]] | None = None,
) -> str:
    """The body of the queues page (the same for every viewer: the console keeps it for a snapshot)."""
    rows = []
    rates = rates or {}
    for name, figures in stats.get("queues", {}).items():
        counts = per_queue.get(name, {})
        rows.append(
            {
                "name": name,
                **{k: figures.get(k, 0) for k in ("depth", "inflight", "dead_letters", "bytes")},
                "oldest_s": round(oldest.get(name, 0.0), 1),
                "produce_rate": rates.get(name, (0.0, 0.0))[0],
                "ack_rate": rates.get(name, (0.0, 0.0))[1],
                "produced": counts.get("produced", 0),
                "acked": counts.get("acked", 0),
            }
        )
    key = sort if sort in QUEUE_COLUMNS or sort == "name" else "name"
    rows.sort(key=lambda r: r[key], reverse=descending)
    pages = max(1, -(-len(rows) // QUEUES_PER_PAGE))
    page = min(max(1, page), pages)
    shown = rows[(page - 1) * QUEUES_PER_PAGE : page * QUEUES_PER_PAGE]
    head = "".join(
        f'<th><a href="/queues?sort={c}&amp;order={"asc" if c == key and descending else "desc"}">'
        f"{html.escape(COLUMN_LABELS.get(c, c.replace('_', ' ')))}</a></th>"
        for c in ("name", *QUEUE_COLUMNS)
    )
    order = "desc" if descending else "asc"
    links = " ".join(
        f'<a href="/queues?sort={key}&amp;order={order}&amp;page={n}" rel={rel}>{label}</a>'
        for n, rel, label in ((page - 1, "prev", "previous"), (page + 1, "next", "next"))
        if 1 <= n <= pages
    )
    nav = f"<p class=pages>page {page} of {pages} ({_number(len(rows))} queues) {links}</p>" if pages > 1 else ""
    body = "".join(
        "<tr>"
        + f'<td class=name data-queue="{html.escape(r["name"])}"><a href="/queue?{_q(r["name"])}">'
        + f"{html.escape(r['name'])}</a></td>"
        + "".join(
            f'<td data-column="{c}">{_bytes(r[c]) if c == "bytes" else _number(r[c])}</td>' for c in QUEUE_COLUMNS
        )
        + "</tr>"
        for r in shown
    )
    return f"{nav}<table class=queues><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{nav}"


SHOWN = 50  # messages and dead letters a queue's page shows
BODY_CHARS = 200  # of each body


def show_body(body: bytes, size: int | None = None, exact: bool = True) -> str:
    """A body as text when it is printable UTF-8, else as hex; truncated; never markup. ``body`` may
    be the first bytes of a body of ``size`` bytes (a character cut at its end is left out), or of
    about that many when not ``exact``."""
    size = len(body) if size is None else size
    cut = 3 if size > len(body) else 0
    text, printable = "", False
    for end in range(len(body), len(body) - cut - 1, -1):
        try:
            text = body[:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
        printable = text.isprintable()
        break
    shown = text if printable else "hex " + body[: BODY_CHARS // 2].hex(" ")
    more = len(shown) > BODY_CHARS or size > len(body) or (not printable and size > BODY_CHARS // 2)
    about = "" if exact else "about "
    return html.escape(shown[:BODY_CHARS]) + (f" … ({about}{size:,} bytes)" if more or not exact else "")


def queue_page(
    name: str,
    figures: dict,
    oldest: float | None,
    counts: dict,
    content: dict,
    series: dict[str, list[tuple[float, float]]] | None = None,
    *,
    viewer: Viewer = READER,
) -> str:
    """One queue: its figures and charts, its first messages and its first dead letters (``content``
    as the loop read it: ``messages`` and ``dead`` lists of dicts with id, enqueued_us, deliveries,
    body); a logged-in operator also gets the forms to requeue or delete dead letters and purge."""
    rows = [
        ("depth", _number(figures.get("depth", 0))),
        ("in flight", _number(figures.get("inflight", 0))),
        ("dead letters", _number(figures.get("dead_letters", 0))),
        ("bytes", _bytes(figures.get("bytes", 0))),
        ("oldest message", "-" if oldest is None else f"{oldest:,.1f} s"),
        ("produced / acked since start", f"{_number(counts.get('produced', 0))} / {_number(counts.get('acked', 0))}"),
    ]
    table = _figures(rows)
    series = series or {}
    charts = "".join(chart(title, series.get(key, []), unit) for key, title, unit in QUEUE_CHARTS)
    q = _hidden(name=name)

    def listing(title: str, items: list[dict], extra: str, actions: bool = False) -> str:
        head = f"<h2>{html.escape(title)} (first {SHOWN})</h2>"
        if not items:
            return head + "<p class=empty>none</p>"
        cells = "".join(
            f'<tr data-message="{html.escape(m["id"])}"><td class=name>{html.escape(m["id"])}</td>'
            f"<td>{m['deliveries']}</td>"
            f"<td>{html.escape(_when(m[extra]) if extra == 'enqueued_us' else str(m.get(extra, '')))}</td>"
            f"<td class=body>{show_body(m['body'], m.get('size'), m.get('size_exact', True))}</td>"
            + (
                "<td class=actions>"
                + _form("/queue/requeue", viewer, q + _hidden(which=m["id"]), "Requeue", css="inline")
                + _form("/queue/delete", viewer, q + _hidden(which=m["id"]), "Delete", css="inline")
                + "</td>"
                if actions
                else ""
            )
            + "</tr>"
            for m in items
        )
        return (
            head
            + "<table class=messages><tr><th>id</th><th>deliveries</th>"
            + f"<th>{'enqueued' if extra == 'enqueued_us' else extra}</th><th>body</th>"
            + ("<th></th>" if actions else "")
            + f"</tr>{cells}</table>"
        )

    changes = ""
    if viewer.csrf:
        changes = (
            "<section class=changes>"
            + _form("/queue/requeue", viewer, q + _hidden(which="all"), "Requeue dead letters (up to 1,000)")
            + _form(
                "/queue/delete", viewer, q + _hidden(which="all"), "Delete dead letters (up to 1,000)", confirm="sure"
            )
            + _form("/queue/purge", viewer, q, "Purge ready messages", confirm="sure")
            + "</section>"
        )
    purging = "<p class=notice>A purge of this queue is under way.</p>" if content.get("purging") else ""
    return _page(
        f"Queue {name}",
        table
        + purging
        + "<section class=charts>"
        + charts
        + "</section>"
        + changes
        + listing("Messages", content.get("messages", []), "enqueued_us")
        + listing("Dead letters", content.get("dead", []), "reason", actions=bool(viewer.csrf)),
        viewer,
    )


PROTOCOLS = (
    ("native", "Native PZQ (producers and consumers)"),
    ("connections", "ZeroMQ TCP connections"),
    ("phpmq", "PHPMQ"),
    ("mqks", "MQKS"),
    ("emqp", "eMQP (workers, schedules, jobs)"),
    ("api", "API (Spark and batch clients)"),
)


CLIENT_ROWS = 200  # rows of one client list a page shows


def _client_table(table: dict) -> str:
    """One list of clients: ``title``, ``columns``, ``rows`` (at most CLIENT_ROWS shown), ``total``."""
    title = f"<h3>{html.escape(table['title'])} ({_number(table.get('total', len(table['rows'])))})</h3>"
    if not table["rows"]:
        return title + "<p class=empty>none</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table["columns"])
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"name" if i == 0 else ""}">{html.escape(_number(v) if _is_number(v) else str(v))}</td>'
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in table["rows"][:CLIENT_ROWS]
    )
    more = table.get("total", 0) - min(len(table["rows"]), CLIENT_ROWS)
    tail = f"<p class=muted>and {_number(more)} more</p>" if more > 0 else ""
    kind = html.escape(table.get("kind", ""))
    return f'{title}<table class=clients data-clients="{kind}"><tr>{head}</tr>{body}</table>{tail}'


def clients(stats: dict, tables: list[dict] | None = None, *, viewer: Viewer = READER) -> str:
    """What every gateway reports of its clients, with the loop's lists of them (``tables``, each with
    its ``gateway``: eMQP workers and schedules, PHPMQ and MQKS connections), and each consumer group's
    leases: its range, what it holds unacknowledged, and its lag (messages of its queue it holds no
    lease on yet). ``tables`` None: the loop was too busy to list them."""
    parts = [] if tables is not None else ["<p class=notice>The server is busy: the lists of clients are left out.</p>"]
    for key, title in PROTOCOLS:
        figures = stats.get(key)
        if not isinstance(figures, dict):
            continue
        rows = [(name.replace("_", " "), _number(v)) for name, v in figures.items() if _is_number(v)]
        parts.append(f"<h2>{html.escape(title)}</h2>" + (_figures(rows) if rows else "<p class=empty>none</p>"))
        parts.extend(_client_table(t) for t in tables or () if t.get("gateway") == key)
    groups = (stats.get("api") or {}).get("groups") or {}
    queues = stats.get("queues", {})
    rows_html = "".join(
        f'<tr><td class=name data-group="{html.escape(name)}">{html.escape(name)}</td>'
        f"<td>{_number(g.get('base', 0))} .. {_number(g.get('end', 0))}</td><td>{_number(g.get('held', 0))}</td>"
        f"<td>{_number(max(0, queues.get(name.rsplit('/', 1)[0], {}).get('depth', 0) - g.get('held', 0)))}</td></tr>"
        for name, g in sorted(groups.items())
        if isinstance(g, dict)
    )
    parts.append(
        "<h2>Consumer groups (Spark and API)</h2>"
        + (
            "<table class=groups><tr><th>queue/group</th><th>leases</th><th>held</th><th>lag</th></tr>"
            + rows_html
            + "</table>"
            if rows_html
            else "<p class=empty>none</p>"
        )
    )
    return _page("Clients", "".join(parts), viewer)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def query_sort(query: str) -> tuple[str, bool, int]:
    """``sort``, whether descending, and the page, from a query string (anything unknown: by name,
    ascending, the first page)."""
    try:
        params = urllib.parse.parse_qs(query, max_num_fields=4)
    except ValueError:  # (more fields than that: a hand-made URL)
        params = {}
    sort = (params.get("sort") or ["name"])[0]
    sort = sort if sort in QUEUE_COLUMNS else "name"  # (a bounded set: the page cache's keys)
    page = (params.get("page") or ["1"])[0]
    number = int(page) if page.isascii() and page.isdigit() and len(page) < 7 else 1
    return sort, (params.get("order") or ["asc"])[0] == "desc", number


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}nav a{margin-right:1em}
table{border-collapse:collapse}th,td{padding:.25em .75em;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td.name{text-align:left}.figures th{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:1em}
.chart{margin:0;color:#2563eb}.chart figcaption{color:#222}.chart svg{background:#f8fafc;border:1px solid #e2e8f0}
.empty,.muted{color:#888}.notice{background:#fef9c3;padding:.5em}.account{float:right}
form.inline{display:inline;margin-right:.25em}.changes form{margin:.5em 0}
td.body{text-align:left;font-family:monospace;white-space:pre-wrap;word-break:break-all}
"""
