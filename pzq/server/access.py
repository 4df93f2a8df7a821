"""Permissions on a running server: the file read at start-up (pzq/permissions.py), the handshake of
the sockets that cannot refuse a request (native, eMQP PUB) made to check it (a ZAP domain each), and
its reload on SIGHUP, with what a narrowed right cuts off on open connections."""

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

# The sockets whose peers a request cannot be refused on, the right each needs, on which queue, and
# their ZAP domain: on the native send socket (and the eMQP PUB, which hands every topic to every
# subscriber) the delivery itself is what must not reach a key without the right, so it is checked
# before the first one, at the handshake. "*" as a queue: every topic (a consume pattern "*" grants it).
HANDSHAKE_ROLES = {
    "receive": (PRODUCE, "pzq-produce", "native"),
    "send": (CONSUME, "pzq-consume", "native"),
    "consume": (CONSUME, "pzq-consume", "native"),
    "emqp-publish": (CONSUME, "pzq-subscribe", "emqp"),
}


def permissions_for(cfg: Config, curve: CurveServer | None) -> Permissions:
    """The server's permissions (ConfigError when the file named cannot be read or enforced); with CURVE,
    the handshake of the native sockets and of the eMQP PUB checks them (call before binding)."""

    def names(key: str) -> str | None:
        return curve.names.get(key) if curve is not None else None

    def queue_of(protocol: str) -> str:
        return cfg.queue if protocol == "native" else "*"

    def check(rules: Rules) -> None:
        # A socket serving clients without a key cannot refuse one client and not another: the rules
        # must give unnamed clients (the default) its right, or the socket must be CURVE's.
        for role, (right, _, protocol) in HANDSHAKE_ROLES.items():
            keyless = curve is None or role in cfg.unauthenticated_roles
            dsn = getattr(cfg, f"{role.replace('-', '_')}_dsn")
            if keyless and dsn and not rules.default.may(right, queue_of(protocol)):
                what = f"the native queue {cfg.queue!r}" if protocol == "native" else "every topic ('*')"
                raise ConfigError(
                    f"permissions file {rules.path}: --{role}-dsn serves clients without a CURVE key, which [default] "
                    f"names, and [default] has no {right} right on {what}: grant it there, or let only keys onto "
                    f"--{role}-dsn (CURVE, not --unauthenticated {role})"
                )

    path = cfg.permissions or default_path(cfg.curve_clients)
    permissions = Permissions(path, names, required=bool(cfg.permissions), check=check)
    if curve is not None:
        for right, domain, protocol in sorted(set(HANDSHAKE_ROLES.values())):
            roles = [role for role, (_, its, _) in HANDSHAKE_ROLES.items() if its == domain]
            what = f"connecting to --{roles[0]}-dsn"
            curve.restrict(roles, domain, _admits(permissions, right, queue_of(protocol), protocol, what))
    return permissions


def _admits(permissions: Permissions, right: str, queue: str, protocol: str, what: str) -> Callable[[str, bool], bool]:
    def admits(key: str, count: bool) -> bool:
        if count:  # (a handshake refused: counted and logged as every refusal is)
            return permissions.key_may(key, right, queue, protocol, what)
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
            "SIGHUP: %s lost their right: cut off",
            ", ".join(f"{len(keys)} key(s) of --{role}-dsn" for role, keys in sorted(lost.items())),
        )
    return True
