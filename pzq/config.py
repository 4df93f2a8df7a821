"""One frozen Config, layered from defaults, a TOML file, PZQ_* environment variables and flags.

Precedence is flag > environment > file > default. Every key of the file is the option's name with
dashes turned into underscores (``ack_timeout``); the environment variable is ``PZQ_`` + the key in
upper case (``PZQ_ACK_TIMEOUT``). Each field of Config carries its help and unit: the `serve` options are
made from them, and ``conf/pzq.toml`` documents every key with its default (a test keeps them in step).
Durations take units ('250ms', '30s', '5m', '1h') and are held in seconds; a plain number is read by
the one rule of pzq/units.py. The rules between settings are in pzq/config_rules.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pzq.config_rules import BASE_OFFSETS as BASE_OFFSETS
from pzq.config_rules import DIALECTS as _DIALECTS
from pzq.config_rules import FORMATS as _FORMATS
from pzq.config_rules import MAX_BASE_PORT, at_base, check_endpoints, check_names, check_security, check_shard, flag
from pzq.config_rules import ROLES as ROLES
from pzq.config_rules import beside_send as beside_send
from pzq.config_rules import parse_endpoint as parse_endpoint
from pzq.errors import ConfigError
from pzq.limits import DEFAULT_LIMITS, Limits
from pzq.limits import ClientShares as ClientShares  # (re-exported: the pools' owners use it)
from pzq.toml_file import read_toml
from pzq.units import format_duration as format_duration
from pzq.units import format_size as format_size
from pzq.units import parse_duration as parse_duration
from pzq.units import parse_size as parse_size
from pzq.units import plain_rule

# The unit of a setting, as its metadata names it. A duration takes a unit ('30s', '250ms', '5m', '1h',
# '2us'); a plain number is seconds but for the original PZQ's two (µs), and refused for this release
# where its meaning changed (``was``: the unit it meant before), by the rule of pzq/units.py.
DURATION_S, DURATION_US = "s", "µs"  # a duration; the unit a plain number of it is read in
SIZE = "size"  # bytes; takes K, M, G or T


def _setting(
    default: Any,
    help: str,
    unit: str = "",
    *,
    choices: tuple[str, ...] = (),
    shown: str = "",
    was: str = "",
    **bounds: float,
) -> Any:
    """A Config field with its help, its unit (DURATION_S, DURATION_US, SIZE, or a noun such as 'queues'
    for a count), its ``low``/``high`` bounds and, where the value does not say it, how its default is shown.
    ``was``: for a duration, the unit a plain number of it meant before this release (it is refused now)."""
    meta = {"help": help, "unit": unit, "choices": choices, "shown": shown, "was": was, **bounds}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Config:
    """Every setting of `pzq serve`, each with its help and unit: the `serve` options are made from these
    fields, and conf/pzq.toml documents them (a test keeps the three in step). Durations are seconds."""

    database: str = _setting("./pzq-data", "LMDB directory of the store (created if missing).")
    base_port: int = _setting(
        0,
        "A TCP port number: moves every tcp endpoint no flag, variable or file line names to this port plus its "
        "fixed offset (docs/configuration.md; metrics and the console too when set to 'auto'); 0 = off.",
        low=0,
        high=MAX_BASE_PORT,
    )
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
        DURATION_S,
        was=DURATION_US,
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
    metrics_dsn: str = _setting(
        "", "Prometheus metrics endpoint, e.g. http://127.0.0.1:9108; 'auto' = --base-port + 9; '' disables."
    )
    http_dsn: str = _setting("", "The web console, e.g. http://127.0.0.1:9180; 'auto' = --base-port + 10; '' disables.")
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
    shard: str = _setting(
        "",
        "This server's shard name (letters, digits, '_.-'): kept in the store at its first start, which never "
        "starts as another shard; '' = the name the store keeps, if any (docs/cluster.md).",
    )
    cluster: str = _setting(
        "",
        "The shard list (a TOML file of [[shard]] tables, docs/cluster.md): this server's shard must be in it; "
        "WHERE answers from it; '' = not in a cluster.",
        "file",
    )
    etcd: str = _setting(
        "",
        "etcd's client URLs (http://host:2379, comma-separated): the shards register and place queues there "
        "instead of a shard list (docs/cluster.md); needs a shard name; '' = no etcd.",
    )
    etcd_ca: str = _setting(
        "", "With https:// etcd URLs: the CA file etcd's certificate is checked against; '' = the system's.", "file"
    )
    etcd_cert: str = _setting(
        "", "With https:// etcd URLs: this server's client certificate (etcd's --client-cert-auth).", "file"
    )
    etcd_key: str = _setting("", "The client certificate's private key file (with etcd_cert).", "file")
    etcd_prefix: str = _setting(
        "/pzq/",
        "The etcd keys of this cluster start with this (two clusters on one etcd: two prefixes).",
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
        check_endpoints(self)
        if self.memory_low_water >= self.memory_high_water:
            raise ConfigError(
                f"--memory-low-water: {self.memory_low_water} must be under --memory-high-water "
                f"{self.memory_high_water} (the alarm clears under it)"
            )
        for name, field in FIELDS.items():
            if "low" in field.metadata:
                _between(self, name, field.metadata["low"], field.metadata.get("high"))
        check_names(self)
        check_security(self)
        check_shard(self)
        return self


def _between(config: Config, name: str, low: float, high: float | None) -> None:
    value, unit = getattr(config, name), FIELDS[name].metadata["unit"]
    as_text = (lambda v: show(name, v)) if unit in (DURATION_S, DURATION_US, SIZE) else str  # '1 queues' reads ill
    if high is None and value < low:
        raise ConfigError(f"{flag(name)}: must be at least {as_text(low)}, got {as_text(value)}")
    if high is not None and not low <= value <= high:
        raise ConfigError(f"{flag(name)}: {as_text(value)} is not {as_text(low)} to {as_text(high)}")


FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name != "limits"}
# Each duration setting and the unit a plain number of it is read in (pzq/units.py: the one rule).
DURATION_FIELDS = {n: f.metadata["unit"] for n, f in FIELDS.items() if f.metadata["unit"] in (DURATION_S, DURATION_US)}
# The durations whose plain number meant another unit before this release, and that unit: refused now.
PLAIN_REFUSED = {n: f.metadata["was"] for n, f in FIELDS.items() if n in DURATION_FIELDS and f.metadata["was"]}


def describe(name: str) -> str:
    """A setting's help and the unit a plain number of it is read in: its option's help and its file comment."""
    help, plain = FIELDS[name].metadata["help"], DURATION_FIELDS.get(name)
    return f"{help} {plain_rule(plain, PLAIN_REFUSED.get(name, ''))}" if plain else help


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


def _coerce(name: str, value: Any, source: str) -> Any:
    """Turn a value from a file, the environment or a flag into the field's type, or raise ConfigError."""
    kind = FIELDS[name].type
    try:
        if name in DURATION_FIELDS:
            return parse_duration(value, DURATION_FIELDS[name], PLAIN_REFUSED.get(name, ""))
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
        raise ConfigError(f"{source} {exc}") from None


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
            raise ConfigError(f"unknown option {flag(name)}")
        values[name] = _coerce(name, value, f"{flag(name)}:")
    values.update(at_base(values))  # (here, where what a source named is known: that wins over the base)
    return Config(**values).validate()


def _read_file(path: Path) -> dict[str, Any]:
    data = read_toml(str(path), "config file", invalid="not valid TOML")
    values = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        values[name] = _coerce(name, value, f"config file {path}: {key}:")
    return values
