"""The rules between settings that Config.validate checks: endpoints well formed and apart, CURVE without
a side door, names that exist. Each takes the Config (duck-typed: config imports this module, not the
reverse) and raises ConfigError naming the option; ranges of single settings are config's own. The base
port's layout (``BASE_OFFSETS``, ``at_base``) is here too, applied by config.load as the settings are read."""

from __future__ import annotations

import ipaddress
import os
import re
import zoneinfo
from typing import Any

from pzq import shards
from pzq.errors import ConfigError

DIALECTS, FORMATS = ("auto", "legacy", "current"), ("text", "json")
# Endpoint roles, as --unauthenticated names them: each is its --ROLE-dsn option, but for the web
# console's, --http-dsn.
ROLES = (
    "receive",
    "send",
    "consume",
    "monitor",
    "phpmq",
    "emqp-frontend",
    "emqp-backend",
    "emqp-publish",
    "mqks",
    "api",
    "console",
)
_ZMQ = r"^(tcp|ipc|inproc)://.+"
# base_port's layout (docs/configuration.md has the table): each endpoint at the base plus its offset, on
# loopback. The first three keep the defaults' order (11131, 11132, 11133), so that consume_dsn's 'auto'
# (send's port + 2) lands on base + 3 as 11134 does; metrics and the console move only when set to 'auto'
# (off by default, they are never turned on by a base port).
BASE_OFFSETS = {
    "receive_dsn": 0,
    "send_dsn": 1,
    "api_dsn": 2,
    "phpmq_dsn": 4,
    "mqks_dsn": 5,
    "emqp_backend_dsn": 6,
    "emqp_frontend_dsn": 7,
    "emqp_publish_dsn": 8,
    "metrics_dsn": 9,
    "http_dsn": 10,
}
_HTTP_AT_BASE = ("metrics_dsn", "http_dsn")
MAX_BASE_PORT = 65535 - max(BASE_OFFSETS.values())


def flag(name: str) -> str:
    """The option of setting ``name``: 'ack_timeout' -> '--ack-timeout'."""
    return "--" + name.replace("_", "-")


def check_endpoints(cfg: Any) -> None:
    """Every endpoint in its form; the batched consumers' endpoint apart from the others."""
    for name in ("receive_dsn", "send_dsn", "monitor_dsn"):
        value = getattr(cfg, name)
        if not re.match(_ZMQ, value):
            raise ConfigError(f"{flag(name)}: {value!r} is not a tcp://, ipc:// or inproc:// endpoint")
    for name in ("phpmq_dsn", "mqks_dsn"):
        if getattr(cfg, name) and not re.match(r"^tcp://.+:\d+$", getattr(cfg, name)):
            raise ConfigError(f"{flag(name)}: {getattr(cfg, name)!r} is not tcp://HOST:PORT (or empty to disable)")
    if cfg.consume_dsn == "auto":
        raise ConfigError(f"--consume-dsn: 'auto' finds no endpoint beside --send-dsn {cfg.send_dsn!r}: name one")
    if cfg.consume_dsn:
        for name in ("receive_dsn", "send_dsn", "monitor_dsn", "api_dsn", "emqp_frontend_dsn", "emqp_backend_dsn"):
            if getattr(cfg, name) == cfg.consume_dsn:
                raise ConfigError(f"--consume-dsn {cfg.consume_dsn} is {flag(name)} too: give it another")
    for name in ("emqp_frontend_dsn", "emqp_backend_dsn", "emqp_publish_dsn", "api_dsn", "consume_dsn"):
        value = getattr(cfg, name)
        if value and not re.match(_ZMQ, value):
            raise ConfigError(
                f"{flag(name)}: {value!r} is not a tcp://, ipc:// or inproc:// endpoint (or empty to disable)"
            )
    if bool(cfg.emqp_frontend_dsn) != bool(cfg.emqp_backend_dsn):
        raise ConfigError("--emqp-frontend-dsn and --emqp-backend-dsn: give both or neither")
    if cfg.metrics_dsn:
        parse_endpoint(cfg.metrics_dsn)
    if cfg.http_dsn:
        parse_endpoint(cfg.http_dsn, "--http-dsn")
    if cfg.http_dsn and cfg.monitor_dsn.startswith("inproc://"):  # (the console is a process of its own)
        raise ConfigError(f"--http-dsn: the console's process cannot reach --monitor-dsn {cfg.monitor_dsn}")
    if cfg.http_auth_file and not cfg.http_dsn:
        raise ConfigError("--http-auth-file: it is the web console's login, and --http-dsn is not set")
    check_ports(cfg)


