"""The web console's HTTP side (``--http-dsn http://127.0.0.1:9180``): a thread of the standard
library's HTTP server that renders the snapshot the loop publishes once a second, so a page view never
touches the store, the sockets or the loop's state, and a slow browser never holds the loop.

Read-only in this version: GET only (anything else gets 405), no script in the pages, loopback unless
the operator names another address. Limits: 16 connections at once (more are closed at once), 10 s to
send a request, and the standard library's own: a request or header line of at most 64 KiB, 100
headers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import shutil
import threading
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pzq.console import pages
from pzq.console.history import History
from pzq.errors import ConfigError
from pzq.metrics import parse_endpoint

log = logging.getLogger("pzq.console")
MAX_CONNECTIONS = 16
MAX_WAITING = 32  # page views waiting for the loop to read messages for them; more get 503
ANSWER_S = 2.0  # how long a page view waits for the loop


@dataclasses.dataclass
class LoopRequest:
    """A read the console asks the loop to make (the loop owns the store); answered within a turn."""

    kind: str
    args: dict
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Any = None


class Console:
    """The snapshot, the history and the HTTP thread."""

    def __init__(self, dsn: str, data_dir: str):
        self.host, self.port = parse_endpoint(dsn, "--http-dsn")
        self.data_dir = data_dir
        self.history = History()
        self._snapshot: dict[str, Any] = {"stats": {}, "oldest": {}, "per_queue": {}, "series": {}, "disk_free": None}
        self._lock = threading.Lock()
        self.requests: queue.Queue[LoopRequest] = queue.Queue(maxsize=MAX_WAITING)
        self.wake: Callable[[], None] = lambda: None  # the server's: interrupts the loop's poll
        handler = type("Handler", (_Handler,), {"console": self})
        try:
            self.server = _Server((self.host, self.port), handler)
        except OSError as exc:
            raise ConfigError(f"--http-dsn {dsn}: cannot listen: {exc}") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="pzq-console", daemon=True)
        self.thread.start()

    def publish(self, at: float, stats: dict, oldest: dict[str, float], per_queue: dict, commit_ms: float) -> None:
        """The loop's figures for the next page views (called from the loop, about once a second)."""
        self.history.add(at, stats, commit_ms)
        try:
            disk_free: int | None = shutil.disk_usage(self.data_dir).free
        except OSError:
            disk_free = None
        snapshot = {
            "stats": stats,
            "oldest": oldest,
            "per_queue": per_queue,
            "series": self.history.series(),
            "disk_free": disk_free,
        }
        with self._lock:
            self._snapshot = snapshot

    def ask(self, kind: str, **args) -> Any:
        """Have the loop read something (``serve``) and wait for it; None if the loop is too busy."""
        request = LoopRequest(kind, args)
        try:
            self.requests.put_nowait(request)
        except queue.Full:
            return None
        self.wake()
        return request.result if request.done.wait(ANSWER_S) else None

    def serve(self, answer: Callable[[str, dict], Any], limit: int = 8) -> None:
        """Answer up to ``limit`` waiting requests with ``answer`` (called by the loop, each turn)."""
        for _ in range(limit):
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                return
            try:
                request.result = answer(request.kind, request.args)
            except Exception:  # a page's read must never fail the loop's turn: the page says "busy"
                log.exception("the console's %s request failed", request.kind)
            finally:
                request.done.set()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    """One thread per connection, at most MAX_CONNECTIONS of them: one past that is closed at once, so
    that connections that never finish a request cannot pile up threads."""

    daemon_threads = True

    def __init__(self, *args, **kwargs) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    console: Console
    server_version = "pzq-console"
    timeout = 10  # seconds a client may take to send its request

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        path, _, query = self.path.partition("?")
        snap = self.console.snapshot()
        if path == "/":
            body = pages.overview(snap["stats"], snap["series"], snap["disk_free"])
        elif path == "/queues":
            sort, descending = pages.query_sort(query)
            body = pages.queues(snap["stats"], snap["oldest"], snap["per_queue"], sort, descending)
        elif path == "/clients":
            body = pages.clients(snap["stats"])
        elif path == "/queue":
            name = (urllib.parse.parse_qs(query, max_num_fields=2).get("name") or [""])[0]
            figures = snap["stats"].get("queues", {}).get(name)
            if figures is None:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"no such queue\n")
                return
            content = self.console.ask("queue", name=name)
            if content is None:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain", b"the server is busy: try again\n")
                return
            body = pages.queue_page(name, figures, snap["oldest"].get(name), snap["per_queue"].get(name, {}), content)
        elif path == "/api/stats":
            figures = {**snap["stats"], "oldest_seconds": snap["oldest"], "per_queue": snap["per_queue"]}
            self._send(HTTPStatus.OK, "application/json", json.dumps(figures).encode())
            return
        elif path == "/static/console.css":
            self._send(HTTPStatus.OK, "text/css", pages.CSS.encode())
            return
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")
            return
        self._send(HTTPStatus.OK, "text/html; charset=utf-8", body.encode())

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"the console is read-only: GET only\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; script-src 'none'; frame-ancestors 'none'")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the standard library's name
        pass  # (page views are not logged; refusals and errors are the loop's business)
