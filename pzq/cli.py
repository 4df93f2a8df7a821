"""The `pzq` command line (click). Argument handling only: the work lives in server, client and bench."""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import click

from pzq import __version__, config, logs
from pzq.clients import native as client
from pzq.errors import ClientError, ConfigError, PzqError, StoreDamaged, StoreLocked, StoreTooNew


def _fail(message: str, code: int = 1):
    click.echo(f"pzq: error: {message}", err=True)
    sys.exit(code)


def _errors_to_exit(func):
    """One clear line and a non-zero exit for every pzq error: no tracebacks for users' mistakes."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except (ConfigError, StoreLocked) as exc:
            _fail(str(exc), 2)
        except (StoreDamaged, StoreTooNew) as exc:
            _fail(str(exc), 3)
        except PzqError as exc:
            _fail(str(exc), 1)

    return wrapper


def _resolve(config_file: str | None, **flags) -> config.Config:
    return config.load(flags, os.environ, config_file)


def curve_options(func):
    """--curve-client-key / --curve-server-key for commands that talk to a CURVE server."""
    func = click.option(
        "--curve-server-key", envvar="PZQ_CURVE_SERVER_KEY", help="The server's CURVE public key file (server.key)."
    )(func)
    return click.option(
        "--curve-client-key",
        envvar="PZQ_CURVE_CLIENT_KEY",
        help="This client's CURVE key pair file (NAME.key_secret), if the server uses CURVE.",
    )(func)


def _curve(client_key: str | None, server_key: str | None) -> tuple[str, str] | None:
    if bool(client_key) != bool(server_key):
        raise ConfigError("--curve-client-key and --curve-server-key: give both or neither")
    return (client_key, server_key) if client_key and server_key else None


config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    envvar="PZQ_CONFIG",
    help="TOML file of settings (see conf/pzq.toml).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="pzq")
def cli() -> None:
    """pzq: a durable message queue that speaks PZQ (and more) on ZeroMQ and LMDB."""


@cli.command()
@config_option
@click.option("--database", help="LMDB directory of the store.  [default: ./pzq-data]")
@click.option("--receive-dsn", help="Producers' endpoint (ROUTER).  [default: tcp://127.0.0.1:11131]")
@click.option("--send-dsn", help="Consumers' endpoint (DEALER).  [default: tcp://127.0.0.1:11132]")
@click.option("--monitor-dsn", help="Monitor endpoint (REQ clients).  [default: ipc://DATABASE/monitor]")
@click.option("--queue", help="Queue the native sockets serve.  [default: default]")
@click.option("--phpmq-dsn", help="PHPMQ clients' TCP endpoint; '' disables.  [default: tcp://127.0.0.1:9100]")
@click.option(
    "--phpmq-dialect",
    type=click.Choice(["auto", "legacy", "current"]),
    help="Force the PHPMQ dispatch dialect for every connection.  [default: auto]",
)
@click.option("--emqp-frontend-dsn", help="eMQP clients' endpoint; '' disables.  [default: tcp://127.0.0.1:47291]")
@click.option("--emqp-backend-dsn", help="eMQP workers' endpoint; '' disables.  [default: tcp://127.0.0.1:47290]")
@click.option("--emqp-publish-dsn", help="eMQP PUBLISH fan-out (PUB); '' disables.  [default: tcp://127.0.0.1:47292]")
@click.option("--emqp-heartbeat-interval", type=float, help="Seconds between heartbeats to workers.  [default: 3]")
@click.option(
    "--emqp-heartbeat-liveness", type=int, help="Silent intervals after which a worker is dead.  [default: 3]"
)
@click.option("--emqp-default-queues", help="Queues of a worker whose INFORM names none.  [default: default]")
@click.option("--emqp-cron-timezone", help="Time zone of eMQP cron schedules (an IANA name).  [default: UTC]")
@click.option("--mqks-dsn", help="MQKS clients' TCP endpoint; '' disables.  [default: tcp://127.0.0.1:25000]")
@click.option(
    "--api-dsn",
    help="API endpoint (leases, snapshots, batch produce: the Spark connector); '' disables.  "
    "[default: tcp://127.0.0.1:11133]",
)
@click.option(
    "--lease-timeout",
    type=float,
    help="Seconds a consumer group may stay silent before its leased messages return to the queue.  [default: 3600]",
)
@click.option(
    "--api-dedup-window",
    type=float,
    help="Seconds a PRODUCE key is remembered, so a repeated request stores nothing.  [default: 86400]",
)
@click.option("--ack-timeout", type=int, help="µs a consumer has to ack a delivery.  [default: 5000000]")
@click.option(
    "--reaper-frequency",
    type=int,
    help="Longest µs the loop sleeps when idle (expiries are exact regardless).  [default: 2500000]",
)
@click.option(
    "--hard-sync/--no-hard-sync",
    default=None,
    help="fsync every commit (default). --no-hard-sync is faster but a power cut or kernel crash "
    "can lose recently acked messages or corrupt the store.",
)
@click.option(
    "--commit-interval",
    type=int,
    help="Longest µs consumer acks and delivery counts may wait for a commit; producer acks "
    "never wait.  [default: 10000]",
)
@click.option("--max-inflight", type=int, help="Unacked deliveries at most, per consumer pool.  [default: 1000]")
@click.option(
    "--max-deliveries",
    type=int,
    help="Deliveries before a message goes to the dead letters; 0 = unlimited.  [default: 0]",
)
@click.option(
    "--max-store-size", help="Store limit, e.g. 512M or 4G; producers get 'queue full' past it.  [default: 4G]"
)
@click.option("--max-message-size", help="Largest accepted message body, e.g. 16M.  [default: 16M]")
@click.option(
    "--max-connections",
    type=int,
    help="TCP connections (ZeroMQ, PHPMQ, MQKS) at most, together, and "
    "nine tenths of it on one endpoint; more are closed at once (kept "
    "under the open-files limit).  [default: 10000]",
)
@click.option(
    "--max-partial-input",
    help="Bytes of unfinished PHPMQ messages and MQKS lines in all connections "
    "together; past it the connection that grew is closed.  [default: 256M]",
)
@click.option(
    "--max-queues", type=int, help="Named queues at most; a new name past it gets 'queue full'.  [default: 10000]"
)
@click.option(
    "--min-disk-free",
    help="Free space the store's filesystem keeps: under it producers get 'queue full' "
    "(0 = do not watch).  [default: 64M]",
)
@click.option(
    "--disk-reserve",
    help="Bytes held in DATABASE/reserve and given back when the disk fills, so that acks still commit.  [default: 8M]",
)
@click.option("--user", help="Switch to this user after binding (when started as root).")
@click.option("--log-level", help="debug, info, warning or error.  [default: info]")
@click.option(
    "--allow-ips",
    help="Comma-separated addresses or networks that may connect to the raw-TCP "
    "gateways (PHPMQ, MQKS); '' = any.  [default: '']",
)
@click.option(
    "--curve-secret-key",
    help="The server's CURVE secret key file (pzq keygen); enables CURVE on every ZeroMQ endpoint.  [default: '']",
)
@click.option("--curve-clients", help="Directory of allowed client public keys (*.key).  [default: '']")
@click.option(
    "--unauthenticated",
    help="With CURVE: endpoints that serve clients without a key anyway, e.g. "
    "'monitor,phpmq' (the raw-TCP gateways must be named or disabled).  "
    "[default: '']",
)
@click.option(
    "--metrics-dsn", help="Prometheus metrics endpoint, e.g. http://127.0.0.1:9108; '' disables.  [default: '']"
)
@click.option("--http-dsn", help="The web console, e.g. http://127.0.0.1:9180; '' disables.  [default: '']")
@click.option(
    "--http-host-names",
    help="Other names browsers call the web console by (comma-separated, e.g. a TLS proxy's "
    "'pzq.example.com'); any other Host gets 421.  [default: '']",
)
@click.option(
    "--http-auth-file",
    type=click.Path(dir_okay=False),
    help="A file whose first line is the secret that logs in to the web console to requeue, delete "
    "and purge (without it the console is read-only).  [default: '']",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text or as JSON objects (for journald and log shippers).  [default: text]",
)
@_errors_to_exit
def serve(config_file, **flags) -> None:
    """Run the server in the foreground until SIGTERM or SIGINT."""
    cfg = _resolve(config_file, **flags)
    logs.configure(cfg.log_level, cfg.log_format)
    from pzq.console.web import Console
    from pzq.server import serve as run_server

    run_server(cfg, reload=lambda: _resolve(config_file, **flags), console=Console.from_config)


@cli.command()
@config_option
@click.option("--monitor-dsn", help="Monitor endpoint (default from config/env).")
@click.option("--json", "as_json", is_flag=True, help="Print the STATS JSON instead of a table.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="Refresh every SECONDS until ^C.")
@click.option("--timeout", type=int, default=5000, show_default=True, help="ms to wait for an answer.")
@curve_options
@_errors_to_exit
def monitor(config_file, monitor_dsn, as_json, watch, timeout, curve_client_key, curve_server_key) -> None:
    """Show the server's figures."""
    endpoint = _resolve(config_file, monitor_dsn=monitor_dsn).monitor_dsn
    curve = _curve(curve_client_key, curve_server_key)
    while True:
        figures = client.stats(endpoint, timeout_ms=timeout, curve=curve)
        if as_json:
            click.echo(json.dumps(figures, indent=2))
        else:
            try:
                table = _table(figures)
            except (TypeError, KeyError, ValueError):  # a queue entry without pzq's fields
                raise ClientError(f"the figures from {endpoint} are not pzq's: is a pzq monitor there?") from None
            if watch:
                click.clear()
            click.echo(table)
        if not watch:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            return