_PORTED = (*BASE_OFFSETS, "consume_dsn", "monitor_dsn")
_ANY_HOST = ("*", "0.0.0.0", "::", "")


def check_ports(cfg: Any) -> None:
    """No two endpoints on one TCP port of one host (a wildcard host takes the port on every one). A base
    port with one endpoint named at a port it gives another had failed at the bind with "Address already
    in use", naming only one of the two, as if another program held the port."""
    seen: dict[tuple[str, int], str] = {}
    for name in _PORTED:
        match = re.fullmatch(r"(?:tcp|http)://(\[[0-9a-fA-F:]*\]|[^:/]*):(\d{1,5})/?", getattr(cfg, name) or "")
        if not match or not int(match.group(2)):
            continue  # (ipc://, inproc://, a port chosen by the system, or off)
        host, port = match.group(1).strip("[]"), int(match.group(2))
        for (other_host, other_port), other in seen.items():
            if port == other_port and (host == other_host or host in _ANY_HOST or other_host in _ANY_HOST):
                base = f" (--base-port {cfg.base_port} put one there)" if cfg.base_port else ""
                raise ConfigError(
                    f"{flag(name)} {getattr(cfg, name)}: port {port} is {flag(other)}'s too{base}: "
                    "give one another port"
                )
        seen[(host, port)] = name


