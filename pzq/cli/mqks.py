"""The MQKS clients' commands: `pzq mqks publish` and `pzq mqks consume`, through the MQKS gateway."""

from __future__ import annotations

import os
import sys

import click

from pzq.cli.common import (
    Duration,
    config_option,
    duration_help,
    errors_to_exit,
    fail,
    from_settings,
    monitor_endpoint,
    resolve,
)
from pzq.clients.admin import admin_request
from pzq.config import format_duration
from pzq.errors import ClientError, ExitCode


@click.group("mqks")
def mqks_group() -> None:
    """Publish and consume through the MQKS gateway (one text line per request)."""


@mqks_group.command("publish")
@config_option
@click.option("--mqks-dsn", help="MQKS endpoint." + from_settings("mqks_dsn"))
@click.option(
    "--monitor-dsn",
    help="The same server's monitor endpoint, asked which queues are bound to EVENT.  "
    "[default: the configured one, unless --mqks-dsn names another server]",
)
@click.option(
    "--allow-unrouted",
    is_flag=True,
    help="Publish even when no queue is bound to EVENT (MQKS drops such a message), exit 0.",
)
@click.argument("event")
@click.argument("data", nargs=-1)
@errors_to_exit
def mqks_publish(config_file, mqks_dsn, monitor_dsn, allow_unrouted, event, data) -> None:
    """Publish DATA (words joined by spaces, or each line of standard input) to EVENT, confirmed durable.

    MQKS copies a message to every queue bound to its event and drops it when there is none; so the
    server's monitor is asked first, and with no queue bound nothing is published (as RabbitMQ's
    mandatory flag returns such a message): one line, exit 12. When no monitor answers, it is published
    and the line says that whether a queue is bound is not known."""
    from pzq.clients.mqks import MqksClient

    if not event or any(c.isspace() for c in event):
        fail(f"an MQKS event is one word without spaces, got {event!r}", ExitCode.USAGE)
    endpoint = resolve(config_file, mqks_dsn=mqks_dsn).mqks_dsn
    lines = [" ".join(data)] if data else [line.rstrip("\r\n") for line in sys.stdin]
    # (the configured monitor is the configured MQKS endpoint's server; another --mqks-dsn may be another's)
    monitor_at = monitor_dsn or (None if mqks_dsn else monitor_endpoint(config_file, None))
    bound = _bound(monitor_at, event)
    if bound == 0 and not allow_unrouted:
        fail(
            f"no queue is bound to event {event!r}: nothing published (MQKS drops such a message; bind one: "
            f"pzq mqks consume QUEUE {event}, or publish anyway with --allow-unrouted)",
            ExitCode.UNROUTED,
        )
    with MqksClient(endpoint) as mq:
        for line in lines:
            mq.publish(event, line)
    if bound is None:
        unknown = f"no monitor answered at {monitor_at}" if monitor_at else "give --monitor-dsn to know"
        click.echo(f"{len(lines)} published (whether a queue is bound to {event!r} is not known: {unknown})", err=True)
    elif bound == 0:
        click.echo(f"{len(lines)} published and dropped: no queue is bound to {event!r} (--allow-unrouted)", err=True)
    else:
        click.echo(f"{len(lines)} published to {bound} queue(s)", err=True)


def _bound(monitor_at: str | None, event: str) -> int | None:
    """How many queues are bound to ``event`` (the monitor's ROUTES, answered in the turn it is asked,
    from the gateway's index), or None when no monitor answers: within 2 s, at once when there is no
    socket file. (Counting `mqks.unrouted_total` in STATS before and after took two whole STATS, seconds
    with 100,000 queues, and counted other clients' unrouted publishes as this one's.)"""
    if monitor_at is None or monitor_at.startswith("ipc://") and not os.path.exists(monitor_at[len("ipc://") :]):
        return None
    try:
        answer = admin_request(monitor_at, ["ROUTES", event], timeout_s=2)
    except ClientError:  # (no answer, not pzq, or a pzq without ROUTES: as if none were asked)
        return None
    total = answer.get("total") if isinstance(answer, dict) else None
    return total if isinstance(total, int) else None


@mqks_group.command("consume")
@config_option
@click.option("--mqks-dsn", help="MQKS endpoint." + from_settings("mqks_dsn"))
@click.option(
    "-n", "--count", type=click.IntRange(0), default=1, show_default=True, help="Messages to consume; 0 = until ^C."
)
@click.option(
    "--timeout",
    type=Duration(),
    default="10s",
    metavar="DURATION",
    show_default=True,
    help=duration_help("Wait for each message."),
)
@click.argument("queue")
@click.argument("events", nargs=-1)
@errors_to_exit
def mqks_consume(config_file, mqks_dsn, count, timeout, queue, events) -> None:
    """Consume COUNT messages of QUEUE (binding it to EVENTS if given); print msg_id, event, retry, data.

    Each message is acked once printed, and only one is held at a time (pzq's --prefetch=1), so that
    nothing beyond COUNT is taken from the queue or has its retry count raised."""
    from pzq.clients.mqks import MqksClient

    endpoint = resolve(config_file, mqks_dsn=mqks_dsn).mqks_dsn
    got = 0
    with MqksClient(endpoint) as mq:
        consumer = mq.consume(queue, list(events), manual_ack=True, prefetch=1)
        while count == 0 or got < count:
            delivery = mq.receive(timeout)
            if delivery is None:
                fail(f"no message came within {format_duration(timeout)} ({got} received)", ExitCode.NO_MESSAGE)
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
