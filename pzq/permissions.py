"""Who may produce to, consume from and manage which queue: the permissions file (TOML, read at start-up
and on SIGHUP) and the one object every gateway asks (``Permissions``).

A right is a list of queue-name patterns; ``*`` matches any run of characters (dots included), and no
other character is special. The file names a section per CURVE client key (its file's name in the
clients directory, without ``.key``; the web console's own key is ``console``), a section per source
network for the raw-TCP gateways (PHPMQ, MQKS: their protocols carry no identity), and ``[default]``
for everyone else: keys not listed, ZeroMQ clients without a key, addresses of no listed network::

    [default]                 # absent: nothing is allowed to whoever is not named
    consume = ["public.*"]

    [keys.orders-app]
    produce = ["orders.*"]
    consume = ["orders.*"]
    manage  = ["orders.*"]    # purge, delete and requeue dead letters, schedule

    [networks."10.1.0.0/16"]  # the most specific network holding the peer's address decides
    produce = ["legacy"]

Without a file every client may do anything to every queue (what pzq did before permissions), and the
start-up log says so. A file that cannot be read or is wrong keeps the server from starting; on SIGHUP
it keeps the rules in force (a typo never widens anyone's rights), and a file removed on a running
server does not turn permissions off either: that takes a restart.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping

from pzq.errors import ConfigError
from pzq.logs import warn_bad
from pzq.toml_file import read_toml

__all__ = [
    "CONSUME",
    "MANAGE",
    "PHRASES",
    "PRODUCE",
    "RIGHTS",
    "Permissions",
    "Rights",
    "Rules",
    "default_path",
    "shown",
]

log = logging.getLogger("pzq.permissions")

PRODUCE, CONSUME, MANAGE = "produce", "consume", "manage"
RIGHTS = (PRODUCE, CONSUME, MANAGE)
# How a refusal's text names each right: "this client may not produce to 'payroll'".
PHRASES = {PRODUCE: "produce to", CONSUME: "consume from", MANAGE: "manage"}
FILE_NAME = "permissions.toml"
ANONYMOUS = "anonymous"  # the refusal counters' name for a ZeroMQ client without a key
MAX_PATTERN_BYTES = 255  # a queue name's limit: a longer pattern could never match one


def default_path(curve_clients: str) -> str:
    """Where the file is looked for when ``--permissions`` names none: beside the CURVE clients
    directory (``/etc/pzq/clients`` -> ``/etc/pzq/permissions.toml``); '' without CURVE."""
    if not curve_clients:
        return ""
    return os.path.join(os.path.dirname(os.path.abspath(curve_clients)), FILE_NAME)


def _text(queue: str | bytes) -> str:
    return queue if isinstance(queue, str) else queue.decode("utf-8", "surrogateescape")


def shown(queue: str | bytes, most: int = 100) -> str:
    """``queue`` for a log line or a refusal's reply: a name the client chose may be a megabyte (an
    eMQP REQUEST's queue is not limited before it is checked), and a refusal must not repeat it whole."""
    text = _text(queue)
    return repr(text) if len(text) <= most else f"{text[:most]!r}... ({len(text)} characters)"


class Rights:
    """One section of the file: for each right, the patterns of the queues it covers."""

    def __init__(self, patterns: Mapping[str, Iterable[str]]):
        self.patterns = {right: tuple(patterns.get(right, ())) for right in RIGHTS}
        # Made at a right's first check (see _compile): most keys of a big file are not connected.
        self._match: dict[str, Callable[[str], bool] | None] = {}

    def may(self, right: str, queue: str | bytes) -> bool:
        """Whether ``queue`` matches one of the patterns of ``right``."""
        try:
            match = self._match[right]
        except KeyError:
            match = self._match[right] = _compile(self.patterns[right])
        return match is not None and match(_text(queue))

    def covers(self, right: str) -> bool:
        """Whether ``right`` names any pattern at all."""
        return bool(self.patterns[right])


def _compile(patterns: tuple[str, ...]) -> Callable[[str], bool] | None:
    if not patterns:
        return None
    # Names and "prefix*" (most patterns) are a set and a tuple: compiling a regular expression costs
    # about 50 us, a file of 10,000 keys half a second of the loop at each SIGHUP.
    exact = frozenset(p for p in patterns if "*" not in p)
    prefixes = tuple(p[:-1] for p in patterns if p.find("*") == len(p) - 1)
    others = [p for p in patterns if "*" in p[:-1]]
    regex = re.compile("|".join(f"(?:{_glob(p)})" for p in others), re.DOTALL).fullmatch if others else None

    def match(name: str) -> bool:
        return name in exact or name.startswith(prefixes) or (regex is not None and regex(name) is not None)

    return match


