"""The console's ASGI application (Starlette): its pages, each with a JSON twin under /api (what
console.js fetches every 2 s to update the page in place), the static files, the 404 page, and the
changes of pzq/console/actions.py. A page reads only the poller's snapshot and history and, for a
queue or the clients, reads the reader caches and bounds (pzq/console/reader.py): never more than a few
requests wait on pzq, whatever the browsers do. Every GET route answers HEAD too."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pzq.clients.monitor_link import MonitorRefused
from pzq.console import actions, render, views
from pzq.console.connections import Connection
from pzq.console.guard import Guard
from pzq.console.history import pick
from pzq.console.reader import Busy
from pzq.console.site import Console
from pzq.errors import ClientError

NO_QUEUE = "error: there is no queue"  # pzq's answer for a queue it does not have
NOT_PERMITTED = "error: not permitted: "  # pzq's answer to a request the console's key has not the right for


def respond(console: Console, request: Request, template: str, data: dict, status: int = 200) -> Response:
    if request.url.path.startswith("/api/"):
        return render.twin(data, status)
    return render.page(request, template, data, console.viewer(request), status)


def build(console: Console) -> Any:
    """The ASGI app: the routes behind the Host check and the security headers (pzq/console/guard.py)."""

    async def overview(request: Request) -> Response:
        data = views.overview(console.reader.snapshot, console.reader.history, pick(request.query_params.get("range")))
        return respond(console, request, "overview.html", data)

    async def queues(request: Request) -> Response:
        params = request.query_params
        sort = params.get("sort", "name")
        contains = params.get("filter", "")[:200]
        descending = params.get("order") == "desc"
        data = views.queues(console.reader.snapshot, sort, descending, _int(params.get("page"), 1), contains)
        return respond(console, request, "queues.html", data)

    async def queue(request: Request) -> Response:
        return await _queue(console, request)

    async def clients(request: Request) -> Response:
        return await _clients(console, request)

    async def login(request: Request) -> Response:
        data = {"page": "login", "title": "Log in", "enabled": console.logins.enabled}
        return respond(console, request, "login.html", data)

    async def itself(request: Request) -> Response:
        connections = {
            "connections_open": Connection.opened,
            "connections_evicted_total": Connection.evicted_total,  # (waited longest, closed for a new one)
            "requests_cut_total": Connection.cut_total,
        }
        return render.twin({**console.reader.figures(), **connections})

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 405:
            return render.message(request, "Not allowed", "This address answers GET and HEAD only.", 405)
        return render.message(request, "Not found", "There is no such page here.", status, console.viewer(request))

    static = StaticFiles(directory=str(importlib.resources.files("pzq.console") / "static"))
    routes = [
        Route("/", overview),
        Route("/api/overview", overview),
        Route("/queues", queues),
        Route("/api/queues", queues),
        Route("/queue", queue),
        Route("/api/queue", queue),
        Route("/clients", clients),
        Route("/api/clients", clients),
        Route("/login", login),
        Route("/api/console", itself),
        Mount("/static", static, name="static"),
        *actions.routes(console),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.reader.start()
        await console.reader.first(2.0)
        try:
            yield
        finally:
            await console.reader.stop()

    app = Starlette(routes=routes, exception_handlers={HTTPException: not_found}, lifespan=lifespan)
    return Guard(app, console.hosts)


async def _queue(console: Console, request: Request) -> Response:
    """A queue's page: its figures, the messages at its head and its dead letters (three monitor reads)."""
    name = request.query_params.get("name", "")
    after = request.query_params.get("dead_after", "")
    trail = tuple(t for t in request.query_params.get("dead_trail", "").split(",")[-views.TRAIL :] if t)
    snap = console.reader.snapshot
    known = name in (snap.stats.get("queues") or {})
    if not name or not _word(name) or (after and not _word(after)) or not all(_word(t) for t in trail):
        return _not_found(console, request, name)
    texts = (f"QUEUE {name}", f"PEEK {name} {views.PEEKED}", f"DEAD {name} {views.DEAD_PER_PAGE} {after}".strip())
    answers = await asyncio.gather(*(console.reader.read(t) for t in texts), return_exceptions=True)
    if any(isinstance(a, Busy) for a in answers):
        return _busy(console, request)
    if any(isinstance(a, MonitorRefused) and str(a).startswith(NO_QUEUE) for a in answers):
        return _not_found(console, request, name)
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, ClientError):
            raise answer
    info, peek, dead = (a if isinstance(a, dict) else None for a in answers)
    if not known and info is None:
        return _not_found(console, request, name)
    range_name = pick(request.query_params.get("range"))
    data = views.queue(snap, console.reader.history, name, info, peek, dead, after, trail, range_name)
    # A read pzq's permissions refuse the console's key (PEEK, DEAD: they show bodies) is said in
    # place of its list, and the page is a 403 (its JSON twin too, which console.js still applies:
    # the figures, anyone's, stay live)
    refused = [_not_permitted(a) for a in answers]
    data["not_permitted"] = {"messages": refused[1], "dead": refused[2]}
    notes = (str(a) for a, why in zip(answers, refused, strict=True) if isinstance(a, ClientError) and not why)
    data["notes"] = list(dict.fromkeys(notes))
    return respond(console, request, "queue.html", data, 403 if any(refused) else 200)


async def _clients(console: Console, request: Request) -> Response:
    """The connected clients' page, a page of rows at ``offset``."""
    offset = _int(request.query_params.get("offset"), 0) // views.CLIENT_ROWS * views.CLIENT_ROWS
    try:
        answer = await console.reader.read(f"CLIENTS {views.CLIENT_ROWS} {offset}")
    except Busy:
        return _busy(console, request)
    except ClientError as exc:
        answer, note = None, str(exc)
    else:
        note = ""
    data = views.clients(console.reader.snapshot, answer if isinstance(answer, dict) else None, offset)
    data["notes"] = [note] if note else []
    return respond(console, request, "clients.html", data)


def _not_found(console: Console, request: Request, name: str) -> Response:
    text = f"There is no queue {name!r} on this server." if name else "Which queue? A name, please."
    return render.message(request, "No such queue", text, 404, console.viewer(request))


def _not_permitted(answer: object) -> str:
    """What the page says for a read pzq refused the console's key ('' for any other answer)."""
    if not (isinstance(answer, MonitorRefused) and str(answer).startswith(NOT_PERMITTED)):
        return ""
    why = str(answer).removeprefix(NOT_PERMITTED)
    return f"not permitted: {why}: pzq's permissions file gives the console's key no such right, so these are not shown"


def _busy(console: Console, request: Request) -> Response:
    text = "pzq is answering other pages of this console: try again in a moment."
    return render.message(request, "Busy", text, 503, console.viewer(request))


def _word(text: str) -> bool:
    """A queue name or id the monitor's one-line requests can carry: no blanks, not too long."""
    return 0 < len(text) <= 1024 and text.isprintable() and not any(c.isspace() for c in text)


def _int(text: str | None, default: int) -> int:
    return int(text) if text and text.isascii() and text.isdigit() and len(text) < 9 else default
