"""One frozen Config, layered from defaults, a TOML file, PZQ_* environment variables and flags.

Precedence is flag > environment > file > default. Every key of the file is the option's name with
dashes turned into underscores (``ack_timeout``); the environment variable is ``PZQ_`` + the key in
upper case (``PZQ_ACK_TIMEOUT``). ``conf/pzq.toml`` documents every key with its default, and a test
keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import tomllib
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pzq.errors import ConfigError

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits that are not settings of `pzq serve`: shares, chunks and caps the code keeps so that no
    client can make the loop work or hold memory without bound. One frozen object, reached through
    ``Config.limits``; tests pass small values (``Limits(max_runs=1)``) instead of patching modules.
    Each owner reads only its own fields. Durations are seconds."""

    # The loop and every endpoint
    read_batch: int = 4096  # messages read from one socket per turn
    turn_bytes: int = 8 << 20  # bytes read from one socket per turn
    # Replies waiting for one ZeroMQ peer (pzq/endpoints/replies.py)
    backlog_messages: int = 10_000
    backlog_bytes: int = 16 << 20
    reply_stale_s: float = 60.0  # a backlog its peer took nothing of for this long is dropped
    # Raw TCP connections (pzq/endpoints/stream.py)
    stream_backlog_bytes: int = 16 << 20  # unsent replies for a slow reader; past this it is closed
    # The broker
    late_memory: int = 50_000  # deliveries taken back early whose late answers are still recognised
    # Range leases (pzq/leases.py, the API and Spark)
    lease_call_budget_s: float = 0.010  # one lease or fetch call's work
    lease_chunk: int = 1_000  # messages taken between two looks at the clock
    fetch_chunk: int = 1_000
    max_lease: int = 1_000_000  # messages one lease call may take
    max_fetch: int = 10_000  # messages one fetch may return
    lease_work_per_turn: int = 5_000  # acknowledged (or expired) messages handled per turn
    max_runs_per_group: int = 10_000
    max_runs: int = 100_000
    max_groups: int = 100_000
    # The API gateway
    snapshot_max: int = 10_000
    max_dedup_keys: int = 1_000_000  # PRODUCE keys remembered at once
    api_reply_bytes: int = 4 << 20  # a FETCH or SNAPSHOT reply stops growing past this many body bytes
    api_turn_work_s: float = 0.02
    api_replies_unread: int = 8  # replies waiting in one client's pipe
    # The MQKS gateway
    mqks_turn_budget: int = 100  # deliveries per consumer per turn
    mqks_max_events: int = 10_000  # events bound to one queue
    mqks_max_masks: int = 100  # --remove-mask masks in one request
    mqks_max_consumers: int = 1000  # consumers on one connection
    mqks_max_all_consumers: int = 100_000
    mqks_max_bindings: int = 1_000_000  # (queue, event) bindings of every queue together
    mqks_max_unacked_per_conn: int = 10_000
    mqks_put_back_per_turn: int = 2_000
    # The eMQP gateway
    max_schedules: int = 10_000
    max_cron: int = 255  # characters of a cron expression
    emqp_remembered: int = 1024  # dropped workers whose queues are kept
    max_schedulers: int = 100
    # The web console
    console_connection_s: float = 15.0  # a connection's whole life
    console_connections_per_s: int = 100


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of `pzq serve`. Durations are microseconds, as in the original PZQ."""

    database: str = "./pzq-data"
    receive_dsn: str = "tcp://127.0.0.1:11131"
    send_dsn: str = "tcp://127.0.0.1:11132"
    monitor_dsn: str = ""  # "" = ipc://DATABASE/monitor: inside the owner-only store directory
    queue: str = "default"
    phpmq_dsn: str = "tcp://127.0.0.1:9100"
    phpmq_dialect: str = "auto"
    emqp_frontend_dsn: str = "tcp://127.0.0.1:47291"
    emqp_backend_dsn: str = "tcp://127.0.0.1:47290"
    emqp_publish_dsn: str = "tcp://127.0.0.1:47292"
    emqp_heartbeat_interval: float = 3.0
    emqp_heartbeat_liveness: int = 3
    emqp_default_queues: str = "default"
    emqp_cron_timezone: str = "UTC"
    mqks_dsn: str = "tcp://127.0.0.1:25000"
    api_dsn: str = "tcp://127.0.0.1:11133"
    lease_timeout: float = 3600.0
    api_dedup_window: float = 86400.0
    ack_timeout: int = 5_000_000
    reaper_frequency: int = 2_500_000
    hard_sync: bool = True
    commit_interval: int = 10_000
    max_inflight: int = 1000
    max_deliveries: int = 0
    max_store_size: int = 4 << 30
    max_queues: int = 10_000
    max_connections: int = 10_000
    max_partial_input: int = 256 << 20
    min_disk_free: int = 64 << 20
    disk_reserve: int = 8 << 20
    max_message_size: int = 16 << 20
    user: str = ""
    log_level: str = "info"
    log_format: str = "text"
    metrics_dsn: str = ""
    http_dsn: str = ""
    http_auth_file: str = ""
    http_host_names: str = ""
    allow_ips: str = ""
    curve_secret_key: str = ""
    curve_clients: str = ""
    unauthenticated: str = ""
    # Not a setting (no flag, key or variable): the code's own limits, replaced whole by tests.
    limits: Limits = dataclasses.field(default=DEFAULT_LIMITS, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.monitor_dsn:
            # Not /tmp: another local user could create the socket file there first. The store
            # directory is 0700, so only this user can make or reach a socket in it.
            object.__setattr__(self, "monitor_dsn", f"ipc://{self.database.rstrip('/') or '/'}/monitor")

    @property
    def unauthenticated_roles(self) -> frozenset[str]:
        """The endpoints named in ``unauthenticated`` (``receive``, ``phpmq``, ...)."""
        return frozenset(p.strip() for p in self.unauthenticated.split(",") if p.strip())

    def validate(self) -> Config:
        """Raise ConfigError naming the first setting that is out of range; return self otherwise."""
        for name in ("receive_dsn", "send_dsn", "monitor_dsn"):
            value = getattr(self, name)
            if not re.match(r"^(tcp|ipc|inproc)://.+", value):
                raise ConfigError(f"{_flag(name)}: {value!r} is not a tcp://, ipc:// or inproc:// endpoint")
        if self.phpmq_dsn and not re.match(r"^tcp://.+:\d+$", self.phpmq_dsn):
            raise ConfigError(f"--phpmq-dsn: {self.phpmq_dsn!r} is not tcp://HOST:PORT (or empty to disable)")
        if self.phpmq_dialect not in ("auto", "legacy", "current"):
            raise ConfigError(f"--phpmq-dialect: {self.phpmq_dialect!r} is not auto, legacy or current")
        for name in ("emqp_frontend_dsn", "emqp_backend_dsn", "emqp_publish_dsn"):
            value = getattr(self, name)
            if value and not re.match(r"^(tcp|ipc|inproc)://.+", value):
                raise ConfigError(
                    f"{_flag(name)}: {value!r} is not a tcp://, ipc:// or inproc:// endpoint (or empty to disable)"
                )
        if bool(self.emqp_frontend_dsn) != bool(self.emqp_backend_dsn):
            raise ConfigError("--emqp-frontend-dsn and --emqp-backend-dsn: give both or neither")
        if not 0.01 <= self.emqp_heartbeat_interval <= 3600:
            raise ConfigError(f"--emqp-heartbeat-interval: {self.emqp_heartbeat_interval} is not 0.01 to 3600 s")
        _at_least(self, "emqp_heartbeat_liveness", 1)
        if not [q for q in self.emqp_default_queues.split(",") if q.strip()]:
            raise ConfigError("--emqp-default-queues: name at least one queue")
        try:
            zoneinfo.ZoneInfo(self.emqp_cron_timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"--emqp-cron-timezone: {self.emqp_cron_timezone!r} is not a time zone name (e.g. UTC or Europe/Berlin)"
            ) from None
        if self.mqks_dsn and not re.match(r"^tcp://.+:\d+$", self.mqks_dsn):
            raise ConfigError(f"--mqks-dsn: {self.mqks_dsn!r} is not tcp://HOST:PORT (or empty to disable)")
        if self.api_dsn and not re.match(r"^(tcp|ipc|inproc)://.+", self.api_dsn):
            raise ConfigError(
                f"--api-dsn: {self.api_dsn!r} is not a tcp://, ipc:// or inproc:// endpoint (or empty to disable)"
            )
        if not 1 <= self.lease_timeout <= 30 * 86400:
            raise ConfigError(f"--lease-timeout: {self.lease_timeout} is not 1 to 2592000 s")
        if not 0 <= self.api_dedup_window <= 30 * 86400:
            raise ConfigError(f"--api-dedup-window: {self.api_dedup_window} is not 0 to 2592000 s")
        if not self.database:
            raise ConfigError("--database: must name a directory")
        if not self.queue or len(self.queue.encode()) > 255:
            raise ConfigError("--queue: must be 1 to 255 bytes")
        _at_least(self, "ack_timeout", 1000)
        _at_least(self, "reaper_frequency", 1000)
        _at_least(self, "commit_interval", 0)
        _at_least(self, "max_inflight", 1)
        _at_least(self, "max_deliveries", 0)
        _at_least(self, "max_store_size", 1 << 20)
        _at_least(self, "max_message_size", 1024)
        _at_least(self, "max_queues", 1)
        _at_least(self, "max_connections", 1)
        _at_least(self, "max_partial_input", 1 << 20)
        _at_least(self, "min_disk_free", 0)
        _at_least(self, "disk_reserve", 0)
        for part in (p.strip() for p in self.allow_ips.split(",") if p.strip()):
            try:
                ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise ConfigError(f"--allow-ips: {part!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
        unknown = self.unauthenticated_roles - set(ROLES)
        if unknown:
            raise ConfigError(
                f"--unauthenticated: {', '.join(sorted(unknown))} is not an endpoint; name some of {', '.join(ROLES)}"
            )
        if bool(self.curve_secret_key) != bool(self.curve_clients):
            raise ConfigError("--curve-secret-key and --curve-clients: give both or neither")
        for role in ("phpmq", "mqks"):  # no side door: their protocols have no authentication
            dsn = getattr(self, f"{role}_dsn")
            if self.curve_secret_key and dsn and role not in self.unauthenticated_roles:
                raise ConfigError(
                    f"--{role}-dsn {dsn}: {role.upper()} clients cannot authenticate, and CURVE is "
                    f"configured: disable it (--{role}-dsn '') or accept it knowingly with "
                    f"--unauthenticated {role}"
                )
        if self.metrics_dsn:
            parse_endpoint(self.metrics_dsn)
        if self.http_dsn:
            parse_endpoint(self.http_dsn, "--http-dsn")
        if self.http_auth_file and not self.http_dsn:
            raise ConfigError("--http-auth-file: it is the web console's login, and --http-dsn is not set")
        if self.log_format not in ("text", "json"):
            raise ConfigError(f"--log-format: {self.log_format!r} is not text or json")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"--log-level: {self.log_level!r} is not one of debug, info, warning, error")
        return self


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _at_least(config: Config, name: str, low: int) -> None:
    if getattr(config, name) < low:
        raise ConfigError(f"{_flag(name)}: must be at least {low}, got {getattr(config, name)}")


FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "limits"}
# Endpoint roles, as --unauthenticated names them: each is its --ROLE-dsn option.
ROLES = ("receive", "send", "monitor", "phpmq", "emqp-frontend", "emqp-backend", "emqp-publish", "mqks", "api")
SIZE_FIELDS = {"max_store_size", "max_message_size", "min_disk_free", "disk_reserve", "max_partial_input"}


def parse_endpoint(dsn: str, option: str = "--metrics-dsn") -> tuple[str, int]:
    """'http://HOST:PORT' -> (host, port), or ConfigError naming ``option``."""
    match = re.fullmatch(r"http://([^:/]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?", dsn)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(f"{option}: {dsn!r} is not http://HOST:PORT (or empty to disable)")
    return match.group(1).strip("[]"), int(match.group(2))


def parse_size(text: str) -> int:
    """'4G' -> 4294967296; plain digits are bytes. Raises ValueError."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 512M or 4G")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def _coerce(name: str, value: Any, source: str) -> Any:
    """Turn a value from a file, the environment or a flag into the field's type, or raise ConfigError."""
    kind = FIELDS[name].type
    try:
        if kind in (bool, "bool"):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{value!r} is not true or false")
        if kind in (float, "float"):
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is not a number")
            return float(value)
        if kind in (int, "int"):
            if isinstance(value, bool):
                raise ValueError(f"{value!r} is not a number")
            if isinstance(value, int):
                return value
            if name in SIZE_FIELDS:
                return parse_size(str(value))
            return int(str(value).strip())
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a string")
        return value
    except ValueError as exc:
        raise ConfigError(f"{source} {name}: {exc}") from None


def load(
    flags: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None, file: str | Path | None = None
) -> Config:
    """Build and validate a Config. ``flags`` holds only options the user gave (None means not given)."""
    values: dict[str, Any] = {}
    if file is not None:
        values.update(_read_file(Path(file)))
    for name in FIELDS:
        key = "PZQ_" + name.upper()
        if env is not None and env.get(key, "") != "":
            values[name] = _coerce(name, env[key], f"environment {key}:")
    for name, value in (flags or {}).items():
        if value is None:
            continue
        if name not in FIELDS:
            raise ConfigError(f"unknown option {_flag(name)}")
        values[name] = _coerce(name, value, f"option {_flag(name)}:")
    return Config(**values).validate()


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    values = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        values[name] = _coerce(name, value, f"config file {path}:")
    return values