def _table(figures: dict) -> str:
    lines = []
    flat = {}
    for name, value in figures.items():
        if isinstance(value, dict) and name != "queues":
            flat.update({f"{name}.{k}": v for k, v in value.items()})
        elif name != "queues":
            flat[name] = value
    width = max(len(k) for k in flat)
    for name, value in flat.items():
        lines.append(f"{name:<{width}}  {value}")
    queues = figures.get("queues", {})
    if queues:
        lines.append("")
        lines.append(f"{'queue':<24} {'depth':>10} {'inflight':>10} {'dead':>10}")
        for name, q in queues.items():
            lines.append(f"{name:<24} {q['depth']:>10} {q['inflight']:>10} {q['dead_letters']:>10}")
    return "\n".join(lines)


@cli.command()
@config_option
@click.option("--receive-dsn", help="Producers' endpoint (default from config/env).")
@click.option("--window", type=int, default=100, show_default=True, help="Unacked messages in flight at most.")
@click.option("--timeout", type=int, default=10_000, show_default=True, help="ms to wait for each ack.")
@click.argument("messages", nargs=-1)
@curve_options
@_errors_to_exit
def produce(config_file, receive_dsn, window, timeout, messages, curve_client_key, curve_server_key) -> None:
    """Store MESSAGES (or each line of standard input) and wait until every one is acked."""
    endpoint = _resolve(config_file, receive_dsn=receive_dsn).receive_dsn
    if messages:
        bodies = ([m.encode()] for m in messages)
    else:
        bodies = ([line.rstrip(b"\r\n")] for line in sys.stdin.buffer)
    curve = _curve(curve_client_key, curve_server_key)
    with client.Producer(endpoint, timeout_ms=timeout, curve=curve) as producer:
        results = producer.produce_many(bodies, window=max(1, window))
    failed = [r for r in results if not r.ok]
    for r in failed[:10]:
        click.echo(f"pzq: message {r.message_id.decode()} refused: {r.error}", err=True)
    click.echo(f"{len(results) - len(failed)} stored, {len(failed)} refused", err=True)
    if failed:
        sys.exit(1)


