"""The systemd notify protocol (sd_notify(3)) without libsystemd: datagrams to $NOTIFY_SOCKET.

``Notifier.from_environment()`` is inert when the process was not started by systemd with
``Type=notify``, so the server calls it unconditionally. The watchdog interval comes from
$WATCHDOG_USEC (only if $WATCHDOG_PID is unset or ours); the server pings at half of it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("pzq.systemd")


class Notifier:
    """Sends READY=1, STOPPING=1, STATUS=... and WATCHDOG=1 to systemd, if it listens."""

    def __init__(self, address: str | None, watchdog_s: float | None = None):
        self.address = address
        self.watchdog_s = watchdog_s
        self._sock: socket.socket | None = None

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET") or None
        watchdog_s = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog_s = int(usec) / 1e6
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` fields in one datagram; False (and a log line) if it could not be sent."""
        if self.address is None:
            return False
        # An address that starts with "@" is in the abstract namespace (a leading NUL byte).
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(fields).encode(), target)
            return True
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", self.address, exc)
            return False

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1", "STATUS=stopping")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