def check_names(cfg: Any) -> None:
    """Choices, queue names, the time zone, address lists and log settings that exist."""
    if cfg.phpmq_dialect not in DIALECTS:
        raise ConfigError(f"--phpmq-dialect: {cfg.phpmq_dialect!r} is not auto, legacy or current")
    if not [q for q in cfg.emqp_default_queues.split(",") if q.strip()]:
        raise ConfigError("--emqp-default-queues: name at least one queue")
    try:
        zoneinfo.ZoneInfo(cfg.emqp_cron_timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"--emqp-cron-timezone: {cfg.emqp_cron_timezone!r} is not a time zone name (e.g. UTC or Europe/Berlin)"
        ) from None
    if not cfg.database:
        raise ConfigError("--database: must name a directory")
    if not cfg.queue or len(cfg.queue.encode()) > 255:
        raise ConfigError("--queue: must be 1 to 255 bytes")
    for part in (p.strip() for p in cfg.allow_ips.split(",") if p.strip()):
        try:
            ipaddress.ip_network(part, strict=False)
        except ValueError:
            raise ConfigError(f"--allow-ips: {part!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
    if cfg.log_format not in FORMATS:
        raise ConfigError(f"--log-format: {cfg.log_format!r} is not text or json")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level: {cfg.log_level!r} is not one of debug, info, warning, error")


def check_shard(cfg: Any) -> None:
    """A shard name well formed; a shard list that reads, naming this shard when it has a name (a server
    started with --cluster and no --shard takes the name its store keeps: checked at start, in
    pzq/server/wiring.py, where the store is open)."""
    if cfg.shard:
        shards.check_name(cfg.shard, "--shard")
    if cfg.cluster:
        try:
            listed = shards.load(cfg.cluster)
        except ConfigError as exc:
            raise ConfigError(f"--cluster: {exc}") from None
        if cfg.shard and cfg.shard not in listed.names():
            raise ConfigError(
                f"--shard {cfg.shard}: not in the shard list {cfg.cluster} (it names {', '.join(listed.names())})"
            )
    for flag in ("ca", "cert", "key"):  # (given without --etcd too: a setting that names no file is a mistake)
        path = getattr(cfg, f"etcd_{flag}")
        if path and not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise ConfigError(f"--etcd-{flag} {path}: not a readable file")
    if cfg.etcd:
        from pzq.etcd_gateway import parse_urls

        parse_urls(cfg.etcd)
        if cfg.cluster:
            raise ConfigError("--etcd and --cluster: give one (etcd keeps the shards a list would name)")
        if bool(cfg.etcd_cert) != bool(cfg.etcd_key):
            raise ConfigError("--etcd-cert and --etcd-key: give both or neither")
        tls = [flag for flag in ("ca", "cert") if getattr(cfg, f"etcd_{flag}")]
        if tls and any(not url.startswith("https://") for url, _ in parse_urls(cfg.etcd)):
            raise ConfigError(f"--etcd-{tls[0]}: give https:// etcd URLs (a certificate is for TLS)")

        if not cfg.etcd_prefix.startswith("/") or len(cfg.etcd_prefix.encode()) > 200:
            raise ConfigError(f"--etcd-prefix {cfg.etcd_prefix!r}: a key prefix starting with '/', 200 bytes at most")


def check_security(cfg: Any) -> None:
    """CURVE's two files together, and no endpoint that serves clients without a key unless named."""
    unknown = cfg.unauthenticated_roles - set(ROLES)
    if unknown:
        raise ConfigError(
            f"--unauthenticated: {', '.join(sorted(unknown))} is not an endpoint; name some of {', '.join(ROLES)}"
        )
    if bool(cfg.curve_secret_key) != bool(cfg.curve_clients):
        raise ConfigError("--curve-secret-key and --curve-clients: give both or neither")
    for role in ("phpmq", "mqks"):  # no side door: their protocols have no authentication
        dsn = getattr(cfg, f"{role}_dsn")
        if cfg.curve_secret_key and dsn and role not in cfg.unauthenticated_roles:
            raise ConfigError(
                f"--{role}-dsn {dsn}: {role.upper()} clients cannot authenticate, and CURVE is "
                f"configured: disable it (--{role}-dsn '') or accept it knowingly with "
                f"--unauthenticated {role}"
            )
    if cfg.curve_secret_key and cfg.http_dsn and "console" not in cfg.unauthenticated_roles:
        # (the console's own link to pzq has a CURVE key; the browsers reading it over HTTP have none)
        raise ConfigError(
            f"--http-dsn {cfg.http_dsn}: the web console shows message bodies without a CURVE key to any "
            "browser that reaches its port, and CURVE is configured: disable it (--http-dsn '') or accept it "
            "knowingly with --unauthenticated console"
        )


def at_base(values: dict[str, Any]) -> dict[str, str]:
    """The endpoints ``base_port`` moves, from the settings every source gave (``values``): each tcp one
    none of them named goes to base + its offset (one named wins, even at its default value), and
    metrics_dsn or http_dsn given as 'auto' go there too. Nothing without a base port, but 'auto' refused."""
    base = values.get("base_port", 0)
    if not 0 <= base <= MAX_BASE_PORT:
        raise ConfigError(f"--base-port: {base} is not 0 (off) to {MAX_BASE_PORT} (the last offset is +10)")
    moved = {}
    for name, offset in BASE_OFFSETS.items():
        if name in _HTTP_AT_BASE:
            if values.get(name) == "auto":
                if not base:
                    raise ConfigError(
                        f"{flag(name)}: 'auto' is --base-port + {offset}: set --base-port too, or give http://HOST:PORT"
                    )
                moved[name] = f"http://127.0.0.1:{base + offset}"
        elif base and name not in values:
            moved[name] = f"tcp://127.0.0.1:{base + offset}"
    return moved


def beside_send(send_dsn: str) -> str:
    """The batched consumers' endpoint that 'auto' means for ``send_dsn`` ('' when none can be made: the
    setting must then be given): tcp://HOST:PORT -> PORT + 2, ipc://DIR/NAME -> ipc://DIR/consume,
    inproc://NAME -> inproc://NAME-consume."""
    scheme, sep, rest = send_dsn.partition("://")
    if not sep:
        return ""
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not port.isdigit() or int(port) + 2 > 65535:
            return ""
        return f"tcp://{host}:{int(port) + 2}"
    if scheme == "ipc":
        folder, slash, name = rest.rpartition("/")
        return f"ipc://{folder}{slash}{'consume' if name != 'consume' else 'consume-batched'}"
    if scheme == "inproc":
        return f"inproc://{rest}-consume"
    return ""


def parse_endpoint(dsn: str, option: str = "--metrics-dsn") -> tuple[str, int]:
    """'http://HOST:PORT' -> (host, port), or ConfigError naming ``option``."""
    match = re.fullmatch(r"http://([^:/]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?", dsn)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(f"{option}: {dsn!r} is not http://HOST:PORT (or empty to disable)")
    return match.group(1).strip("[]"), int(match.group(2))
