"""Who may change things through the web console: the operator's secret, sessions, CSRF tokens.

Without ``--http-auth-file`` the console is read-only for everyone. With it, a person who types the
file's secret gets a session: a random cookie (HttpOnly, SameSite=Strict, never in a URL) and a CSRF
token that every form of a change carries back. Secrets are compared in constant time (as SHA-256
digests, so their lengths leak nothing either) and failed logins are throttled per address (an IPv6
/64 counts as one) and in all. The limit in all does not apply to an address that has logged in
before: a flood of wrong guesses from elsewhere must not lock the operator out.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import stat
import threading
import time

from pzq.errors import ConfigError

log = logging.getLogger("pzq.console")

SESSION_S = 8 * 3600  # a session ends this long after its login
MAX_SESSIONS = 64  # more logins end the oldest session
FAILURES_PER_ADDRESS = 5  # failed logins an address may make in FAILURE_WINDOW_S, then it waits
FAILURES_IN_ALL = 30  # failed logins from everyone in FAILURE_WINDOW_S, then every login waits
FAILURE_WINDOW_S = 60.0
MAX_SECRET = 4096


@dataclasses.dataclass
class Session:
    csrf: str
    ends: float
    notice: str = ""  # what the last change did, shown once on the next page


def read_secret(path: str) -> bytes:
    """The secret in the operator's file: its first line, without surrounding blanks. ConfigError if
    it cannot be read or is empty; a warning if others than its owner may read it."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            secret = f.read(MAX_SECRET + 1)
    except OSError as exc:
        raise ConfigError(f"--http-auth-file {path}: cannot read it: {exc.strerror}") from None
    secret = (secret.splitlines() or [b""])[0].strip()
    if len(secret) < 12 or len(secret) > MAX_SECRET:
        raise ConfigError(f"--http-auth-file {path}: its first line must hold a secret of 12 to {MAX_SECRET} bytes")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("--http-auth-file %s: group or others may read it (chmod 600 it)", path)
    return secret


class Logins:
    """Checks secrets, holds the sessions (of the console process; its lock makes it safe from any thread)."""

    def __init__(self, secret: bytes | None, clock=time.monotonic):
        self._digest = None if secret is None else hashlib.sha256(secret).digest()
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self._failures: collections.deque[tuple[float, str]] = collections.deque(maxlen=4 * FAILURES_IN_ALL)
        self._trusted: collections.OrderedDict[str, None] = collections.OrderedDict()  # logged in before

    def replace_secret(self, secret: bytes) -> bool:
        """A new secret (the operator's file re-read on SIGHUP): if it changed, every session ends, as
        a rotated secret means someone who knew the old one must be shut out. True if it changed."""
        digest = hashlib.sha256(secret).digest()
        with self._lock:
            if self._digest is None or hmac.compare_digest(digest, self._digest):
                return False
            self._digest = digest
            self._sessions.clear()
        return True

    def trusted(self, address: str) -> bool:
        """True if ``address`` (its /64 for IPv6) has logged in since the server started."""
        with self._lock:
            return source_of(address) in self._trusted

    @property
    def enabled(self) -> bool:
        return self._digest is not None

    def throttled(self, address: str) -> bool:
        """True if ``address`` (or everyone) failed too often lately: the login is refused unchecked."""
        with self._lock:
            return self._throttled(source_of(address))

    def _throttled(self, source: str) -> bool:
        self._forget_failures()
        mine = sum(1 for _, who in self._failures if who == source)
        everyone = len(self._failures) >= FAILURES_IN_ALL and source not in self._trusted
        return mine >= FAILURES_PER_ADDRESS or everyone

    def log_in(self, given: bytes, address: str) -> str | None:
        """A new session's key if ``given`` is the secret; None if not, or if ``address`` is throttled
        (then ``given`` is not even looked at). Every attempt counts as a failure until it succeeds, so
        parallel guesses cannot slip past the throttle."""
        source = source_of(address)
        with self._lock:
            if self._digest is None or self._throttled(source):
                return None
            attempt = (self._clock(), source)
            self._failures.append(attempt)
            digest = self._digest
        if not hmac.compare_digest(hashlib.sha256(given).digest(), digest):
            log.warning("console: failed login from %s", address)
            return None
        key = secrets.token_urlsafe(32)
        with self._lock:
            try:
                self._failures.remove(attempt)
            except ValueError:  # (pushed out by newer failures)
                pass
            self._trusted[source] = None
            while len(self._trusted) > MAX_SESSIONS:
                self._trusted.popitem(last=False)
            self._sessions[key] = Session(secrets.token_urlsafe(32), self._clock() + SESSION_S)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        log.info("console: login from %s", address)  # (a failed one is the warning)
        return key

    def session(self, key: str | None) -> Session | None:
        """The live session a cookie names, if any."""
        if not key:
            return None
        with self._lock:
            found = self._sessions.get(key)
            if found is not None and found.ends <= self._clock():
                del self._sessions[key]
                found = None
            return found

    def log_out(self, key: str) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    @staticmethod
    def csrf_ok(session: Session, given: str) -> bool:
        return hmac.compare_digest(session.csrf.encode(), given.encode())

    def _forget_failures(self) -> None:  # (with the lock held)
        cutoff = self._clock() - FAILURE_WINDOW_S
        while self._failures and self._failures[0][0] < cutoff:
            self._failures.popleft()


def source_of(address: str) -> str:
    """Whom a failed login (or a connection's rate) counts against: the address, or its /64 for IPv6
    (one host may hold a whole /64 and use each of its addresses)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
