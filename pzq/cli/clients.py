"""The native clients' commands: produce, consume and monitor (the MQKS ones are in mqks.py)."""

from __future__ import annotations

import json
import sys
import time

import click

from pzq.cli.common import (
    Duration,
    answer_timeout_option,
    config_option,
    curve,
    curve_options,
    duration_help,
    errors_to_exit,
    fail,
    from_settings,
    monitor_endpoint,
    resolve,
)
from pzq.clients import native as client
from pzq.clients.cluster import Cluster
from pzq.clients.cluster_consume import ShardedConsumer
from pzq.clients.cluster_native import ShardedProducer
from pzq.config import Config, beside_send, format_duration
from pzq.errors import ClientError, ConfigError, ExitCode
from pzq.logs import escape


@click.command()
@config_option
@click.option(
    "--monitor-dsn",
    help="Monitor endpoint.  [default: from --config or PZQ_*, else ipc://ABSOLUTE/pzq-data/monitor when that "
    "socket is there, else /etc/pzq/pzq.toml's]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the STATS JSON instead of a table.")
@click.option(
    "--watch",
    type=Duration(),
    metavar="DURATION",
    help=duration_help(
        "Redraw this often until ^C (on a terminal in place; else one block per interval, each with its time)."
    )
    + "  [default: show once]",
)
@answer_timeout_option
@curve_options
@errors_to_exit
def monitor(config_file, monitor_dsn, as_json, watch, timeout, curve_client_key, curve_server_key) -> None:
    """Show the server's figures: its queues first, then its counters, with the time they were read."""
    endpoint = monitor_endpoint(config_file, monitor_dsn)
    keys = curve(curve_client_key, curve_server_key)
    in_place = bool(watch) and sys.stdout.isatty()
    while True:
        figures = client.stats(endpoint, timeout_s=timeout, curve=keys)
        if as_json:
            click.echo(json.dumps(figures, indent=2))
        else:
            try:
                table = _table(figures)
            except (TypeError, KeyError, ValueError):  # a queue entry without pzq's fields
                raise ClientError(f"the figures from {endpoint} are not pzq's: is a pzq monitor there?") from None
            every = f", every {format_duration(watch)} (^C stops)" if watch else ""
            heading = f"pzq at {endpoint}, {time.strftime('%Y-%m-%d %H:%M:%S')}{every}\n\n"
            # One write per frame: the terminal's clear and the new frame arrive together, without flicker.
            click.echo(
                ("\x1b[H\x1b[2J" if in_place else "") + heading + table + ("" if in_place else "\n" * bool(watch))
            )
        if not watch:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return


def _table(figures: dict) -> str:
    lines = []
    queues = figures.get("queues", {})
    if queues:  # what an operator looks for first
        lines.append(f"{'queue':<24} {'depth':>10} {'inflight':>10} {'dead':>10}")
        for name, q in queues.items():
            lines.append(f"{escape(name):<24} {q['depth']:>10} {q['inflight']:>10} {q['dead_letters']:>10}")
        lines.append("")
    flat = {}
    for name, value in figures.items():
        if isinstance(value, dict) and name != "queues":
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        elif name != "queues":
            flat[name] = value
    width = max(len(k) for k in flat)
    for name, value in flat.items():
        lines.append(f"{name:<{width}}  {value}")
    return "\n".join(lines)


