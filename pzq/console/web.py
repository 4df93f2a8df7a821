"""The web console's HTTP side (``--http-dsn http://127.0.0.1:9180``): a thread of the standard
library's HTTP server that renders the snapshot the loop publishes once a second, so a page view never
touches the store, the sockets or the loop's state, and a slow browser never holds the loop.

Read-only without a login; with ``--http-auth-file`` a person who knows its secret may requeue or
delete dead letters and purge queues (pzq/console/auth.py: sessions, CSRF). A change is a POST form
from the console's own pages, handed to the loop (pzq/endpoints/console.py) and answered after its
commit. No script in the pages; a Host header must name this server (against DNS rebinding); loopback
unless the operator names another address. Limits: 16 connections at once (more are closed at once),
10 s to send a request, forms of 8 KiB, and the standard library's own: a request or header line of at
most 64 KiB, 100 headers.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import ipaddress
import json
import logging
import queue
import shutil
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pzq.config import parse_endpoint
from pzq.console import pages
from pzq.console.auth import SESSION_S, Logins, Session, read_secret, source_of
from pzq.console.history import History
from pzq.errors import ConfigError

log = logging.getLogger("pzq.console")
MAX_CONNECTIONS = 16
RENDERING = 2  # requests handled at once (the rest wait their turn): the loop shares the GIL with them
CONNECTIONS_PER_S = 100  # accepted a second in all, in bursts of as many; past that closed at once
MAX_SOURCES = 4096  # addresses whose rate is remembered (the least recent are forgotten)
SOURCE_PER_S = 20  # accepted a second from one address (an IPv6 /64), in bursts of twice that
MAX_PER_ADDRESS = 8  # connections from one address: one client cannot take every slot
CONNECTION_S = 15.0  # a connection's whole life: its request, the loop's answer, the page sent
MAX_WAITING = 32  # page views waiting for the loop to read messages for them; more get 503
ANSWER_S = 2.0  # how long a page view waits for the loop
CHANGE_S = 10.0  # how long a change waits for the loop (and its commit)
MAX_FORM = 8192  # bytes of a posted form
COOKIE = "pzq_session"
MAX_COOKIES = 50  # looked at in one Cookie header
COMMANDS = {"/queue/requeue": "requeue", "/queue/delete": "delete_dead", "/queue/purge": "purge"}
RENDERED_KEPT = 256  # pages kept for the current snapshot
PAGE_CACHE_S = 1.0  # a queue's content is read by the loop at most this often
PAGES_CACHED = 64
BEGUN = object()  # ask(): the loop took a change on but did not answer in time


@dataclasses.dataclass
class LoopRequest:
    """A read or a change the console asks of the loop (the loop owns the store): a read is answered
    within a turn, a change after the commit of the turn that made it."""

    kind: str
    args: dict
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Any = None
    _state: str = "waiting"  # -> "begun" (the loop took it on) or "dropped" (the page stopped waiting)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """The loop takes the request on: False if its page stopped waiting (then nothing is done)."""
        with self._lock:
            if self._state == "dropped":
                return False
            self._state = "begun"
            return True

    def drop(self) -> bool:
        """The page stops waiting: True if the loop had not begun it (and now never will)."""
        with self._lock:
            if self._state == "begun":
                return False
            self._state = "dropped"
            return True


class Console:
    """The snapshot, the history, the logins and the HTTP thread."""

    def __init__(self, dsn: str, data_dir: str, auth_file: str = "", host_names: str = ""):
        self.host, self.port = parse_endpoint(dsn, "--http-dsn")
        self.data_dir = data_dir
        self.auth_file = auth_file
        self.history = History()
        self.logins = Logins(read_secret(auth_file) if auth_file else None)
        self._snapshot: dict[str, Any] = {
            "stats": {},
            "oldest": {},
            "per_queue": {},
            "series": {},
            "rates": {},
            "disk_free": None,
        }
        self._lock = threading.Lock()
        self._pages: collections.OrderedDict[str, tuple[float, Any]] = collections.OrderedDict()  # (see look)
        self._rendered: dict[tuple, Any] = {}  # (see rendered)
        self.requests: queue.Queue[LoopRequest] = queue.Queue(maxsize=MAX_WAITING)
        self.wake: Callable[[], None] = lambda: None  # the server's: interrupts the loop's poll
        handler = type("Handler", (_Handler,), {"console": self})
        try:
            self.server = _Server((self.host, self.port), handler)
        except OSError as exc:
            raise ConfigError(f"--http-dsn {dsn}: cannot listen: {exc}") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.hosts = _host_names(self.host, host_names)
        self.server.trusted = self.logins.trusted
        self.thread = threading.Thread(target=self.server.serve_forever, name="pzq-console", daemon=True)
        self.thread.start()

    def publish(self, at: float, stats: dict, oldest: dict[str, float], per_queue: dict, commit_ms: float) -> None:
        """The loop's figures for the next page views (called from the loop, about once a second)."""
        self.history.add(at, stats, commit_ms, per_queue)
        try:
            disk_free: int | None = shutil.disk_usage(self.data_dir).free
        except OSError:
            disk_free = None
        snapshot = {
            "stats": stats,
            "oldest": oldest,
            "per_queue": per_queue,
            "series": self.history.series(),
            "rates": self.history.queue_rates(),
            "disk_free": disk_free,
        }
        with self._lock:
            self._snapshot = snapshot
            self._rendered = {}

    def ask(self, kind: str, wait_s: float = ANSWER_S, **args) -> Any:
        """Have the loop read or change something and wait for its answer: None if the loop is too
        busy (nothing was done), ``BEGUN`` if it took a change on but did not answer in time."""
        request = LoopRequest(kind, args)
        try:
            self.requests.put_nowait(request)
        except queue.Full:
            return None
        self.wake()
        if request.done.wait(wait_s):
            return request.result
        if request.drop():
            return None  # (the loop never began it, and now never will)
        return request.result if request.done.wait(wait_s) else BEGUN

    def rendered(self, key: tuple, build: Callable[[dict[str, Any]], Any]) -> Any:
        """``build(snapshot)``, made once per snapshot for every viewer: a page of every queue costs
        its rendering (and the interpreter's lock the loop needs) once a second, however often it is
        asked for. ``key`` names the page and its arguments (a bounded set: sorts and page numbers)."""
        with self._lock:
            snapshot, made = self._snapshot, self._rendered
            if key in made:
                return made[key]
        value = build(snapshot)
        with self._lock:
            if self._rendered is made and len(made) < RENDERED_KEPT:
                made[key] = value
        return value

    def look(self, name: str) -> Any:
        """A queue's first messages and dead letters, read by the loop at most once a second per queue
        (a flood of views of one queue costs the loop one read a second); None if the loop is busy."""
        with self._lock:
            cached = self._pages.get(name)
        if cached is not None and time.monotonic() - cached[0] < PAGE_CACHE_S:
            return cached[1]
        content = self.ask("queue", name=name)
        if content is not None:
            with self._lock:
                self._pages[name] = (time.monotonic(), content)
                self._pages.move_to_end(name)
                while len(self._pages) > PAGES_CACHED:
                    self._pages.popitem(last=False)
        return content

    def changed(self, name: str) -> None:
        """A change was made to queue ``name``: its next page view reads it afresh."""
        with self._lock:
            self._pages.pop(name, None)

    def reload_secret(self) -> None:
        """Re-read --http-auth-file (SIGHUP): a changed secret ends every session. ConfigError if the
        file is no longer readable (the old secret stays)."""
        if self.auth_file and self.logins.replace_secret(read_secret(self.auth_file)):
            log.warning("console: --http-auth-file changed: every session has ended")

    def take(self, limit: int) -> Iterator[LoopRequest]:
        """Up to ``limit`` waiting requests, one at a time (the rest wait for the next turn)."""
        for _ in range(limit):
            try:
                yield self.requests.get_nowait()
            except queue.Empty:
                return

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS of them and MAX_PER_ADDRESS from one address:
    one past that is closed at once, so that connections that never finish a request cannot pile up
    threads. Each connection has CONNECTION_S in all (not per read: a client that sends a byte every
    few seconds is cut off all the same)."""

    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.rendering = threading.BoundedSemaphore(RENDERING)
        self.tokens, self.filled = float(CONNECTIONS_PER_S), time.monotonic()
        self.sources: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        self.trusted: Callable[[str], bool] = lambda address: False  # (the console's logins say)
        self.per_address: collections.Counter[str] = collections.Counter()
        self.count_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    request_queue_size = 128  # (the listen backlog: socketserver's 5 drops a browser's burst)

    def process_request(self, request, client_address) -> None:
        if not self.spend(client_address[0]):
            self.shutdown_request(request)
            return
        address = client_address[0]
        with self.count_lock:
            crowded = self.per_address[address] >= MAX_PER_ADDRESS
            if not crowded:
                self.per_address[address] += 1
        if crowded or not self.slots.acquire(blocking=False):
            if not crowded:
                self._forget(address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            self._forget(address)
            raise

    def process_request_thread(self, request, client_address) -> None:
        deadline = threading.Timer(CONNECTION_S, _cut, (request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self.slots.release()
            self._forget(client_address[0])

    def spend(self, address: str) -> bool:
        """Take a connection's tokens: False past SOURCE_PER_S from its address, or past
        CONNECTIONS_PER_S in all unless the address has logged in before (a flood is closed before it
        costs a thread: the loop shares the GIL with every request handled; and a flood from one
        address, or from strangers, leaves the operator's browser served)."""
        source, trusted = source_of(address), self.trusted(address)
        with self.count_lock:
            now = time.monotonic()
            tokens, filled = self.sources.pop(source, (2.0 * SOURCE_PER_S, now))
            tokens = min(2.0 * SOURCE_PER_S, tokens + (now - filled) * SOURCE_PER_S)
            self.tokens = min(float(CONNECTIONS_PER_S), self.tokens + (now - self.filled) * CONNECTIONS_PER_S)
            self.filled = now
            allowed = tokens >= 1 and (trusted or self.tokens >= 1)
            if allowed:
                tokens -= 1
                self.tokens = max(0.0, self.tokens - 1)
            self.sources[source] = (tokens, now)
            while len(self.sources) > MAX_SOURCES:
                self.sources.popitem(last=False)
            return allowed

    def _forget(self, address: str) -> None:
        with self.count_lock:
            self.per_address[address] -= 1
            if self.per_address[address] <= 0:
                del self.per_address[address]

    def handle_error(self, request, client_address) -> None:
        # (a browser that went away mid-answer, a connection cut at its deadline: one line, not a trace)
        log.debug("console: connection from %s ended: %s", client_address[0], sys.exc_info()[1])


def _cut(connection: socket.socket) -> None:
    """End a connection past its deadline: its thread's blocked read or write returns at once."""
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    console: Console
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
            content = self.console.ask("clients") or {}  # (None: busy; the page says so)
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
            log.warning("console: %s logged out", self.client_address[0])
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


def _host_names(host: str, configured: str) -> frozenset[str]:
    """The names a browser may call this console by (IP literals are always accepted)."""
    names = {host.lower(), "localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    names.update(name.strip().lower().rstrip(".") for name in configured.split(","))
    return frozenset(n for n in names if n)


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
