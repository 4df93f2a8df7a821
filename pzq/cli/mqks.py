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
from pzq.clients import native as client
from pzq.config import format_duration
from pzq.errors import ClientError, ExitCode


@click.group("mqks")
def mqks_group() -> None:
    """Publish and consume through the MQKS gateway (one text line per request)."""


@mqks_group.command("publish")
@config_option
@click.option("--mqks-dsn", help="MQKS endpoint." + from_settings("mqks_dsn"))
@click.argument("event")
@click.argument("data", nargs=-1)
@errors_to_exit
def mqks_publish(config_file, mqks_dsn, event, data) -> None:
    """Publish DATA (words joined by spaces, or each line of standard input) to EVENT, confirmed durable."""
    from pzq.clients.mqks import MqksClient

    endpoint = resolve(config_file, mqks_dsn=mqks_dsn).mqks_dsn
    lines = [" ".join(data)] if data else [line.rstrip("\r\n") for line in sys.stdin]
    # MQKS answers a publish nothing is bound to as any other (the message is dropped, as the reference
    # does): the server's unrouted count says so, where its monitor is the configured server's own.
    monitor_at = None if mqks_dsn else monitor_endpoint(config_file, None)
    before = _unrouted(monitor_at)
    with MqksClient(endpoint) as mq:
        for line in lines:
            mq.publish(event, line)
    after = _unrouted(monitor_at)
    dropped = min(len(lines), after - before) if before is not None and after is not None else 0
    if dropped:
        click.echo(
            f"{len(lines)} published; {'none' if dropped == len(lines) else f'{dropped} of them'} stored: no queue "
            f"is bound to {event!r}, and MQKS drops such messages (bind one: pzq mqks consume QUEUE {event})",
            err=True,
        )
    else:
        click.echo(f"{len(lines)} published", err=True)


def _unrouted(monitor_at: str | None) -> int | None:
    """The MQKS publishes nothing was bound to so far, or None if the monitor does not answer within 3 s
    (a second was too short for a busy machine: the publish was then said to be stored)."""
    if monitor_at is None or monitor_at.startswith("ipc://") and not os.path.exists(monitor_at[len("ipc://") :]):
        return None
    try:
        figures = client.stats(monitor_at, timeout_s=3)
    except ClientError:
        return None
    mqks = figures.get("mqks")
    return (
        mqks.get("unrouted_total") if isinstance(mqks, dict) and isinstance(mqks.get("unrouted_total"), int) else None
    )


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
