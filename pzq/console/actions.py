"""The console's changes, each a POST form from its own pages: log in and out, requeue or delete dead
letters (one or all), purge a queue's ready messages, publish a message. A change needs a session
(``--http-auth-file``'s secret) and its CSRF token, comes from the console's own origin, and is
answered after pzq's reply, which pzq sends after its commit; each is logged at info with the
client's address. Logins are throttled per address and in all (pzq/console/auth.py)."""

from __future__ import annotations

import hashlib
import logging
import urllib.parse

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from pzq.clients.monitor_link import MonitorRefused, MonitorSilent
from pzq.console import render
from pzq.console.auth import SESSION_S, Logins
from pzq.console.site import COOKIE, Console
from pzq.errors import ClientError

log = logging.getLogger("pzq.console")

MAX_FORM = 8192  # bytes of a posted form
MAX_PUBLISH_FORM = 4 << 20  # a publish form: a body of up to MAX_BODY, url-encoded (up to three times as long)
MAX_BODY = (1 << 20) - 4096  # a published body (the monitor socket takes frames of at most 1 MiB)


def routes(console: Console) -> list[Route]:
    """The POST routes of the console's changes."""

    async def log_in(request: Request) -> Response:
        address = _address(request)
        refused = _refused(console, request, MAX_FORM)
        if refused is not None:
            return refused
        form = await request.form(max_files=0, max_fields=8)
        if console.logins.throttled(address):
            log.warning("console: login from %s refused unchecked: too many failures lately", address)
            return PlainTextResponse("too many failed logins: wait a minute\n", 429)
        key = console.logins.log_in(str(form.get("secret", "")).encode(), address)
        if key is None:
            data = {"page": "login", "title": "Log in", "enabled": True}
            return render.page(request, "login.html", data, render.Viewer(notice="wrong secret"), 403)
        response = RedirectResponse("/", 303)
        response.set_cookie(COOKIE, key, max_age=SESSION_S, path="/", httponly=True, samesite="strict")
        return response

    async def change(request: Request) -> Response:
        address = _address(request)
        publishing = request.url.path == "/queue/publish"
        refused = _refused(console, request, MAX_PUBLISH_FORM if publishing else MAX_FORM)
        if refused is not None:
            return refused
        form = await request.form(max_files=0, max_fields=8, max_part_size=MAX_PUBLISH_FORM)
        key, session = console.session(request)
        if session is None or key is None:
            return _refuse(address, 403, "no session: log in first")
        if not Logins.csrf_ok(session, str(form.get("csrf", ""))):
            return _refuse(address, 403, "a form without this session's CSRF token")
        if request.url.path == "/logout":
            console.logins.log_out(key)
            log.info("console: %s logged out", address)
            response = RedirectResponse("/", 303)
            response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
            return response
        name, which = str(form.get("name", "")), str(form.get("which", "all"))
        if not _word(name) or not _word(which):
            return _refuse(address, 400, "a queue name and an id without blanks, please")
        confirmed = form.get("confirm") == "yes"
        body = str(form.get("body", "")).encode()
        text = _request_text(request.url.path, name, which)
        if request.url.path == "/queue/purge" and not confirmed:
            session.notice = "not purged: tick the box to confirm"
        elif request.url.path == "/queue/delete" and which == "all" and not confirmed:
            session.notice = "nothing deleted: tick the box to confirm"
        elif publishing and len(body) > MAX_BODY:
            session.notice = f"not published: a body of at most {MAX_BODY:,} bytes, please"
        else:
            # (the session is named in the log by a digest of its key: the key itself is a credential)
            who = f"{address}, session {hashlib.sha256(key.encode()).hexdigest()[:8]}"
            session.notice = await _carry_out(console, text, body if publishing else None, who)
        return RedirectResponse("/queue?" + urllib.parse.urlencode({"name": name}), 303)

    return [
        Route("/login", log_in, methods=["POST"]),
        Route("/logout", change, methods=["POST"]),
        Route("/queue/requeue", change, methods=["POST"]),
        Route("/queue/delete", change, methods=["POST"]),
        Route("/queue/purge", change, methods=["POST"]),
        Route("/queue/publish", change, methods=["POST"]),
    ]


def _request_text(path: str, name: str, which: str) -> str:
    return {
        "/queue/requeue": f"REQUEUE {name} {which}",
        "/queue/delete": f"DELETEDEAD {name} {which}",
        "/queue/purge": f"PURGE {name}",
        "/queue/publish": f"PUBLISH {name}",
    }.get(path, "")


async def _carry_out(console: Console, text: str, body: bytes | None, who: str) -> str:
    """Ask pzq to make the change; what to tell the operator. Logged at info either way."""
    try:
        answer = await console.reader.write(text, body)
    except MonitorSilent:
        log.warning("console: %s asked %r: pzq did not answer in time", who, text)
        return "pzq did not confirm in time: look at the queue to see what was done"
    except MonitorRefused as exc:
        log.info("console: %s asked %r: refused: %s", who, text, exc)
        detail = str(exc).removeprefix("error: not permitted: ")
        if detail != str(exc):  # (pzq's permissions: the console's own key has not the right)
            why = "pzq's permissions file gives the console's key no such right"
            return f"not permitted, nothing was changed: {detail}: {why}"
        return str(exc)
    except ClientError as exc:
        log.warning("console: %s asked %r: %s", who, text, exc)
        return f"failed: {exc}"
    log.info("console: %s asked %r: %s", who, text, answer)
    return _said(text.split(" ", 1)[0], answer)


def _said(command: str, answer: object) -> str:
    if not isinstance(answer, dict):
        return f"done: {answer}"
    if command == "REQUEUE":
        return f"requeued {answer.get('requeued', 0):,} dead letter(s)"
    if command == "DELETEDEAD":
        return f"deleted {answer.get('deleted', 0):,} dead letter(s)"
    if command == "PURGE":
        more = " (more are being purged)" if answer.get("more") else ""
        return f"purged {answer.get('purged', 0):,} ready message(s){more}"
    if command == "PUBLISH":
        return f"published message {answer.get('id', '?')}"
    return f"done: {answer}"


def _refused(console: Console, request: Request, limit: int) -> Response | None:
    """Why a form is refused before it is read (None: read it): no logins, another site, not a form,
    too long (its Content-Length, which the HTTP parser holds the body to)."""
    address = _address(request)
    if not console.logins.enabled:
        return PlainTextResponse("the console is read-only: no --http-auth-file\n", 403)
    if not _same_origin(request):
        return _refuse(address, 403, "a request from another site")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return PlainTextResponse("a form, please\n", 415)
    length = request.headers.get("content-length", "")
    if not (length.isdigit() and int(length) <= limit):
        return PlainTextResponse(f"a form of at most {limit:,} bytes with its Content-Length, please\n", 413)
    return None


def _same_origin(request: Request) -> bool:
    """A change must come from the console's own pages: a browser names the page's origin (and says
    whether it is another site); SameSite=Strict already keeps the cookie off other sites."""
    if request.headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or urllib.parse.urlsplit(origin).netloc == request.headers.get("host")


def _refuse(address: str, status: int, why: str) -> Response:
    log.warning("console: change refused from %s: %s", address, why)
    return PlainTextResponse(f"refused: {why}\n", status)


def _address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _word(text: str) -> bool:
    return 0 < len(text) <= 1024 and text.isprintable() and not any(c.isspace() for c in text)
