"""The console's HTTP requests: routing, the pages, the forms of a change, sessions and the checks
every request passes (a Host header must name this server, against DNS rebinding; a change must come
from the console's own pages and carry its session's CSRF token). Each request reads only the shared
state (pzq/console/state.py); what only the loop can read or do is asked of it through that state."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from pzq.console import pages
from pzq.console.auth import SESSION_S, Logins, Session
from pzq.console.state import BEGUN, ConsoleState

log = logging.getLogger("pzq.console")

CHANGE_S = 10.0  # how long a change waits for the loop (and its commit)
MAX_FORM = 8192  # bytes of a posted form
COOKIE = "pzq_session"
MAX_COOKIES = 50  # looked at in one Cookie header
COMMANDS = {"/queue/requeue": "requeue", "/queue/delete": "delete_dead", "/queue/purge": "purge"}


class Handler(BaseHTTPRequestHandler):
    """One HTTP request of the console (a subclass names its ``console``)."""

    console: ConsoleState
    server_version = "pzq-console"
    timeout = 10  # seconds a client may take to send its request

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        # Two requests are handled at once, the rest wait their turn (the request is read by then):
        # many busy browsers must not take the GIL from the loop.
        with self.server.rendering:  # type: ignore[attr-defined]
            self._get()

    def _get(self) -> None:
        if not self._host_ok():
            return
        path, _, query = self.path.partition("?")
        snap = self.console.snapshot()
        viewer = self._viewer()
        if path == "/":
            overview = self.console.rendered(
                ("/",), lambda s: pages.overview_body(s["stats"], s["series"], s["disk_free"])
            )
            body = pages.page("Overview", overview, viewer)
        elif path == "/queues":
            sort, descending, number = pages.query_sort(query)
            table = self.console.rendered(
                ("/queues", sort, descending, number),
                lambda s: pages.queues_table(
                    s["stats"], s["oldest"], s["per_queue"], sort, descending, number, s["rates"]
                ),
            )
            body = pages.page("Queues", table, viewer)
        elif path == "/clients":
            content = self.console.ask("clients", rows=pages.CLIENT_ROWS) or {}  # (None: busy; the page says so)
            stats = {**snap["stats"], **content.get("figures", {})}  # (the gateways' figures as of now)
            body = pages.clients(stats, content.get("tables"), viewer=viewer)
        elif path == "/queue":
            try:
                name = (urllib.parse.parse_qs(query, max_num_fields=2).get("name") or [""])[0]
            except ValueError:  # (more fields than that)
                self._send(HTTPStatus.BAD_REQUEST, "text/plain", b"a query of name=QUEUE, please\n")
                return
            figures = snap["stats"].get("queues", {}).get(name)
            if figures is None:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"no such queue\n")
                return
            content = self.console.look(name)
            if content is None:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain", b"the server is busy: try again\n")
                return
            if content.get("gone"):
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"no such queue\n")
                return
            body = pages.queue_page(
                name,
                content.get("figures", figures),
                snap["oldest"].get(name),
                snap["per_queue"].get(name, {}),
                content,
                self.console.history.queue_series(name),
                viewer=viewer,
            )
        elif path == "/login":
            body = pages.login(self.console.logins.enabled, viewer)
        elif path == "/api/stats":
            self._send(HTTPStatus.OK, "application/json", self.console.rendered(("/api/stats",), _stats_json))
            return
        elif path == "/static/console.css":
            self._send(HTTPStatus.OK, "text/css", pages.CSS.encode())
            return
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")
            return
        self._send(HTTPStatus.OK, "text/html; charset=utf-8", body.encode())

    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        if not self._host_ok():
            return
        path = self.path.partition("?")[0]
        if path not in ("/login", "/logout", *COMMANDS):
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")
            return
        if not self.console.logins.enabled:
            self._send(HTTPStatus.FORBIDDEN, "text/plain", b"the console is read-only: no --http-auth-file\n")
            return
        if not self._same_origin():
            self._refuse_change(HTTPStatus.FORBIDDEN, "a request from another site")
            return
        form = self._form()  # (read before its turn: a client slow to send it holds only its connection)
        if form is None:
            return
        with self.server.rendering:  # type: ignore[attr-defined]
            self._change(path, form)

    def _change(self, path: str, form: dict[str, str]) -> None:
        if path == "/login":
            self._log_in(form)
            return
        key, session = self._session()
        if session is None or key is None:
            self._refuse_change(HTTPStatus.FORBIDDEN, "no session: log in first")
            return
        if not Logins.csrf_ok(session, form.get("csrf", "")):
            self._refuse_change(HTTPStatus.FORBIDDEN, "a form without this session's CSRF token")
            return
        if path == "/logout":
            self.console.logins.log_out(key)
            log.info("console: %s logged out", self.client_address[0])
            self._redirect("/", cookie=f"{COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict")
            return
        name = form.get("name", "")
        if path == "/queue/purge" and form.get("confirm") != "yes":
            session.notice = "not purged: tick the box to confirm"
        elif path == "/queue/delete" and form.get("which", "all") == "all" and form.get("confirm") != "yes":
            session.notice = "nothing deleted: tick the box to confirm"
        else:
            # (a session named in the log by a digest of its key: the key itself is a credential)
            who = f"{self.client_address[0]}, session {hashlib.sha256(key.encode()).hexdigest()[:8]}"
            answer = self.console.ask(
                COMMANDS[path], wait_s=CHANGE_S, name=name, which=form.get("which", "all"), who=who
            )
            self.console.changed(name)
            if answer is None:
                session.notice = "the server is busy: nothing was changed; try again"
            elif answer is BEGUN:
                session.notice = "the server did not confirm in time: look at the queue to see what was done"
            else:
                session.notice = answer["text"]
        self._redirect("/queue?" + urllib.parse.urlencode({"name": name}))

    def _log_in(self, form: dict[str, str]) -> None:
        address = self.client_address[0]
        logins = self.console.logins
        if logins.throttled(address):
            log.warning("console: login from %s refused unchecked: too many failures lately", address)
            self._send(HTTPStatus.TOO_MANY_REQUESTS, "text/plain", b"too many failed logins: wait a minute\n")
            return
        key = logins.log_in(form.get("secret", "").encode(), address)
        if key is None:
            body = pages.login(True, pages.Viewer(notice="wrong secret"))
            self._send(HTTPStatus.FORBIDDEN, "text/html; charset=utf-8", body.encode())
            return
        self._redirect("/", cookie=f"{COOKIE}={key}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_S}")

    def _viewer(self) -> pages.Viewer:
        session = self._session()[1]
        if session is None:
            return pages.Viewer(can_log_in=self.console.logins.enabled)
        notice, session.notice = session.notice, ""
        return pages.Viewer(csrf=session.csrf, notice=notice)

    def _session(self) -> tuple[str | None, Session | None]:
        """The live session one of the request's session cookies names. Every one is tried: another
        site on this host (cookies ignore ports) may have set a decoy of the same name, which the
        browser sends first."""
        for header in self.headers.get_all("Cookie") or ():
            for part in header.split(";")[:MAX_COOKIES]:
                name, _, value = part.strip().partition("=")
                if name == COOKIE and (session := self.console.logins.session(value)) is not None:
                    return value, session
        return None, None

    def _host_ok(self) -> bool:
        """Refuse a Host that is not this server's (a DNS-rebinding page would name its own)."""
        host = _host_of(self.headers.get("Host") or "")
        if host is None or host in self.console.hosts or _is_ip(host):
            return True
        self._send(HTTPStatus.MISDIRECTED_REQUEST, "text/plain", b"unknown host name\n")
        return False

    def _same_origin(self) -> bool:
        """A change must come from the console's own pages: a browser names the page's origin (and
        says whether it is another site); SameSite=Strict already keeps the cookie off other sites."""
        origin = self.headers.get("Origin")
        if self.headers.get("Sec-Fetch-Site") not in (None, "same-origin", "none"):
            return False
        return origin is None or urllib.parse.urlsplit(origin).netloc == self.headers.get("Host")

    def _form(self) -> dict[str, str] | None:
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            self._send(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "text/plain", b"a form, please\n")
            return None
        try:
            size = int(self.headers.get("Content-Length") or "-1")
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_FORM:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "text/plain", b"a form of at most 8 KiB, please\n")
            return None
        try:
            fields = urllib.parse.parse_qs(self.rfile.read(size).decode("utf-8", "replace"), max_num_fields=8)
        except ValueError:
            self._send(HTTPStatus.BAD_REQUEST, "text/plain", b"too many fields\n")
            return None
        return {k: v[0] for k, v in fields.items()}

    def _refuse_change(self, status: HTTPStatus, why: str) -> None:
        log.warning("console: change refused from %s: %s", self.client_address[0], why)
        self._send(status, "text/plain", f"refused: {why}\n".encode())

    def _redirect(self, where: str, cookie: str = "") -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", where)
        if cookie:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", "0")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"GET and POST only\n")

    do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "same-origin")
        self.send_header(
            "Content-Security-Policy",
            "default-src 'self'; script-src 'none'; form-action 'self'; frame-ancestors 'none'",
        )
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the standard library's name
        pass  # (page views are not logged; logins, changes and refusals are, above)


def _host_of(header: str) -> str | None:
    """The host name of a Host header (without its port or an IPv6 literal's brackets); None if empty."""
    header = header.strip().lower()
    if not header:
        return None
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.partition(":")[0].rstrip(".")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _stats_json(snapshot: dict[str, Any]) -> bytes:
    figures = {**snapshot["stats"], "oldest_seconds": snapshot["oldest"], "per_queue": snapshot["per_queue"]}
    return json.dumps(figures).encode()
