"""The web console's HTTP side (``--http-dsn http://127.0.0.1:9180``): a thread of the standard
library's HTTP server that renders the snapshot the loop publishes once a second, so a page view never
touches the store, the sockets or the loop's state, and a slow browser never holds the loop.

Read-only in this version: GET only (anything else gets 405), no script in the pages, loopback unless
the operator names another address. Limits: 16 connections at once (more are closed at once), 10 s to
send a request, and the standard library's own: a request or header line of at most 64 KiB, 100
headers.
"""

from __future__ import annotations

import json
import shutil
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pzq.console import pages
from pzq.console.history import History
from pzq.errors import ConfigError
from pzq.metrics import parse_endpoint

MAX_CONNECTIONS = 16


class Console:
    """The snapshot, the history and the HTTP thread."""

    def __init__(self, dsn: str, data_dir: str):
        self.host, self.port = parse_endpoint(dsn, "--http-dsn")
        self.data_dir = data_dir
        self.history = History()
        self._snapshot: dict[str, Any] = {"stats": {}, "oldest": {}, "per_queue": {}, "series": {}, "disk_free": None}
        self._lock = threading.Lock()
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
