"""Which gateways and endpoints a Config asks for, each made with what it needs handed in (its side
tables, its limits), and the start-up lines that say what is served and to whom."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pzq import shards as shards_
from pzq.broker import Broker
from pzq.config import Config
from pzq.endpoints.api import ApiEndpoint
from pzq.endpoints.base import Endpoint, Sockets
from pzq.endpoints.emqp import EmqpEndpoint
from pzq.endpoints.native import NativeEndpoints
from pzq.endpoints.native_consume import BatchConsumeEndpoint
from pzq.endpoints.shares import ConnectionLimit
from pzq.endpoints.stream import StreamEndpoint
from pzq.errors import ConfigError
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import FramesGateway, StreamGateway
from pzq.gateways.emqp import EmqpGateway
from pzq.gateways.mqks import MqksGateway
from pzq.gateways.mqks_bindings import BindingIndex
from pzq.gateways.native import NativeGateway
from pzq.gateways.native_consume import BatchConsumeGateway
from pzq.gateways.phpmq import PhpmqGateway
from pzq.leases import Leases
from pzq.permissions import Permissions
from pzq.server.where import Where, registry_for
from pzq.store import Store
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

log = logging.getLogger("pzq.server")


def shard_identity(cfg: Config, store: Store) -> Where:
    """Which shard the server is: --shard, kept in the store at its first start (WrongShard if the store
    keeps another name), or the name the store keeps; with --cluster, a name is needed and must be in the
    list (checked before the name is kept: a refused start keeps nothing)."""
    catalog = store.catalog
    listed = shards_.load(cfg.cluster) if cfg.cluster else None  # (config checked it reads)
    name = cfg.shard or catalog.shard
    if cfg.shard and catalog.shard and cfg.shard != catalog.shard:
        catalog.claim_shard(cfg.shard)  # (raises WrongShard, naming both)
    if cfg.etcd and not name:
        raise ConfigError(
            f"--etcd: this server has no shard name (none given, none kept in {cfg.database}): "
            "start it once with --shard NAME, which its store keeps"
        )
    if listed is not None and not name:
        raise ConfigError(
            f"--cluster {cfg.cluster}: this server has no shard name (none given, none kept in {cfg.database}): "
            "start it once with --shard NAME, which its store keeps"
        )
    if listed is not None and name not in listed.names():
        raise ConfigError(
            f"--cluster {cfg.cluster}: shard {name!r} (kept in {cfg.database}) is not in the list "
            f"(it names {', '.join(listed.names())})"
        )
    catalog.claim_shard(name)
    if name:
        where = f" of {len(listed.shards)} in {cfg.cluster}" if listed is not None else ""
        log.info("shard %r%s", name, where)
    if listed is not None:
        for problem in listed_apart(cfg, listed.named(name)):
            log.warning("shard %r: %s: clients reading the list will not reach it there", name, problem)
    if cfg.etcd:
        log.info("shard %r, registered in etcd at %s (keys %s)", name, cfg.etcd, cfg.etcd_prefix)
        registered = Where(name, None, catalog, registry_for(cfg, name, catalog.store_id))
        store.commit()  # (the store id is durable before etcd hears it: a crash must not make another)
        registered.start()
        return registered
    return Where(name, listed, catalog)


def listed_apart(cfg: Config, listed: shards_.Shard) -> list[str]:
    """Where the shard list's entry of this shard and its own settings disagree: an endpoint the list
    names that this server does not serve, another port, or another ipc path. (A host is not compared:
    the list names the address clients use, the server may bind a wildcard.)"""
    problems = []
    for role, dsn in listed.endpoints().items():
        own = getattr(cfg, role)
        if not own:
            problems.append(f"the list gives {role} {dsn}, which this server does not serve ('' here)")
        elif dsn.startswith("tcp://") and own.startswith("tcp://"):
            if dsn.rpartition(":")[2] != own.rpartition(":")[2]:
                problems.append(f"the list gives {role} {dsn}, this server binds {own} (another port)")
        elif dsn != own:
            problems.append(f"the list gives {role} {dsn}, this server binds {own}")
    return problems


def gateway_endpoints(
    cfg: Config,
    broker: Broker,
    leases: Leases,
    store: Store,
    owned: Sockets,
    connections: ConnectionLimit,
    drop_queue: Callable[[str], int],
    permissions: Permissions,
    where: Where | None = None,
) -> list[Endpoint]:
    """The endpoints of every gateway the config enables (native, PHPMQ, eMQP, MQKS, API), in the order
    the loop serves them."""
    native = NativeGateway(
        broker,
        queue=cfg.queue,
        max_message_size=cfg.max_message_size,
        max_inflight=cfg.max_inflight,
        ack_timeout_s=cfg.ack_timeout,
        keys=DedupKeys(store),
        dedup_window_s=cfg.api_dedup_window,
        limits=cfg.limits,
    )
    _native_conforms: FramesGateway = native  # (mypy checks each gateway against the contract)
    endpoints: list[Endpoint] = [NativeEndpoints(cfg, native, owned)]
    if cfg.consume_dsn:  # batched consumers of the same queue (PZQ-BATCH/1)
        batch = BatchConsumeGateway(broker, queue=cfg.queue, ack_timeout_s=cfg.ack_timeout, limits=cfg.limits)
        endpoints.append(BatchConsumeEndpoint(cfg, batch, owned))
    if cfg.phpmq_dsn:
        phpmq: StreamGateway = PhpmqGateway(
            broker,
            max_content=cfg.max_message_size,
            dialect=cfg.phpmq_dialect,
            max_credit=cfg.max_inflight,
            permissions=permissions,
            limits=cfg.limits,
        )
        endpoints.append(StreamEndpoint("phpmq", cfg.phpmq_dsn, phpmq, cfg, owned, connections))
    if cfg.emqp_frontend_dsn:
        emqp = EmqpGateway(
            broker,
            EmqpJobs(store),
            Schedules(store),
            limits=cfg.limits,
            heartbeat_s=cfg.emqp_heartbeat_interval,
            liveness=cfg.emqp_heartbeat_liveness,
            publish=bool(cfg.emqp_publish_dsn),
            cron_timezone=cfg.emqp_cron_timezone,
            default_queues=[q.strip() for q in cfg.emqp_default_queues.split(",") if q.strip()],
            permissions=permissions,
            max_message_size=cfg.max_message_size,
        )
        emqp.restore_jobs(time.monotonic())
        _conforms: FramesGateway = emqp  # (mypy checks each gateway against the contract)
        endpoints.append(EmqpEndpoint(cfg, emqp, owned))
    if cfg.mqks_dsn:
        mqks: StreamGateway = MqksGateway(
            broker,
            Bindings(store),
            max_line=cfg.max_message_size + 4096,
            window=cfg.max_inflight,
            drop_queue=drop_queue,
            limits=cfg.limits,
            permissions=permissions,
        )
        endpoints.append(StreamEndpoint("mqks", cfg.mqks_dsn, mqks, cfg, owned, connections))
    if cfg.api_dsn:
        api = ApiGateway(
            broker,
            leases,
            DedupKeys(store),
            max_message_size=cfg.max_message_size,
            dedup_window_s=cfg.api_dedup_window,
            limits=cfg.limits,
            permissions=permissions,
            where=where,
        )
        endpoints.append(ApiEndpoint(cfg, api, owned))
    return endpoints


def mqks_routing(endpoints: list[Endpoint]) -> BindingIndex | None:
    """The MQKS gateway's bindings (which queues an event is copied to), for the monitor's ROUTES and
    DELETE; None when no MQKS gateway runs."""
    for endpoint in endpoints:
        if isinstance(endpoint, StreamEndpoint) and isinstance(endpoint.gateway, MqksGateway):
            return endpoint.gateway.bindings
    return None


def log_start(cfg: Config, open_roles: list[str], connections: int, *, curve: bool) -> None:
    """Say what is served, where, and which endpoints serve clients without a key."""
    log.info(
        "pzq serving queue %r from %s: %s",
        cfg.queue,
        cfg.database,
        ", ".join(
            f"{name} {value}"
            for name, value in (
                ("receive", cfg.receive_dsn),
                ("send", cfg.send_dsn),
                ("consume", cfg.consume_dsn),
                ("monitor", cfg.monitor_dsn),
                ("phpmq", cfg.phpmq_dsn),
                ("emqp", cfg.emqp_frontend_dsn),
                ("mqks", cfg.mqks_dsn),
                ("api", cfg.api_dsn),
            )
            if value
        ),
    )
    if connections < cfg.max_connections:
        log.info(
            "connections at most %d (--max-connections %d, under half the open-files limit)",
            connections,
            cfg.max_connections,
        )
    if cfg.http_dsn:  # (a web server, not a ZeroMQ socket: never CURVE; with CURVE, named --unauthenticated)
        open_roles = [*open_roles, f"console {cfg.http_dsn}"]
    if not curve:
        log.info("no CURVE configured: every endpoint serves any client that can reach it")
    elif open_roles:
        log.warning(
            "CURVE configured, but these endpoints serve clients without a key (--unauthenticated): %s",
            ", ".join(open_roles),
        )
    else:
        log.info("CURVE configured: every endpoint requires an allowed client key")
