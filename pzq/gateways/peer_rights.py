"""Permissions of the raw-TCP gateways' connections (PHPMQ, MQKS): their protocols carry no identity, so
a connection has the rights of the network its peer's address is in (pzq/permissions.py). Each gateway
keeps one ``PeerRights``: the address of every open connection, asked per request, and the re-check of
its consumers after a SIGHUP changed the rules."""

from __future__ import annotations

from collections.abc import Iterable

from pzq.permissions import Permissions, Rights, Rules

__all__ = ["PeerRights"]


class PeerRights:
    """The source address of each open connection of one gateway, and the checks of what it asks.

    Without permissions (None, or no file) every check answers True at once."""

    def __init__(self, permissions: Permissions | None, protocol: str):
        self.permissions = permissions
        self.protocol = protocol
        self._address: dict[bytes, str] = {}  # open connection -> "ip:port" ("" when unknown)
        # Per connection, the rules its rights were looked up in and those rights: finding a peer's
        # network parses its address (microseconds), which a request of 10,000 events must not pay each.
        self._rights: dict[bytes, tuple[Rules, Rights]] = {}

    @property
    def enabled(self) -> bool:
        return self.permissions is not None and self.permissions.enabled

    def connected(self, conn: bytes, address: str) -> None:
        # (kept even while no file is in force: one that appears is read on SIGHUP, and must find them)
        self._address[conn] = address

    def gone(self, conn: bytes) -> None:
        self._address.pop(conn, None)
        self._rights.pop(conn, None)

    def _of(self, conn: bytes, rules: Rules) -> Rights:
        """The connection's rights under ``rules`` (looked up once per connection and reload)."""
        cached = self._rights.get(conn)
        if cached is None or cached[0] is not rules:
            cached = self._rights[conn] = (rules, rules.for_address(self._address.get(conn, ""))[1])
        return cached[1]

    def may(self, conn: bytes, right: str, queue: str, what: str) -> bool:
        """Whether the connection's network has ``right`` on ``queue``; a refusal is counted and logged
        (``what``: the request, e.g. 'publish')."""
        permissions = self.permissions
        if permissions is None or permissions.rules is None or self._of(conn, permissions.rules).may(right, queue):
            return True
        # (refused: the permissions count and log it, with the network's name)
        return permissions.peer_may(self._address.get(conn, ""), right, queue, self.protocol, what)

    def may_all(self, conn: bytes, right: str, queues: Iterable[str], what: str) -> str | None:
        """The first of ``queues`` the connection's network has no ``right`` on (counted and logged), or
        None when it has it on every one."""
        rules = self.permissions.rules if self.permissions is not None else None
        if rules is None:
            return None
        may = self._of(conn, rules).may
        for queue in queues:
            if not may(right, queue):
                self.may(conn, right, queue, what)  # (counted and logged)
                return queue
        return None

    def of(self, conn: bytes) -> Rights | None:
        """The connection's rights under the rules in force (None: no file, everything is allowed)."""
        rules = self.permissions.rules if self.permissions is not None else None
        return None if rules is None else self._of(conn, rules)

    def allows(self, conn: bytes, right: str, queue: str) -> bool:
        """``may`` without counting a refusal: the re-check of what a connection holds after a SIGHUP."""
        rules = self.permissions.rules if self.permissions is not None else None
        return rules is None or self._of(conn, rules).may(right, queue)
