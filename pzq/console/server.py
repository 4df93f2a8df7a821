"""Running the console (``pzq console``): its listening socket, the link to pzq's monitor, and uvicorn
with limits of its own: LIMIT_CONCURRENCY connections and requests at once (more get 503 at once),
KEEP_ALIVE_S idle on a kept-alive connection, a listen BACKLOG, h11 as the HTTP parser (pure Python,
strict, with a bound on an incomplete request's size), and pzq/console/connections.py's deadline per
request and room made for a new connection by closing the one that waited longest. The socket is
bound before uvicorn starts, so a port in use is one clear line and a non-zero exit (the supervisor in
``pzq serve`` logs it and tries again later). SIGTERM and SIGINT end it with status 0, and so does the
end of its standard input when that is a pipe (the supervisor's: the server is gone); SIGHUP re-reads
the secret file."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import socket
import stat
from typing import Any

import uvicorn

from pzq.clients.monitor_link import CurveKeys, MonitorLink
from pzq.config import parse_endpoint
from pzq.console.app import build
from pzq.console.auth import Logins, read_secret
from pzq.console.connections import Connection
from pzq.console.guard import host_names
from pzq.console.reader import READS_IN_FLIGHT, Reader
from pzq.console.site import Console
from pzq.errors import ConfigError

log = logging.getLogger("pzq.console")

LIMIT_CONCURRENCY = 64  # connections and requests at once; more are answered 503 by uvicorn itself
KEEP_ALIVE_S = 5  # an idle kept-alive connection is closed after this
BACKLOG = 128  # connections the kernel queues before uvicorn accepts them
MAX_INCOMPLETE = 16 * 1024  # bytes of a request line and headers not yet complete (h11's bound)
SHUTDOWN_S = 2  # open connections get this long to finish at SIGTERM
MONITOR_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class Options:
    """What `pzq console` was told."""

    http_dsn: str
    monitor_dsn: str
    auth_file: str = ""
    host_names: str = ""
    poll_s: float = 1.0
    curve: CurveKeys | None = None


def listen(dsn: str) -> socket.socket:
    """The bound, listening socket of ``--http-dsn``; ConfigError with the reason if it cannot be."""
    host, port = parse_endpoint(dsn, "--http-dsn")
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(BACKLOG)
    except OSError as exc:
        raise ConfigError(f"--http-dsn {dsn}: cannot listen: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


class _AsConsole(logging.Handler):
    """uvicorn's own lines (its loggers ``uvicorn``, ``uvicorn.error``: a refused connection, an error in
    a request, its shutdown) passed on as the console's: one logger name for everything this process says,
    so an operator filters on ``pzq.console`` and misses nothing."""

    def emit(self, record: logging.LogRecord) -> None:
        record.name = log.name
        log.handle(record)


def route_uvicorn_logs() -> None:
    """Send uvicorn's loggers' records on as ``pzq.console``'s (and not on to the root's handlers too)."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.asgi"):
        one = logging.getLogger(name)
        one.handlers = [_AsConsole()]
        one.propagate = False


class _Server(uvicorn.Server):
    """uvicorn's server, ending with status 0 at SIGTERM or SIGINT: uvicorn raises the signal again once
    it has shut down (so that the process dies of it), which the supervisor would log as a crash."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def _reload_secret(path: str, logins: Logins) -> None:
    """SIGHUP (``pzq serve`` passes its own on): read --http-auth-file again; a changed secret ends every
    session (someone who knew the old one must be shut out). An unreadable file keeps the old secret."""
    try:
        changed = logins.replace_secret(read_secret(path))
    except ConfigError as exc:
        log.warning("console: SIGHUP: %s; the old secret stays", exc)
        return
    if changed:
        log.warning("console: --http-auth-file changed: every session has ended")
    else:
        log.info("console: SIGHUP: --http-auth-file re-read, the secret is unchanged")


def _stop_at_eof(server: uvicorn.Server) -> None:
    """When standard input is a pipe (``pzq serve``, the supervisor, holds its other end and writes no
    more than the key line), its end of file means the server is gone, even killed outright: stop too.
    A terminal or /dev/null (a console run by hand, or by systemd) is not watched."""
    try:
        if not stat.S_ISFIFO(os.fstat(0).st_mode):
            return
    except OSError:
        return
    loop = asyncio.get_running_loop()

    def readable() -> None:
        try:
            more = os.read(0, 4096)
        except BlockingIOError:
            return
        except OSError:
            more = b""
        if not more:
            loop.remove_reader(0)
            log.info("console: standard input closed (pzq serve is gone): stopping")
            server.should_exit = True

    loop.add_reader(0, readable)


def run(options: Options) -> None:
    """Serve until SIGTERM or SIGINT. ConfigError for a bad secret file or a port that cannot be bound."""
    logins = Logins(read_secret(options.auth_file) if options.auth_file else None)
    host = parse_endpoint(options.http_dsn, "--http-dsn")[0]
    sock = listen(options.http_dsn)
    try:
        asyncio.run(_serve(options, logins, host, sock))
    finally:
        sock.close()


async def _serve(options: Options, logins: Logins, host: str, sock: socket.socket) -> None:
    # (the poller's socket, READS_IN_FLIGHT reads and one change: nothing more ever waits on pzq)
    link = MonitorLink(options.monitor_dsn, size=READS_IN_FLIGHT + 2, timeout_s=MONITOR_TIMEOUT_S, curve=options.curve)
    reader = Reader(link, options.poll_s)
    app = build(Console(reader, logins, host_names(host, options.host_names)))
    config = uvicorn.Config(
        app,
        http=Connection,  # (uvicorn's h11 protocol: a deadline per request, the longest waiting closed for a new one)
        ws="none",
        lifespan="on",
        limit_concurrency=LIMIT_CONCURRENCY,
        timeout_keep_alive=KEEP_ALIVE_S,
        backlog=BACKLOG,
        h11_max_incomplete_event_size=MAX_INCOMPLETE,
        timeout_graceful_shutdown=SHUTDOWN_S,
        proxy_headers=False,
        server_header=False,
        access_log=False,
        log_config=None,
    )
    route_uvicorn_logs()
    server = _Server(config)
    where = sock.getsockname()
    log.info(
        "console: serving http://%s:%d/ from pzq at %s (STATS every %g s%s)",
        where[0],
        where[1],
        options.monitor_dsn,
        options.poll_s,
        ", logins on" if logins.enabled else ", read-only",
    )
    _stop_at_eof(server)
    if options.auth_file:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload_secret, options.auth_file, logins)
    try:
        await server.serve(sockets=[sock])
    finally:
        link.close()
    log.info("console: stopped")
