"""Permissions on a running server: the file read at start-up (pzq/permissions.py), the native sockets'
handshake made to check it (a ZAP domain each), and its reload on SIGHUP, with what a narrowed right
cuts off on open connections."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pzq.config import Config
from pzq.errors import ConfigError
from pzq.permissions import CONSUME, PRODUCE, Permissions, Rules, default_path

if TYPE_CHECKING:
    from pzq.curve import CurveServer
    from pzq.endpoints.base import Endpoint

log = logging.getLogger("pzq.server")

# The native sockets, the right each needs on the native queue, and their ZAP domain: on the send
# socket the delivery itself is what must not reach a key without the right, so it is checked before
# the first one, at the handshake.
NATIVE_ROLES = {
    "receive": (PRODUCE, "pzq-produce"),
    "send": (CONSUME, "pzq-consume"),
    "consume": (CONSUME, "pzq-consume"),
}


def permissions_for(cfg: Config, curve: CurveServer | None) -> Permissions:
    """The server's permissions (ConfigError when the file named cannot be read or enforced); with CURVE,
    the native sockets' handshake checks them (call before binding)."""

    def names(key: str) -> str | None:
        return curve.names.get(key) if curve is not None else None

    def check(rules: Rules) -> None:
        # A native socket serving clients without a key cannot refuse one client and not another: the
        # rules must give unnamed clients (the default) its right, or the socket must be CURVE's.
        for role, (right, _) in NATIVE_ROLES.items():
            keyless = curve is None or role in cfg.unauthenticated_roles
            if keyless and getattr(cfg, f"{role}_dsn") and not rules.default.may(right, cfg.queue):
                raise ConfigError(
                    f"permissions file {rules.path}: --{role}-dsn serves clients without a CURVE key, which [default] "
                    f"names, and [default] has no {right} right on the native queue {cfg.queue!r}: grant it there, "
                    f"or let only keys onto --{role}-dsn (CURVE, not --unauthenticated {role})"
                )

    path = cfg.permissions or default_path(cfg.curve_clients)
    permissions = Permissions(path, names, required=bool(cfg.permissions), check=check)
    if curve is not None:
        for right, domain in sorted(set(NATIVE_ROLES.values())):
            roles = [role for role, (_, its) in NATIVE_ROLES.items() if its == domain]
            curve.restrict(roles, domain, _admits(permissions, right, cfg.queue, f"connecting to --{roles[0]}-dsn"))
    return permissions


def _admits(permissions: Permissions, right: str, queue: str, what: str) -> Callable[[str, bool], bool]:
    def admits(key: str, count: bool) -> bool:
        if count:  # (a handshake refused: counted and logged as every refusal is)
            return permissions.key_may(key, right, queue, "native", what)
        return permissions.allows_key(key, right, queue)

    return admits


def reload_permissions(permissions: Permissions, curve: CurveServer | None, endpoints: list[Endpoint]) -> bool:
    """Re-read the file (SIGHUP, after the CURVE keys) and cut off at once what is no longer allowed:
    native connections of keys that lost their socket's right (re-bound, as a revocation does), and
    whatever each gateway keeps registered (workers, consumers). True when sockets were replaced."""
    changed = permissions.reload()
    lost: dict[str, set[str]] = {}
    if curve is not None:
        curve.refresh()
        lost = curve.take_lost()  # (with keys a renamed key file took off in the keys' reload)
    if not changed and not lost:
        return False
    for endpoint in endpoints:
        endpoint.narrowed(lost)
    if lost:
        log.warning(
            "SIGHUP: %s lost their right on the native queue: cut off",
            ", ".join(f"{len(keys)} key(s) of --{role}-dsn" for role, keys in sorted(lost.items())),
        )
    return True