@cli.command()
@config_option
@click.option("--send-dsn", help="Consumers' endpoint (default from config/env).")
@click.option("-n", "--count", type=int, default=1, show_default=True, help="Messages to consume; 0 = until ^C.")
@click.option(
    "--timeout",
    type=int,
    default=10_000,
    show_default=True,
    help="ms to wait for each message before giving up (exit 1).",
)
@click.option("--nack", is_flag=True, help="Requeue what was received instead of deleting it.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message (key, body frames).")
@curve_options
@_errors_to_exit
def consume(config_file, send_dsn, count, timeout, nack, as_json, curve_client_key, curve_server_key) -> None:
    """Print and acknowledge COUNT messages (body frames joined by tabs, one message per line)."""
    endpoint = _resolve(config_file, send_dsn=send_dsn).send_dsn
    out = sys.stdout.buffer
    got = 0
    with client.Consumer(endpoint, curve=_curve(curve_client_key, curve_server_key)) as consumer:
        while count == 0 or got < count:
            delivery = consumer.receive(timeout)
            if delivery is None:
                click.echo(f"pzq: no message within {timeout} ms after {got} received", err=True)
                sys.exit(1)
            if as_json:
                out.write(
                    json.dumps(
                        {
                            "key": delivery.key.decode(),
                            "sent_us": delivery.sent_us,
                            "body": [f.decode("utf-8", "replace") for f in delivery.body],
                        }
                    ).encode()
                )
            else:
                out.write(b"\t".join(delivery.body))
            out.write(b"\n")
            out.flush()
            (consumer.nack if nack else consumer.ack)(delivery)
            got += 1
        # Let the last acks leave before the socket closes.
        consumer.sock.setsockopt(client.zmq.LINGER, 2000)