cluster_option = click.option(
    "--cluster",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A shard list (TOML [[shard]] tables: docs/cluster.md): the native queue (the settings' queue) over "
    "the shards of its places instead of one server's endpoints; '' = one server.  [default: --config's cluster or "
    "$PZQ_CLUSTER, else one server; an endpoint option given here: that one server]",
)


@click.command()
@config_option
@click.option("--receive-dsn", help="Producers' endpoint." + from_settings("receive_dsn"))
@click.option(
    "--window", type=click.IntRange(1), default=100, show_default=True, help="Unacked messages in flight at most."
)
@click.option(
    "--batch",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="Messages per batch (PZQ-BATCH/1, where the server speaks it); 1 sends one message at a time.",
)
@click.option(
    "--timeout",
    type=Duration(was="ms"),
    default="10s",
    metavar="DURATION",
    show_default=True,
    help=duration_help("Wait for each ack.", was="ms"),
)
@cluster_option
@click.argument("messages", nargs=-1)
@curve_options
@errors_to_exit
def produce(
    config_file, receive_dsn, window, batch, timeout, cluster, messages, curve_client_key, curve_server_key
) -> None:
    """Store MESSAGES (or each line of standard input) and wait until every one is acked. Messages go in
    batches of --batch where the server speaks batches (--window messages in flight at most); with
    --cluster, each batch to the next shard of the queue's places (--window messages in flight a shard)."""
    cfg = resolve(config_file, receive_dsn=receive_dsn, cluster=cluster)
    if messages:
        bodies = ([m.encode()] for m in messages)
    else:
        bodies = ([line.rstrip(b"\r\n")] for line in sys.stdin.buffer)
    keys = curve(curve_client_key, curve_server_key)
    shards = _cluster(cfg, keys, cluster, {"--receive-dsn": receive_dsn})
    if shards is not None:
        per = min(batch, max(1, window))
        spread = dict(timeout_s=timeout, batch=per, window=max(1, window // per))
        with shards, ShardedProducer(shards, cfg.queue, **spread) as sharded:
            _produced(sharded.send_many(bodies))
        return
    with client.Producer(cfg.receive_dsn, timeout_s=timeout, curve=keys) as producer:
        if batch > 1:  # (a server without batches gets one message at a time, --window in flight)
            per = min(batch, max(1, window))
            results = producer.send_many(bodies, batch=per, window=max(1, window // per))
        else:
            results = producer.produce_many(bodies, window=max(1, window))
    _produced(results)


def _produced(results: list[client.ProduceResult]) -> None:
    """Say how many were stored; exit 1 if any was refused (the first ten named, with their reasons)."""
    failed = [r for r in results if not r.ok]
    for r in failed[:10]:
        click.echo(f"pzq: message {r.message_id.decode()} refused: {r.error}", err=True)
    click.echo(f"{len(results) - len(failed)} stored, {len(failed)} refused", err=True)
    if failed:
        sys.exit(ExitCode.FAILURE)


@click.command()
@config_option
@click.option("--send-dsn", help="Consumers' endpoint." + from_settings("send_dsn"))
@click.option(
    "--consume-dsn",
    help="Batched consumers' endpoint (auto: beside the send socket; with --send-dsn alone, the one beside it); "
    "'' = the send socket only. A "
    "server without it is consumed from the send socket." + from_settings("consume_dsn"),
)
@click.option(
    "-n", "--count", type=click.IntRange(0), default=1, show_default=True, help="Messages to consume; 0 = until ^C."
)
@click.option(
    "--timeout",
    type=Duration(was="ms"),
    default="10s",
    metavar="DURATION",
    show_default=True,
    help=duration_help("Wait for each message before giving up (exit 10, NO_MESSAGE).", was="ms"),
)
@click.option("--nack", is_flag=True, help="Requeue what was received instead of deleting it.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per message (key, body frames; with --cluster, its shard)."
)
@cluster_option
@curve_options
@errors_to_exit
def consume(
    config_file, send_dsn, consume_dsn, count, timeout, nack, as_json, cluster, curve_client_key, curve_server_key
) -> None:
    """Print and acknowledge COUNT messages (body frames joined by tabs, one message per line).

    Through the batched endpoint it asks for exactly the messages it has yet to print (credit), so
    nothing is taken from the queue that is not shown; a server without it is consumed from the send
    socket, which pushes what it has. With --cluster, every shard that has some of the queue is read in
    turn, each granted credit for what is yet to print: what another shard sent and was not printed goes
    back to its queue at the end, counted as delivered once."""
    cfg = resolve(config_file, send_dsn=send_dsn, consume_dsn=consume_dsn, cluster=cluster)
    keys = curve(curve_client_key, curve_server_key)
    shards = _cluster(cfg, keys, cluster, {"--send-dsn": send_dsn, "--consume-dsn": consume_dsn})
    if shards is not None:
        with shards, ShardedConsumer(shards, cfg.queue) as sharded:
            try:
                _print_and_settle(sharded, count, timeout, nack, as_json)
            finally:  # (what a shard left out holds was not read: said, whatever ended the command)
                for name, why in sharded.errors.items():
                    click.echo(f"pzq: shard {name} left out: {why.removeprefix(f'shard {name}: ')}", err=True)
        return
    # (--send-dsn alone names another server than the configured one: its batched endpoint is the one
    # 'auto' puts beside that send socket)
    batched = cfg.consume_dsn if consume_dsn is not None or send_dsn is None else beside_send(send_dsn)
    with client.BatchConsumer(batched or None, fallback=cfg.send_dsn, curve=keys) as consumer:
        _print_and_settle(consumer, count, timeout, nack, as_json)


def _print_and_settle(consumer, count: int, timeout: float, nack: bool, as_json: bool) -> None:
    """Print COUNT messages (0: until ^C) and ack (or nack) each batch once printed; exit NO_MESSAGE when
    none comes within ``timeout``."""
    out = sys.stdout.buffer
    got = 0
    while count == 0 or got < count:
        batch = consumer.receive(count - got if count else 100, timeout_s=timeout)
        if not batch:  # (connected and handshaken, else reach.py said so: the queue had nothing)
            fail(f"no message came within {format_duration(timeout)} ({got} received)", ExitCode.NO_MESSAGE)
        for key, body in batch:
            if as_json:
                row = {"key": key.decode(), "sent_us": consumer.sent_us.get(key, 0), "body": []}
                if isinstance(consumer, ShardedConsumer):
                    row["shard"] = consumer.shard_of(key)
                row["body"] = [f.decode("utf-8", "replace") for f in body]
                out.write(json.dumps(row).encode())
            else:
                out.write(b"\t".join(body))
            out.write(b"\n")
        out.flush()
        (consumer.nack if nack else consumer.ack)([key for key, _ in batch], timeout_s=timeout)
        got += len(batch)


def _cluster(cfg: Config, keys, cluster: str | None, endpoints: dict[str, str | None]) -> Cluster | None:
    """The cluster of the settings' shard list (--cluster, else PZQ_CLUSTER or --config's ``cluster``: a
    shard's own config names its list); None for a single server, as for an endpoint named on the command
    line (``endpoints``: flag -> its value, None when not given) without --cluster: that server is meant."""
    named = [flag for flag, value in endpoints.items() if value is not None]
    if named and cluster:
        raise ConfigError(f"--cluster or {' '.join(named)}: the queue's shards, or one server, not both")
    if cfg.etcd and not named and not cluster:  # (a shard's settings, its cluster kept in etcd: asked of it)
        local = cfg.api_dsn.replace("//*:", "//127.0.0.1:").replace("//0.0.0.0:", "//127.0.0.1:")
        return Cluster.from_server(local, curve=keys)
    return Cluster.from_file(cfg.cluster, curve=keys) if cfg.cluster and not named else None
