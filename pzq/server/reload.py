"""SIGHUP: what a running server re-reads, each part on its own (the CURVE client keys first, then the
permissions, then the settings' log level, then the console's process, told to re-read its secret),
each saying in one line whether it took. INFO for what took (an ordinary reload is no warning), ERROR
for what did not, the old value staying."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pzq.config import Config
from pzq.errors import ConfigError
from pzq.server.access import reload_permissions

if TYPE_CHECKING:
    from pzq.curve import CurveServer
    from pzq.endpoints.base import Endpoint
    from pzq.permissions import Permissions
    from pzq.server.console_child import ConsoleChild
    from pzq.systemd import Notifier

log = logging.getLogger("pzq.server")


class Reloading:
    """The reload part of ``Server``."""

    config: Config
    curve: CurveServer | None
    console: ConsoleChild | None
    endpoints: list[Endpoint]
    permissions: Permissions
    notifier: Notifier
    reloader: Callable[[], Config] | None
    _reload_requested: bool
    reloads: int
    _wake_w: int

    def _register(self) -> None:
        raise NotImplementedError

    def request_reload(self) -> None:
        """Re-read what can change while running (the log level, the CURVE client keys, the console's
        secret: SIGHUP is passed on to its process) at the next turn; signal-safe."""
        self._reload_requested = True
        try:
            os.write(self._wake_w, b"r")
        except OSError:
            pass

    def _reload(self) -> None:
        """Each part on its own, each saying in one line whether it took: a bad value in the config file
        must not keep a revoked key in (the revocation is what a SIGHUP is most often sent for)."""
        self._reload_requested = False
        self.notifier.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        parts = (
            ("the CURVE client keys", self._reload_curve),  # first: a revocation waits for nothing else
            ("the permissions", self._reload_permissions),  # second: so does a narrowed right
            ("the settings", self._reload_settings),
            ("the console's secret", self._reload_console),
        )
        for what, part in parts:
            try:
                part()
            except Exception as exc:  # noqa: BLE001 - a part failing on a bug must not skip the others
                log.error("SIGHUP: %s not reloaded, what was there stays (%s: %s)", what, type(exc).__name__, exc)
                log.debug("SIGHUP: %s", what, exc_info=True)  # (the traceback, for a bug report)
        self.reloads += 1
        self.notifier.notify("READY=1", "STATUS=serving")

    def _reload_curve(self) -> None:
        if self.curve is None:
            return
        revoked = self.curve.reload()  # (logs how many keys, how many revoked, or why none were re-read)
        if revoked:
            for endpoint in self.endpoints:
                endpoint.revoked(revoked)
            self._register()

    def _reload_permissions(self) -> None:
        if reload_permissions(self.permissions, self.curve, self.endpoints):
            self._register()

    def _reload_settings(self) -> None:
        if self.reloader is None:
            return
        try:
            fresh = self.reloader()
        except ConfigError as exc:
            log.error("SIGHUP: settings not reloaded, the log level stays %s: %s", self._log_level(), exc)
            return
        logging.getLogger().setLevel(fresh.log_level.upper())
        log.info(
            "SIGHUP: settings reloaded: log level is now %s; other settings take effect at the next restart",
            fresh.log_level,
        )

    def _reload_console(self) -> None:
        if self.console is None or not self.config.http_auth_file:
            return
        pid = self.console.hangup()  # (the console process re-reads its secret itself and logs whether it took)
        if pid is not None:
            log.info("SIGHUP: passed on to the web console (pid %d), which re-reads its secret", pid)

    @staticmethod
    def _log_level() -> str:
        return logging.getLevelName(logging.getLogger().level).lower()