@cli.command()
@click.argument("directory")
@click.argument("name")
@_errors_to_exit
def keygen(directory, name) -> None:
    """Write a CURVE key pair: DIRECTORY/NAME.key (public: give it to the other side) and
    DIRECTORY/NAME.key_secret (keep it: owner-only)."""
    from pzq.curve import keygen as make_keys

    public, secret = make_keys(directory, name)
    click.echo(f"public key: {public}\nsecret key: {secret}")


@cli.group("mqks")
def mqks_group() -> None:
    """Publish and consume through the MQKS gateway (one text line per request)."""


@mqks_group.command("publish")
@config_option
@click.option("--mqks-dsn", help="MQKS endpoint (default from config/env).")
@click.argument("event")
@click.argument("data", nargs=-1)
@_errors_to_exit
def mqks_publish(config_file, mqks_dsn, event, data) -> None:
    """Publish DATA (words joined by spaces, or each line of standard input) to EVENT, confirmed durable."""
    from pzq.clients.mqks import MqksClient

    endpoint = _resolve(config_file, mqks_dsn=mqks_dsn).mqks_dsn
    lines = [" ".join(data)] if data else [line.rstrip("\r\n") for line in sys.stdin]
    with MqksClient(endpoint) as mq:
        for line in lines:
            mq.publish(event, line)
    click.echo(f"{len(lines)} published", err=True)


@mqks_group.command("consume")
@config_option
@click.option("--mqks-dsn", help="MQKS endpoint (default from config/env).")
@click.option("-n", "--count", type=int, default=1, show_default=True, help="Messages to consume; 0 = until ^C.")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for each message.")
@click.argument("queue")
@click.argument("events", nargs=-1)
@_errors_to_exit
def mqks_consume(config_file, mqks_dsn, count, timeout, queue, events) -> None:
    """Consume COUNT messages of QUEUE (binding it to EVENTS if given); print msg_id, event, retry, data.

    Each message is acked once printed, and only one is held at a time (pzq's --prefetch=1), so that
    nothing beyond COUNT is taken from the queue or has its retry count raised."""
    from pzq.clients.mqks import MqksClient

    endpoint = _resolve(config_file, mqks_dsn=mqks_dsn).mqks_dsn
    got = 0
    with MqksClient(endpoint) as mq:
        consumer = mq.consume(queue, list(events), manual_ack=True, prefetch=1)
        while count == 0 or got < count:
            delivery = mq.receive(timeout)
            if delivery is None:
                click.echo(f"pzq: no message within {timeout} s after {got} received", err=True)
                sys.exit(1)
            click.echo(f"{delivery.msg_id}\t{delivery.event}\t{delivery.retry}\t{delivery.data}")
            got += 1
            if got == count:  # the last ack and the goodbye in one write: no next message is handed out
                mq.sock.sendall(
                    f"{consumer}-a ack {consumer} {delivery.msg_id}\n"
                    f"{consumer}-dc delete_consumer --confirm {consumer}\n".encode()
                )
                mq.wait_ok(f"{consumer}-dc")  # the acks before it are done once this is answered
                return
            mq.ack(consumer, delivery.msg_id)


@cli.group("dead-letters")
def dead_letters() -> None:
    """Inspect and requeue a queue's dead letters (through the running server's monitor socket)."""


@dead_letters.command("list")
@config_option
@click.option("--monitor-dsn", help="Monitor endpoint (default from config/env).")
@click.option("--limit", type=int, default=100, show_default=True)
@click.argument("queue", default="default")
@curve_options
@_errors_to_exit
def dead_letters_list(config_file, monitor_dsn, limit, queue, curve_client_key, curve_server_key) -> None:
    """List QUEUE's dead letters, oldest first, one JSON object per line."""
    endpoint = _resolve(config_file, monitor_dsn=monitor_dsn).monitor_dsn
    text = client.monitor_request(
        endpoint, f"DEADLETTERS {queue} {limit}", curve=_curve(curve_client_key, curve_server_key)
    )
    if text.startswith("error:"):
        _fail(text[len("error:") :].strip())
    letters = client.monitor_json(endpoint, text)
    if not isinstance(letters, list):
        raise ClientError(f"the answer from {endpoint} is not a list of dead letters: is a pzq monitor there?")
    for letter in letters:
        click.echo(json.dumps(letter))


