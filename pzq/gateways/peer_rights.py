"""Permissions of the raw-TCP gateways' connections (PHPMQ, MQKS): their protocols carry no identity, so
a connection has the rights of the network its peer's address is in (pzq/permissions.py). Each gateway
keeps one ``PeerRights``: the address of every open connection, asked per request, and the re-check of
its consumers after a SIGHUP changed the rules."""

from __future__ import annotations

from collections.abc import Iterable

from pzq.permissions import Permissions

__all__ = ["PeerRights"]


class PeerRights:
    """The source address of each open connection of one gateway, and the checks of what it asks.

    Without permissions (None, or no file) every check answers True at once and no address is kept."""

    def __init__(self, permissions: Permissions | None, protocol: str):
        self.permissions = permissions
        self.protocol = protocol
        self._address: dict[bytes, str] = {}  # open connection -> "ip:port" ("" when unknown)

    @property
    def enabled(self) -> bool:
        return self.permissions is not None and self.permissions.enabled

    def connected(self, conn: bytes, address: str) -> None:
        # (kept even while no file is in force: none can appear on a running server, but cheap)
        self._address[conn] = address

    def gone(self, conn: bytes) -> None:
        self._address.pop(conn, None)

    def address(self, conn: bytes) -> str:
        """The connection's "ip:port" as the endpoint saw it ('' when unknown: [default] applies)."""
        return self._address.get(conn, "")

    def may(self, conn: bytes, right: str, queue: str, what: str) -> bool:
        """Whether the connection's network has ``right`` on ``queue``; a refusal is counted and logged
        (``what``: the request, e.g. 'publish')."""
        if self.permissions is None or not self.permissions.enabled:
            return True
        return self.permissions.peer_may(self._address.get(conn, ""), right, queue, self.protocol, what)

    def may_all(self, conn: bytes, right: str, queues: Iterable[str], what: str) -> str | None:
        """The first of ``queues`` the connection's network has no ``right`` on (counted and logged), or
        None when it has it on every one."""
        if self.permissions is None or not self.permissions.enabled:
            return None
        for queue in queues:
            if not self.may(conn, right, queue, what):
                return queue
        return None

    def allows(self, conn: bytes, right: str, queue: str) -> bool:
        """``may`` without counting a refusal: the re-check of what a connection holds after a SIGHUP."""
        rules = self.permissions.rules if self.permissions is not None else None
        return rules is None or rules.for_address(self._address.get(conn, ""))[1].may(right, queue)
