"""One frozen Config, layered from defaults, a TOML file, PZQ_* environment variables and flags.

Precedence is flag > environment > file > default. Every key of the file is the option's name with
dashes turned into underscores (``ack_timeout``); the environment variable is ``PZQ_`` + the key in
upper case (``PZQ_ACK_TIMEOUT``). Each field of Config carries its help and unit: the `serve` options are
made from them, and ``conf/pzq.toml`` documents every key with its default (a test keeps them in step).
Durations take units ('250ms', '30s', '5m', '1h') and are held in seconds.
"""

from __future__ import annotations

import dataclasses
import decimal
import ipaddress
import math
import re
import tomllib
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pzq.errors import ConfigError
from pzq.limits import DEFAULT_LIMITS, Limits
from pzq.limits import ClientShares as ClientShares  # (re-exported: the pools' owners use it)

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


# The unit of a setting, as its metadata names it. A duration takes a unit ('30s', '250ms', '5m', '1h',
# '2us'); a plain number is read in the unit the setting had before durations took units, so existing
# files, variables and scripts keep meaning what they meant. Every duration is held in seconds.
DURATION_S, DURATION_US = "s", "µs"  # a duration; the unit a plain number of it is read in
SIZE = "size"  # bytes; takes K, M, G or T
_DIALECTS, _FORMATS = ("auto", "legacy", "current"), ("text", "json")