def _glob(pattern: str) -> str:
    """``pattern`` as a regular expression that runs in linear time on any name. A plain ``.*`` per star
    backtracks: "*.*.eu" on 60,000 dots took 10 s of the loop, for a name a client chose. Each piece
    between two stars is matched at its first occurrence and never tried again (an atomic group): for a
    glob of stars alone, the earliest occurrence of each piece is the one that can match if any can."""
    if "*" not in pattern:
        return re.escape(pattern)
    first, *middle, last = (re.escape(piece) for piece in pattern.split("*"))
    return first + "".join(f"(?>.*?{piece})" for piece in middle if piece) + ".*" + last


NOTHING = Rights({})


class Rules:
    """A permissions file, read and checked whole."""

    def __init__(self, path: str, default: Rights, keys: dict[str, Rights], networks: list[tuple]):
        self.path = path
        self.default = default
        self.keys = keys
        # (network, its label, its rights), the most specific first: the first that holds a peer decides
        self.networks = sorted(networks, key=lambda n: -n[0].prefixlen)
        # The same, as one table per IP version and prefix length (most specific first), keyed by the
        # network's bits: a lookup costs one dict probe per prefix length in use, not one test per
        # network (a file of 5,000 networks made each refused request of a raw-TCP peer cost 1.5 ms).
        tables: dict[tuple[int, int], dict[int, tuple[str, Rights]]] = {}
        for network, label, rights in self.networks:
            shift = network.max_prefixlen - network.prefixlen
            table = tables.setdefault((network.version, shift), {})
            # (the first of two spellings of one network wins, as in the list)
            table.setdefault(int(network.network_address) >> shift, (label, rights))
        self._by_prefix = [(version, shift, table) for (version, shift), table in tables.items()]

    @classmethod
    def read(cls, path: str) -> Rules:
        """The rules of the file at ``path``; ConfigError saying what is wrong and where."""
        data = read_toml(path, "permissions file")
        unknown = set(data) - {"default", "keys", "networks"}
        if unknown:
            raise ConfigError(
                f"permissions file {path}: unknown section {sorted(unknown)[0]!r}; use [default], [keys.NAME] "
                'or [networks."CIDR"]'
            )
        default = _section(path, "default", data.get("default", {})) if "default" in data else NOTHING
        keys = {name: _section(path, f"keys.{name}", section) for name, section in _table(path, "keys", data).items()}
        networks = []
        for cidr, section in _table(path, "networks", data).items():
            try:
                network = ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(
                    f"permissions file {path}: [networks.{cidr!r}] is not an IP address or network (e.g. 10.0.0.0/8)"
                ) from None
            mapped = getattr(network.network_address, "ipv4_mapped", None)
            if mapped is not None and network.prefixlen >= 96:  # (peers are looked up as IPv4: see _ip)
                network = ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
            networks.append((network, f"network {network}", _section(path, f"networks.{cidr}", section)))
        return cls(path, default, keys, networks)

    def for_key(self, name: str | None) -> Rights:
        """The rights of the client key named ``name`` (None: a client without a key)."""
        return self.keys.get(name, self.default) if name is not None else self.default

    def for_address(self, address: str | None) -> tuple[str, Rights]:
        """The label and rights of a raw-TCP peer at ``address`` (an IP, with or without a port)."""
        ip = _ip(address)
        if ip is not None:
            bits = int(ip)
            for version, shift, table in self._by_prefix:
                if version == ip.version and (found := table.get(bits >> shift)) is not None:
                    return found
        return "default", self.default


def _table(path: str, name: str, data: dict) -> dict:
    table = data.get(name, {})
    if not isinstance(table, dict) or any(not isinstance(v, dict) for v in table.values()):
        raise ConfigError(f"permissions file {path}: [{name}] must hold tables such as [{name}.NAME]")
    return table


def _section(path: str, where: str, section: object) -> Rights:
    if not isinstance(section, dict):
        raise ConfigError(f"permissions file {path}: [{where}] must be a table of produce, consume and manage")
    unknown = set(section) - set(RIGHTS)
    if unknown:
        raise ConfigError(
            f"permissions file {path}: [{where}] {sorted(unknown)[0]!r} is not a right; use produce, consume or manage"
        )
    for right, patterns in section.items():
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
            raise ConfigError(f"permissions file {path}: [{where}] {right} must be a list of queue-name patterns")
        for pattern in patterns:
            if len(pattern.encode()) > MAX_PATTERN_BYTES:
                raise ConfigError(f"permissions file {path}: [{where}] {right}: a pattern over 255 bytes")
    return Rights(section)