@dead_letters.command("requeue")
@config_option
@click.option("--monitor-dsn", help="Monitor endpoint (default from config/env).")
@click.option("--all", "everything", is_flag=True, help="Requeue every dead letter of QUEUE.")
@click.argument("queue")
@click.argument("message_id", required=False)
@curve_options
@_errors_to_exit
def dead_letters_requeue(
    config_file, monitor_dsn, everything, queue, message_id, curve_client_key, curve_server_key
) -> None:
    """Move dead letter MESSAGE_ID (or --all) back to the end of QUEUE."""
    if bool(everything) == bool(message_id):
        _fail("give either a MESSAGE_ID or --all", 2)
    endpoint = _resolve(config_file, monitor_dsn=monitor_dsn).monitor_dsn
    text = client.monitor_request(
        endpoint,
        f"REQUEUE {queue} {'all' if everything else message_id}",
        curve=_curve(curve_client_key, curve_server_key),
    )
    if text.startswith("error:"):
        _fail(text[len("error:") :].strip())
    answer = client.monitor_json(endpoint, text)
    if not isinstance(answer, dict) or "requeued" not in answer:
        raise ClientError(f"the answer from {endpoint} is not pzq's: is a pzq monitor there?")
    click.echo(f"requeued {answer['requeued']}")


@cli.command("check")
@click.argument("database", default="./pzq-data")
@_errors_to_exit
def check_store(database) -> None:
    """Read every record of the store at DATABASE (read-only; a running server goes on) and say what is
    readable. Exit 0 if all of it is, 1 if not."""
    from pzq import check

    if not check.check(database, sys.stdout):
        _fail(f"{database}: some records cannot be read (see above); `pzq dump` copies out the rest")
    click.echo(f"{database}: every record is readable")


@cli.command("dump")
@click.argument("database", default="./pzq-data")
@click.argument("output")
@_errors_to_exit
def dump_store(database, output) -> None:
    """Copy every readable message, dead letter and set-aside record of DATABASE into OUTPUT, one JSON
    object per line (bytes as {"b64": ...}). Read-only; a running server goes on."""
    from pzq import check

    complete = check.dump(database, output, sys.stderr)
    click.echo(f"written to {output}" + ("" if complete else " (some records could not be read)"), err=True)
    if not complete:
        sys.exit(1)


def main() -> None:
    cli(prog_name="pzq")


# What each `pzq bench --protocol` reads: an option it does not read is refused, never silently ignored.
_NATIVE_BENCH = {
    *("count", "latency_count", "size", "window", "producers", "consumers", "rate", "paced_seconds", "runs"),
    *("preload", "transport", "hard_sync", "ceiling", "server_args", "json_path", "plot_path", "quiet"),
}
_BENCH_OPTIONS = {
    "pzq": _NATIVE_BENCH,
    "phpmq": _NATIVE_BENCH,
    "mqks": {"count", "runs", "size", "server_args", "json_path", "quiet"},
    "emqp": {"count", "concurrent", "broker", "server_args", "json_path", "quiet"},
    "spark": {"count", "runs", "batch", "size", "server_args", "json_path", "quiet", "spark_master"},
}
_BENCH_COUNT = {"pzq": 100_000, "phpmq": 100_000, "mqks": 10_000, "emqp": 5_000, "spark": 100_000}