def _setting(
    default: Any, help: str, unit: str = "", *, choices: tuple[str, ...] = (), shown: str = "", **bounds: float
) -> Any:
    """A Config field with its help, its unit (DURATION_S, DURATION_US, SIZE, or a noun such as 'queues'
    for a count), its ``low``/``high`` bounds and, where the value does not say it, how its default is shown."""
    meta = {"help": help, "unit": unit, "choices": choices, "shown": shown, **bounds}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of `pzq serve`, each with its help and unit: the `serve` options are made from these
    fields, and conf/pzq.toml documents them (a test keeps the three in step). Durations are seconds."""

    database: str = _setting("./pzq-data", "LMDB directory of the store (created if missing).")
    receive_dsn: str = _setting("tcp://127.0.0.1:11131", "Producers' endpoint (ROUTER).")
    send_dsn: str = _setting("tcp://127.0.0.1:11132", "Consumers' endpoint (DEALER).")
    consume_dsn: str = _setting(
        "auto",
        "Batched consumers' endpoint (ROUTER, PZQ-BATCH/1: credit, batched acks); 'auto' puts it beside --send-dsn "
        "(tcp: its port + 2; ipc: a socket named 'consume' in its directory); '' disables.",
        shown="auto (tcp://127.0.0.1:11134)",
    )
    monitor_dsn: str = _setting("", "Monitor endpoint (REQ clients).", shown="ipc://DATABASE/monitor")
    queue: str = _setting("default", "Queue the native sockets serve.")
    phpmq_dsn: str = _setting("tcp://127.0.0.1:9100", "PHPMQ clients' TCP endpoint; '' disables.")
    phpmq_dialect: str = _setting("auto", "PHPMQ dispatch dialect for every connection.", choices=_DIALECTS)
    emqp_frontend_dsn: str = _setting("tcp://127.0.0.1:47291", "eMQP clients' endpoint; '' disables.")
    emqp_backend_dsn: str = _setting("tcp://127.0.0.1:47290", "eMQP workers' endpoint; '' disables.")
    emqp_publish_dsn: str = _setting("tcp://127.0.0.1:47292", "eMQP PUBLISH fan-out (PUB); '' disables.")
    emqp_heartbeat_interval: float = _setting(3.0, "Time between eMQP heartbeats.", DURATION_S, low=0.01, high=3600)
    emqp_heartbeat_liveness: int = _setting(3, "Silent intervals after which a worker is dead.", "intervals", low=1)
    emqp_default_queues: str = _setting("default", "Queues (comma-separated) of a worker whose INFORM names none.")
    emqp_cron_timezone: str = _setting("UTC", "Time zone of eMQP cron schedules (an IANA name).")
    mqks_dsn: str = _setting("tcp://127.0.0.1:25000", "MQKS clients' TCP endpoint; '' disables.")
    api_dsn: str = _setting(
        "tcp://127.0.0.1:11133", "API endpoint (leases, snapshots, batch produce: the Spark connector); '' disables."
    )
    lease_timeout: float = _setting(
        3600.0, "How long a silent consumer group keeps its leased messages.", DURATION_S, low=1, high=30 * 86400
    )
    api_dedup_window: float = _setting(
        86400.0,
        "How long an API PRODUCE key or a native batch id is remembered (a repeat stores nothing).",
        DURATION_S,
        low=0,
        high=30 * 86400,
    )
    ack_timeout: float = _setting(5.0, "A consumer's time to ack a delivery before redelivery.", DURATION_US, low=0.001)
    reaper_frequency: float = _setting(2.5, "Longest idle sleep (expiries are exact anyway).", DURATION_US, low=0.001)
    hard_sync: bool = _setting(
        True, "fsync every commit; --no-hard-sync is faster, but a power cut can lose recent acks or corrupt the store."
    )
    commit_interval: float = _setting(
        0.01,
        "Longest time consumer acks and delivery counts may wait for a commit; producer acks never wait.",
        DURATION_US,
        low=0,
    )
    max_inflight: int = _setting(1000, "Unacked deliveries at most, per consumer pool.", "deliveries", low=1)
    max_deliveries: int = _setting(
        0, "Deliveries before a message is dead-lettered; 0 = unlimited.", "deliveries", low=0
    )
    max_store_size: int = _setting(4 << 30, "Store limit; producers get 'queue full' past it.", SIZE, low=1 << 20)
    max_queues: int = _setting(10_000, "Named queues at most; a new name past it gets 'queue full'.", "queues", low=1)
    implicit_queue_ttl: float = _setting(
        60.0,
        "How long a queue made by a client's request lives once empty and unused; then it is deleted.",
        DURATION_S,
        low=0.001,
        high=30 * 86400,
    )
    gc_whole_interval: float = _setting(
        600.0,
        "How often the garbage collector walks every object, freeing cycles among long-lived ones.",
        DURATION_S,
        low=0.1,
        high=30 * 86400,
    )
    max_connections: int = _setting(
        10_000,
        "TCP connections at most, together; each endpoint keeps a reserve; more are closed.",
        "connections",
        low=1,
    )
    max_partial_input: int = _setting(
        256 << 20,
        "Unfinished PHPMQ and MQKS input of all connections, shared fairly; past a share one is closed.",
        SIZE,
        low=1 << 20,
    )
    min_disk_free: int = _setting(
        64 << 20, "Free disk the store keeps: under it producers get 'queue full'; 0 = do not watch.", SIZE, low=0
    )
    disk_reserve: int = _setting(
        8 << 20,
        "Space held in DATABASE/reserve, given back when the disk fills so that acks still commit.",
        SIZE,
        low=0,
    )
    max_message_size: int = _setting(
        1 << 20,
        "Largest accepted message body, summed over its frames; a bigger one gets its protocol's 'too large'. "
        "Each ZeroMQ producer's receive pipe holds 128 MiB of such messages: 127 at 1M, 7 at 16M (the old default).",
        SIZE,
        low=1024,
    )
    memory_high_water: int = _setting(
        256 << 20,
        "Bytes pzq may hold for its clients (unread replies, unfinished input); past it producers get "
        "'queue full' until it is under --memory-low-water.",
        SIZE,
        low=1 << 20,
    )
    memory_low_water: int = _setting(
        192 << 20, "Under this, a raised memory alarm clears and producers are served again.", SIZE, low=0
    )
    user: str = _setting("", "Switch to this user after binding (when started as root).")
    log_level: str = _setting("info", "debug, info, warning or error.")
    log_format: str = _setting("text", "Log lines as text or as JSON objects (for log shippers).", choices=_FORMATS)
    metrics_dsn: str = _setting("", "Prometheus metrics endpoint, e.g. http://127.0.0.1:9108; '' disables.")
    http_dsn: str = _setting("", "The web console, e.g. http://127.0.0.1:9180; '' disables.")
    http_auth_file: str = _setting(
        "",
        "A file whose first line is the secret that logs in to the web console to requeue, delete and purge "
        "(without it the console is read-only).",
        "file",
    )
    http_host_names: str = _setting(
        "", "Other names browsers call the console by (comma-separated, e.g. 'pzq.example.com'); others get 421."
    )
    allow_ips: str = _setting(
        "",
        "Comma-separated addresses or networks that may connect to the raw-TCP gateways (PHPMQ, MQKS); '' = any.",
    )
    curve_secret_key: str = _setting(
        "", "The server's CURVE secret key file (pzq keygen); enables CURVE on every ZeroMQ endpoint."
    )
    curve_clients: str = _setting("", "Directory of allowed client public keys (*.key).")
    permissions: str = _setting(
        "",
        "Who may produce to, consume from and manage which queue (TOML, docs/permissions.md); '' = "
        "permissions.toml beside --curve-clients if it exists, else every client may do anything.",
        "file",
    )
    unauthenticated: str = _setting(
        "",
        "With CURVE: endpoints that serve clients without a key anyway, e.g. 'monitor,phpmq' (the raw-TCP "
        "gateways and the web console must be named or disabled).",
    )
    # Not a setting (no flag, key or variable): the code's own limits, replaced whole by tests.
    limits: Limits = dataclasses.field(default=DEFAULT_LIMITS, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.monitor_dsn:
            # Not /tmp: another local user could create the socket file there first. The store
            # directory is 0700, so only this user can make or reach a socket in it.
            object.__setattr__(self, "monitor_dsn", f"ipc://{self.database.rstrip('/') or '/'}/monitor")
        if self.consume_dsn == "auto":
            # Beside the send socket rather than a fixed port of its own: two servers with their own
            # --send-dsn never fight over it, and a client that knows the send socket finds it
            object.__setattr__(self, "consume_dsn", beside_send(self.send_dsn) or "auto")

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
        if self.memory_low_water >= self.memory_high_water:
            raise ConfigError(
                f"--memory-low-water: {self.memory_low_water} must be under --memory-high-water "
                f"{self.memory_high_water} (the alarm clears under it)"
            )
        for name in ("phpmq_dsn", "mqks_dsn"):
            if getattr(self, name) and not re.match(r"^tcp://.+:\d+$", getattr(self, name)):
                raise ConfigError(
                    f"{_flag(name)}: {getattr(self, name)!r} is not tcp://HOST:PORT (or empty to disable)"
                )
        if self.phpmq_dialect not in _DIALECTS:
            raise ConfigError(f"--phpmq-dialect: {self.phpmq_dialect!r} is not auto, legacy or current")
        if self.consume_dsn == "auto":
            raise ConfigError(f"--consume-dsn: 'auto' finds no endpoint beside --send-dsn {self.send_dsn!r}: name one")
        if self.consume_dsn:
            for name in ("receive_dsn", "send_dsn", "monitor_dsn", "api_dsn", "emqp_frontend_dsn", "emqp_backend_dsn"):
                if getattr(self, name) == self.consume_dsn:
                    raise ConfigError(f"--consume-dsn {self.consume_dsn} is {_flag(name)} too: give it another")
        for name in ("emqp_frontend_dsn", "emqp_backend_dsn", "emqp_publish_dsn", "api_dsn", "consume_dsn"):
            value = getattr(self, name)
            if value and not re.match(r"^(tcp|ipc|inproc)://.+", value):
                raise ConfigError(
                    f"{_flag(name)}: {value!r} is not a tcp://, ipc:// or inproc:// endpoint (or empty to disable)"
                )
        for name, field in FIELDS.items():
            if "low" in field.metadata:
                _between(self, name, field.metadata["low"], field.metadata.get("high"))
        if bool(self.emqp_frontend_dsn) != bool(self.emqp_backend_dsn):
            raise ConfigError("--emqp-frontend-dsn and --emqp-backend-dsn: give both or neither")
        if not [q for q in self.emqp_default_queues.split(",") if q.strip()]:
            raise ConfigError("--emqp-default-queues: name at least one queue")
        try:
            zoneinfo.ZoneInfo(self.emqp_cron_timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"--emqp-cron-timezone: {self.emqp_cron_timezone!r} is not a time zone name (e.g. UTC or Europe/Berlin)"
            ) from None
        if not self.database:
            raise ConfigError("--database: must name a directory")
        if not self.queue or len(self.queue.encode()) > 255:
            raise ConfigError("--queue: must be 1 to 255 bytes")
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
        if self.curve_secret_key and self.http_dsn and "console" not in self.unauthenticated_roles:
            # (the console's own link to pzq has a CURVE key; the browsers reading it over HTTP have none)
            raise ConfigError(
                f"--http-dsn {self.http_dsn}: the web console shows message bodies without a CURVE key to any "
                "browser that reaches its port, and CURVE is configured: disable it (--http-dsn '') or accept it "
                "knowingly with --unauthenticated console"
            )
        if self.http_dsn and self.monitor_dsn.startswith("inproc://"):  # (the console is a process of its own)
            raise ConfigError(f"--http-dsn: the console's process cannot reach --monitor-dsn {self.monitor_dsn}")
        if self.metrics_dsn:
            parse_endpoint(self.metrics_dsn)
        if self.http_dsn:
            parse_endpoint(self.http_dsn, "--http-dsn")
        if self.http_auth_file and not self.http_dsn:
            raise ConfigError("--http-auth-file: it is the web console's login, and --http-dsn is not set")
        if self.log_format not in _FORMATS:
            raise ConfigError(f"--log-format: {self.log_format!r} is not text or json")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"--log-level: {self.log_level!r} is not one of debug, info, warning, error")
        return self


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _between(config: Config, name: str, low: float, high: float | None) -> None:
    value, unit = getattr(config, name), FIELDS[name].metadata["unit"]
    as_text = (lambda v: show(name, v)) if unit in (DURATION_S, DURATION_US, SIZE) else str  # '1 queues' reads ill
    if high is None and value < low:
        raise ConfigError(f"{_flag(name)}: must be at least {as_text(low)}, got {as_text(value)}")
    if high is not None and not low <= value <= high:
        raise ConfigError(f"{_flag(name)}: {as_text(value)} is not {as_text(low)} to {as_text(high)}")


FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "limits"}
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
# Each duration setting and the unit a plain number of it is read in (what it meant before units).
DURATION_FIELDS = {n: f.metadata["unit"] for n, f in FIELDS.items() if f.metadata["unit"] in (DURATION_S, DURATION_US)}
_DURATION_UNITS = {
    u: decimal.Decimal(f) for u, f in (("h", "3600"), ("m", "60"), ("s", "1"), ("ms", "1e-3"), ("us", "1e-6"))
}
_DURATION_UNITS.update({"µs": _DURATION_UNITS["us"], "μs": _DURATION_UNITS["us"]})  # micro sign and Greek mu


def describe(name: str) -> str:
    """A setting's help and the unit a plain number of it is read in: its option's help and its file comment."""
    help, plain = FIELDS[name].metadata["help"], DURATION_FIELDS.get(name)
    return f"{help} A plain number is {'seconds' if plain == 's' else plain}." if plain else help


def show(name: str, value: Any) -> str:
    """``value`` of setting ``name`` as a person would write it: '5s', '4G', '1000 deliveries', 'on'."""
    unit = FIELDS[name].metadata["unit"]
    if name in DURATION_FIELDS:
        return format_duration(value)
    if unit == SIZE:
        return format_size(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return f"{value} {unit}".rstrip()
    return str(value) or FIELDS[name].metadata["shown"] or "''"


def format_duration(seconds: float) -> str:
    """3600.0 -> '1h', 2.5 -> '2.5s', 0.01 -> '10ms': the largest unit the value is written short in."""
    us = round(abs(seconds) * 1e6)
    sign = "-" if seconds < 0 else ""
    for unit, size, grain in (("h", 3600_000_000, 36_000_000), ("m", 60_000_000, 1_000_000), ("s", 1_000_000, 1000)):
        if us >= size and us % grain == 0:
            return f"{sign}{us / size:.2f}".rstrip("0").rstrip(".") + unit
    if us % 1000 == 0:
        return f"{sign}{us // 1000}ms" if us else "0s"
    return f"{sign}{us}µs"


def format_size(size: int) -> str:
    """4294967296 -> '4G'; a size no suffix divides is plain bytes."""
    for suffix, factor in reversed(list(_SIZE_UNITS.items())):
        if factor > 1 and size and size % factor == 0:
            return f"{size // factor}{suffix.upper()}"
    return str(size)


def parse_duration(value: str | float, plain: str = "s") -> float:
    """'250ms', '30s', '5m', '1h', '2us' or '2µs' -> seconds; a plain number (or a TOML number) is in
    ``plain`` ('s' or 'µs'). Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    m = re.fullmatch(r"\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*(h|m|s|ms|us|µs|μs)?\s*", str(value))
    if isinstance(value, int | float):  # repr: the shortest text that reads back as the number (1e-05 too)
        number, unit = decimal.Decimal(repr(value)), plain
    elif m:
        number, unit = decimal.Decimal(m.group(1)), m.group(2) or plain
    else:
        raise ValueError(f"{value!r} is not a duration such as 250ms, 30s, 5m or 1h")
    seconds = float(number * _DURATION_UNITS[unit])
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a finite duration")
    return seconds


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
        if name in DURATION_FIELDS:
            return parse_duration(value, DURATION_FIELDS[name])
        if kind in (bool, "bool"):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{value!r} is not true or false")
        if kind in (float, "float", int, "int") and isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        if kind in (float, "float"):
            return float(value)
        if kind in (int, "int"):
            if isinstance(value, int):
                return value
            if FIELDS[name].metadata["unit"] == SIZE:
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