def _ip(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not address:
        return None
    text = address
    if text.startswith("["):  # [v6]:port
        text = text[1 : text.find("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)  # (a v4 peer on a dual-stack listener)
    return mapped if mapped is not None else ip


class Permissions:
    """The rules in force, asked by every gateway (this object stays; its rules are replaced whole on
    reload), and the refusals counted per client and right.

    ``names`` turns a CURVE key (z85, what the gateways see) into its name; a key it does not know is
    not listed in the file, so ``[default]`` applies to it."""

    def __init__(
        self,
        path: str,
        names: Callable[[str], str | None] = lambda key: None,
        *,
        required: bool = False,
        check: Callable[[Rules], None] = lambda rules: None,
    ):
        self.path = path
        self.names = names
        self.check = check  # raises ConfigError for rules this server cannot enforce
        self.rules: Rules | None = None
        self.refused: collections.Counter[tuple[str, str]] = collections.Counter()  # (who, right) -> count
        self._lock = threading.Lock()
        if path and (required or os.path.exists(path)):
            self.rules = Rules.read(path)
            check(self.rules)

    @property
    def enabled(self) -> bool:
        return self.rules is not None

    def describe(self) -> str:
        """The start-up line."""
        if self.rules is None:
            where = f" ({self.path} does not exist)" if self.path else ""
            return f"permissions: no file{where}: every client may produce to, consume from and manage every queue"
        return (
            f"permissions: {self.path}: {len(self.rules.keys)} key(s), {len(self.rules.networks)} network(s), "
            f"default {_summary(self.rules.default)}"
        )

    def key_name(self, key: str | None) -> str | None:
        """The name of a CURVE key (z85), or None for a client without a key."""
        if key is None:
            return None
        return self.names(key) or f"CURVE key {key[:8]}..."

    # The checks. Each returns whether the request may go on; a refusal is counted and logged here,
    # and the caller answers it with its protocol's error.

    def allows_key(self, key: str | None, right: str, queue: str | bytes) -> bool:
        """Whether the client of CURVE key ``key`` has ``right`` on ``queue`` (nothing counted)."""
        return self.rules is None or self.rules.for_key(self.key_name(key)).may(right, queue)

    def key_may(self, key: str | None, right: str, queue: str | bytes, protocol: str, what: str) -> bool:
        """``allows_key``, with a refusal counted and logged (``what``: the request, e.g. 'PURGE')."""
        if self.rules is None:
            return True
        name = self.key_name(key)
        if self.rules.for_key(name).may(right, queue):
            return True
        self._refuse(name or ANONYMOUS, right, queue, protocol, what)
        return False

    def peer_may(self, address: str | None, right: str, queue: str | bytes, protocol: str, what: str) -> bool:
        """Whether a raw-TCP peer at ``address`` (IP or IP:port) has ``right`` on ``queue``; a refusal is
        counted and logged."""
        if self.rules is None:
            return True
        label, rights = self.rules.for_address(address)
        if rights.may(right, queue):
            return True
        self._refuse(label, right, queue, protocol, what, f" from {address}")
        return False

    def _refuse(self, who: str, right: str, queue: str | bytes, protocol: str, what: str, where: str = "") -> None:
        with self._lock:  # (native handshakes are refused in the ZAP thread)
            self.refused[(who, right)] += 1
        warn_bad(protocol, "not-permitted", f"{what} on {shown(queue)} by {who}{where}: no {right} right")

    def reload(self) -> bool:
        """Re-read the file (SIGHUP); True when new rules took. What was in force stays when the file
        is missing or wrong, and the log says why."""
        if not self.path:
            return False
        if not os.path.exists(self.path) and self.rules is None:
            log.info("SIGHUP: permissions: still no file at %s: every client may do anything", self.path)
            return False
        try:
            rules = Rules.read(self.path)
            self.check(rules)
        except ConfigError as exc:
            kept = "the rules read before stay in force" if self.rules else "every client may still do anything"
            log.error("SIGHUP: permissions not reloaded, %s: %s", kept, exc)
            return False
        self.rules = rules
        log.info("SIGHUP: %s", self.describe())
        return True

    def stats(self) -> dict:
        """What MONITOR and the metrics show: the file, and the refusals per client and right."""
        refused: dict[str, dict[str, int]] = {}
        with self._lock:
            counts = sorted(self.refused.items())
        for (who, right), count in counts:
            refused.setdefault(who, {})[right] = count
        return {
            "file": self.path if self.rules is not None else "",
            "refused_total": sum(count for _, count in counts),
            "refused": refused,
        }


def _summary(rights: Rights) -> str:
    granted = [f"{right} {', '.join(rights.patterns[right])}" for right in RIGHTS if rights.covers(right)]
    return "; ".join(granted) if granted else "nothing"