@cli.command()
@click.option(
    "--protocol",
    type=click.Choice(list(_BENCH_OPTIONS)),
    default="pzq",
    show_default=True,
    help="What the clients speak: pzq (native, with the no-storage ceiling), phpmq (no ceiling, no send "
    "receipt), mqks (publish, consume, ack), emqp (jobs through a real eventmq JobManager), spark (the connector).",
)
@click.option(
    "--count",
    "--messages",
    "--jobs",
    "count",
    type=int,
    default=None,
    help="Messages per throughput phase (jobs for emqp).  [default: 100000; mqks 10000; emqp 5000]",
)
@click.option(
    "--latency-count", type=int, default=10_000, show_default=True, help="Messages of the window-1 (ack latency) phase."
)
@click.option("--size", type=int, default=100, show_default=True, help="Body bytes (pzq, phpmq: at least 16).")
@click.option("--window", type=int, default=100, show_default=True, help="Unacked messages per producer.")
@click.option("--producers", type=int, default=1, show_default=True)
@click.option("--consumers", type=int, default=1, show_default=True)
@click.option("--rate", type=float, default=5000, show_default=True, help="msg/s of the paced phase.")
@click.option("--paced-seconds", type=float, default=5, show_default=True)
@click.option("--runs", type=int, default=3, show_default=True, help="Full runs; the table shows medians.")
@click.option("--preload", type=int, default=0, help="Store N messages before the server starts (scale test).")
@click.option("--transport", type=click.Choice(["tcp", "ipc"]), default="tcp", show_default=True)
@click.option("--hard-sync/--no-hard-sync", default=True, show_default=True)
@click.option(
    "--ceiling/--no-ceiling",
    default=True,
    show_default=True,
    help="Also drive a no-storage pyzmq echo server with the same producer code.",
)
@click.option("--batch", type=int, default=100_000, show_default=True, help="spark: maxMessagesPerBatch.")
@click.option(
    "--spark-master",
    default="local[2]",
    show_default=True,
    help="spark: where the queries run (spark://HOST:PORT for a standalone cluster).",
)
@click.option("--concurrent", type=int, default=4, show_default=True, help="emqp: the JobManager's job processes.")
@click.option(
    "--broker",
    type=click.Choice(["pzq", "reference", "both"]),
    default="both",
    show_default=True,
    help="emqp: via whom.",
)
@click.option("--server-arg", "server_args", multiple=True, help="Extra argument for `pzq serve` (repeatable).")
@click.option("--json", "json_path", default="pzq-bench.json", show_default=True, help="Where to write JSON.")
@click.option("--plot", "plot_path", default=None, help="Write a latency distribution PNG here (matplotlib).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
@_errors_to_exit
def bench(
    ctx, protocol, json_path, plot_path, quiet, server_args, batch, concurrent, broker, spark_master, **options
) -> None:
    """Measure throughput and latency of a fresh local server (with the no-storage ceiling beside it for
    --protocol pzq); figures are printed and written to --json."""
    from pzq.bench import report

    flags = {param.name: param.opts[0] for param in ctx.command.params}
    given = {name for name in ctx.params if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    unused = sorted(flags[name] for name in given - _BENCH_OPTIONS[protocol] - {"protocol"})
    if unused:
        raise ConfigError(f"{', '.join(unused)}: not used by --protocol {protocol}")
    if options["count"] is None:
        options["count"] = _BENCH_COUNT[protocol]
    if protocol in ("mqks", "emqp", "spark"):
        result = _bench_other(protocol, options, batch, concurrent, broker, tuple(server_args), spark_master)
    else:
        result = _bench_native(protocol, options, server_args, quiet)
        click.echo(report.table(result))
    report.write_json(result, json_path)
    click.echo(f"\nJSON written to {json_path}")
    if plot_path:
        report.plot(result, plot_path)
        click.echo(f"latency plot written to {plot_path}")
    problems = report.lost_or_duplicated(result)
    if problems:
        _fail(f"messages were lost or duplicated ({'; '.join(problems[:3])})")


def _bench_native(protocol: str, options: dict, server_args, quiet: bool) -> dict:
    from pzq.bench import native

    if options["size"] < 16:
        raise ConfigError("--size: at least 16 bytes (the benchmark stamps each body)")
    if (
        min(
            options["count"],
            options["latency_count"],
            options["window"],
            options["producers"],
            options["consumers"],
            options["runs"],
        )
        < 1
    ):
        raise ConfigError("--count, --latency-count, --window, --producers, --consumers, --runs: at least 1")
    kind = "native" if protocol == "pzq" else protocol
    opts = native.BenchOptions(server_args=tuple(server_args), progress=not quiet, protocol=kind, **options)
    return native.bench(opts)


def _bench_other(
    protocol: str, options: dict, batch: int, concurrent: int, broker: str, server_args: tuple, master: str
) -> dict:
    count, runs, size = options["count"], options["runs"], options["size"]
    if min(count, runs, batch, concurrent) < 1 or size < 0:
        raise ConfigError("--count, --runs, --batch, --concurrent: at least 1; --size: at least 0")
    if protocol == "mqks":
        from pzq.bench import mqks

        return mqks.bench(mqks.MqksOptions(count, runs, size, server_args), click.echo)
    if protocol == "emqp":
        from pzq.bench import emqp

        return emqp.bench(emqp.EmqpOptions(count, concurrent, broker, server_args), click.echo)
    from pzq.bench import spark

    return spark.bench(spark.SparkOptions(count, runs, batch, size, server_args, master), click.echo)
