"""ZeroMQ CURVE for the ZeroMQ endpoints: the server's key pair, the allowed clients' public keys,
pyzmq's authenticator (a ZAP handler in a thread of its own, as pyzmq provides it), and the gate that
checks every received message's key against the current allow-list.

Keys are pyzmq certificate files (``zmq.auth``, read by ``curve_keys.py``, which the clients use too):
``NAME.key`` holds a public key, ``NAME.key_secret`` the pair. ``pzq keygen DIR NAME`` writes both. The
server reads its ``.key_secret`` file; a client is let in only if its public key is a ``.key`` file in
the clients directory (read at start-up and on SIGHUP). The handshake alone would let a connection made
before a key's removal live on, so every message is checked too: libzmq tags it with the key its
connection authenticated with (ZAP User-Id).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from pzq.curve_keys import keygen, load_pair, secure_client
from pzq.errors import ConfigError

__all__ = ["DOMAIN", "CurveServer", "Gate", "keygen", "secure_client"]  # (the key helpers stay here too)

log = logging.getLogger("pzq.curve")
DOMAIN = "pzq"


class Gate:
    """The allowed client keys as ZAP User-Ids (z85 text, what pyzmq's authenticator reports), read by
    the loop for every message received on a CURVE socket. Replaced whole on reload."""

    def __init__(self, keys: Iterable[bytes]):
        self.allowed = frozenset(k.decode("ascii") for k in keys)

    def admits(self, user: str | None) -> bool:
        return user is not None and user in self.allowed


def _start(auth: ThreadAuthenticator, patience_s: float = 2.0) -> None:
    """Start the ZAP handler. Its inproc name is the context's: one that a server of this process closed
    a moment ago is let go by libzmq's reaper thread after the close returns (EADDRINUSE meanwhile, seen
    on a loaded machine when a test's second server starts right after the first stopped); wait for it."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            auth.start()
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            if auth.zap_socket is not None:  # (made, then refused its name: closed before the next try)
                auth.zap_socket.close(linger=0)
                auth.zap_socket = None  # type: ignore[assignment]  # (pyzmq starts from None)
            time.sleep(0.01)


class CurveServer:
    """The server side: socket options for every tcp:// endpoint, and the authenticator."""

    def __init__(self, ctx: zmq.Context, secret_key_file: str, clients_dir: str):
        self.public, self.secret = load_pair(secret_key_file, "--curve-secret-key")
        if not os.path.isdir(clients_dir):
            raise ConfigError(f"--curve-clients {clients_dir}: not a directory of client public keys")
        self.clients_dir = clients_dir
        self.names: dict[str, str] = {}  # allowed key (z85) -> its file's name without .key (for the logs)
        # Keys allowed in memory, by name, kept across reloads: the web console's, made afresh for each
        # of its processes (pzq/server/console_child.py), never written to the clients directory.
        self.in_memory: dict[str, bytes] = {}
        certs = self._load()  # at start-up, an unreadable directory or key is a configuration error
        self.auth = ThreadAuthenticator(ctx, log=logging.getLogger("pzq.curve.zap"))
        _start(self.auth)
        self.auth.allow_any = False
        self.auth.certs[DOMAIN] = certs
        # Every handshake asks ``admits`` (in the ZAP thread): the allow-list, and for the restricted
        # domains the permissions, whose refusals are counted there.
        self.auth.configure_curve_callback(DOMAIN, self)
        self.gate = Gate(certs)
        # Sockets whose clients must pass more than the allow-list (the native ones: permissions, checked
        # at the handshake): role -> ZAP domain; domain -> (its gate, which allowed keys it admits).
        self.role_domains: dict[str, str] = {}
        self.domains: dict[str, tuple[Gate, Callable[[str, bool], bool]]] = {}
        self._lost: dict[str, set[str]] = {}
        log.info("CURVE: %d allowed client key(s) in %s", len(certs), self.clients_dir)

    def _load(self) -> dict:
        """Every readable ``*.key`` of the clients directory; unreadable ones are logged and left out,
        so that removing a key always revokes it, whatever else is in the directory."""
        try:
            names = sorted(f for f in os.listdir(self.clients_dir) if f.endswith(".key"))
        except OSError as exc:
            raise ConfigError(f"--curve-clients {self.clients_dir}: cannot list the client keys: {exc}") from None
        certs, named = {}, {}
        for name in names:
            try:
                key = zmq.auth.load_certificate(os.path.join(self.clients_dir, name))[0]
            except (OSError, ValueError) as exc:
                log.error("CURVE: %s is not a readable public key, ignored: %s", name, exc)
                continue
            certs[key] = True
            named[key.decode("ascii")] = name.removesuffix(".key")
        for name, key in self.in_memory.items():
            certs[key] = True
            named[key.decode("ascii")] = name
        self.names = named
        return certs

    def allow(self, name: str, public: bytes | None) -> None:
        """Allow ``public`` (z85) in memory as the client ``name``, in place of the key that name had;
        ``None`` takes the name's key away. Kept across reloads of the clients directory."""
        old = self.in_memory.pop(name, None)
        if public is not None:
            self.in_memory[name] = public
        certs = dict(self.auth.certs.get(DOMAIN, {}))
        if old is not None:  # (a fresh random key: no file of the directory holds it too)
            certs.pop(old, None)
            self.names.pop(old.decode("ascii"), None)
        if public is not None:
            certs[public] = True
            self.names[public.decode("ascii")] = name
        self.auth.certs[DOMAIN] = certs  # one assignment: the ZAP thread sees the old set or the new one
        self.gate.allowed = Gate(certs).allowed
        self.refresh()

    def restrict(self, roles: Iterable[str], domain: str, admits: Callable[[str, bool], bool]) -> None:
        """Let onto the sockets of ``roles`` (bound after this call) only the allowed keys (z85) that
        ``admits(key, count)`` (``count``: a refusal is to be counted, it is a handshake): they get a ZAP
        domain of their own, so that a key without the right fails its handshake, and a gate of their
        own, so that a key that lost it is cut off message by message."""
        for role in roles:
            self.role_domains[role] = domain
        self.domains[domain] = (Gate(()), admits)
        self.auth.configure_curve_callback(domain, self)
        self.refresh()

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider call, for every CURVE handshake (in the ZAP thread)."""
        text = key.decode("ascii")
        if text not in self.gate.allowed:
            return False
        restricted = self.domains.get(domain)
        return restricted is None or text in restricted[0].allowed or restricted[1](text, True)

    def refresh(self) -> None:
        """Re-decide each restricted domain's keys (after a reload of the keys or of what ``admits``
        reads); the keys no longer let onto each role's sockets wait in ``take_lost``."""
        lost = self._lost
        for domain, (gate, admits) in self.domains.items():
            # (only gates: every domain's handshake asks ``callback``, which reads them, not the certs)
            old, gate.allowed = gate.allowed, frozenset(key for key in self.gate.allowed if admits(key, False))
            if old - gate.allowed:
                for role, its in self.role_domains.items():
                    if its == domain:
                        lost.setdefault(role, set()).update(old - gate.allowed)

    def take_lost(self) -> dict[str, set[str]]:
        """Per role, the keys (z85) that ``refresh`` took off its sockets since the last call."""
        lost, self._lost = self._lost, {}
        return lost

    def gate_of(self, role: str) -> Gate:
        """The gate of the sockets of ``role``."""
        domain = self.role_domains.get(role)
        return self.gate if domain is None else self.domains[domain][0]

    def reload(self) -> set[str]:
        """Re-read the allowed client keys (SIGHUP); returns the keys (z85) no longer allowed. If the
        directory cannot be read at all, the keys allowed so far stay allowed and the error is logged."""
        try:
            certs = self._load()
        except ConfigError as exc:
            log.error("SIGHUP: CURVE client keys not reloaded, the previous ones still apply: %s", exc)
            return set()
        self.auth.certs[DOMAIN] = certs  # one assignment: the ZAP thread sees the old set or the new one
        old, self.gate.allowed = self.gate.allowed, Gate(certs).allowed
        self.refresh()  # (a revoked key leaves every domain at once; revoked() cuts its connections)
        revoked = set(old - self.gate.allowed)
        log.info(  # (INFO, as every SIGHUP line that took: the default level shows it, and it is no warning)
            "SIGHUP: CURVE client keys re-read: %d allowed in %s%s",
            len(certs) - len(self.in_memory),  # (the console's own key is kept, not counted)
            self.clients_dir,
            f"; {len(revoked)} revoked, their open connections are cut off" if revoked else "",
        )
        return revoked

    def options(self, role: str = "") -> dict[str, object]:
        """What a server socket of ``role`` needs, set before it binds."""
        return {
            "CURVE_SERVER": 1,
            "CURVE_SECRETKEY": self.secret,
            "CURVE_PUBLICKEY": self.public,
            "ZAP_DOMAIN": self.role_domains.get(role, DOMAIN).encode(),
        }

    def close(self) -> None:
        self.auth.stop()
