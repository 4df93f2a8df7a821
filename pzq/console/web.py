"""The web console (``--http-dsn http://127.0.0.1:9180``): a thread of the standard library's HTTP
server that renders the snapshot the loop publishes once a second, so a page view never touches the
store, the sockets or the loop's state, and a slow browser never holds the loop.

Read-only without a login; with ``--http-auth-file`` a person who knows its secret may requeue or
delete dead letters and purge queues (pzq/console/auth.py: sessions, CSRF). A change is a POST form
from the console's own pages, handed to the loop (pzq/endpoints/console.py) and answered after its
commit. No script in the pages; a Host header must name this server (against DNS rebinding); loopback
unless the operator names another address. Limits: 16 connections at once (more are closed at once),
10 s to send a request, forms of 8 KiB, and the standard library's own: a request or header line of at
most 64 KiB, 100 headers.

The parts: the shared state (pzq/console/state.py), the requests (handler.py), the connection limits
(listener.py), the pages (pages.py). Only the CLI imports this package: it hands ``Console.from_config``
to the server, which knows the console only as pzq.endpoints.console.WebConsole.
"""

from __future__ import annotations

import logging
import socket
import threading

from pzq.config import DEFAULT_LIMITS, Config, Limits, parse_endpoint
from pzq.console.auth import Logins, read_secret
from pzq.console.handler import Handler
from pzq.console.listener import Listener
from pzq.console.state import ConsoleState
from pzq.errors import ConfigError

log = logging.getLogger("pzq.console")


class Console(ConsoleState):
    """The shared state, the logins and the HTTP thread (started here, ended by ``close``)."""

    def __init__(
        self, dsn: str, data_dir: str, auth_file: str = "", host_names: str = "", limits: Limits = DEFAULT_LIMITS
    ):
        self.host, self.port = parse_endpoint(dsn, "--http-dsn")
        self.auth_file = auth_file
        logins = Logins(read_secret(auth_file) if auth_file else None)
        super().__init__(data_dir, logins, _host_names(self.host, host_names))
        handler = type("Handler", (Handler,), {"console": self})
        try:
            self.server = Listener((self.host, self.port), handler, limits)
        except OSError as exc:
            raise ConfigError(f"--http-dsn {dsn}: cannot listen: {exc}") from None
        self.port = self.server.server_address[1]
        self.server.trusted = self.logins.trusted
        self.thread = threading.Thread(target=self.server.serve_forever, name="pzq-console", daemon=True)
        self.thread.start()

    @classmethod
    def from_config(cls, config: Config) -> Console:
        """The console of ``--http-dsn`` and its settings (the factory the CLI hands the server)."""
        return cls(config.http_dsn, config.database, config.http_auth_file, config.http_host_names, config.limits)

    def reload_secret(self) -> None:
        """Re-read --http-auth-file (SIGHUP): a changed secret ends every session. ConfigError if the
        file is no longer readable (the old secret stays)."""
        if self.auth_file and self.logins.replace_secret(read_secret(self.auth_file)):
            log.warning("console: --http-auth-file changed: every session has ended")

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.server.shutdown()
        self.server.server_close()


def _host_names(host: str, configured: str) -> frozenset[str]:
    """The names a browser may call this console by (IP literals are always accepted)."""
    names = {host.lower(), "localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    names.update(name.strip().lower().rstrip(".") for name in configured.split(","))
    return frozenset(n for n in names if n)
