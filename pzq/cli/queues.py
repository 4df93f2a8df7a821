"""Commands on a running server's queues and clients, through its monitor socket: `pzq queue show|peek|
purge|publish`, `pzq clients` and `pzq dead-letters delete` (the requests the web console uses too)."""

from __future__ import annotations

import base64
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from pzq.cli.common import (
    answer_timeout_option,
    config_option,
    curve,
    curve_options,
    errors_to_exit,
    fail,
    monitor_endpoint,
    refusal_code,
)
from pzq.clients.admin import AdminRefused, admin_request
from pzq.errors import ExitCode

MAX_BODY = 1 << 20  # what the monitor socket takes in one frame (its MAXMSGSIZE): past it, no answer comes


def monitor_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--config, --monitor-dsn, --timeout and the CURVE options, as `pzq monitor` has them; the command
    is called with ``ask(words, body=None)`` in their place."""

    @config_option
    @click.option("--monitor-dsn", help="Monitor endpoint.  [default: as `pzq monitor` finds it]")
    @answer_timeout_option
    @curve_options
    @errors_to_exit
    @functools.wraps(func)
    def wrapper(config_file, monitor_dsn, timeout, curve_client_key, curve_server_key, **kwargs: Any) -> Any:
        endpoint = monitor_endpoint(config_file, monitor_dsn)
        keys = curve(curve_client_key, curve_server_key)

        def ask(words: list[str], body: bytes | None = None) -> Any:
            try:
                return admin_request(endpoint, words, body, timeout_s=timeout, curve=keys)
            except AdminRefused as exc:  # one line; exit 4 for a queue that is not there, 5 for no right
                fail(str(exc), ExitCode.NOT_FOUND if exc.no_queue else refusal_code(str(exc)))

        return func(ask=ask, **kwargs)

    return wrapper


def _json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print the server's JSON answer as it is.")(func)


@click.group("queue")
def queue_group() -> None:
    """Look at a queue, peek at its messages, purge it, publish to it (through the running server)."""


@queue_group.command("show")
@click.argument("name")
@_json_option
@monitor_options
def queue_show(ask, name, as_json) -> None:
    """NAME's figures and its consumers (protocol, client, address, connected since, messages held)."""
    answer = ask(["QUEUE", name])
    if as_json:
        click.echo(json.dumps(answer))
        return
    f = answer["figures"]
    click.echo(f"queue {answer['name']}")
    click.echo(
        f"depth {f['depth']}  inflight {f['inflight']}  dead {f['dead_letters']}  bytes {f['bytes']}  "
        f"oldest {f['oldest_age_s']:.1f} s"
    )
    click.echo(f"consumers: {answer['consumers_total']}")
    for c in answer["consumers"]:
        since = _when(c["connected_us"])
        click.echo(f"  {c['protocol']:<7} {c['client']:<40} {c['address'] or '-':<22} {since:<20} held {c['held']}")


@queue_group.command("peek")
@click.argument("name")
@click.option("--dead", is_flag=True, help="Peek at the dead letters instead of the ready messages.")
@click.option("-n", "limit", type=click.IntRange(1), default=50, show_default=True, help="Rows at most (1000 a page).")
@click.option("--after", "after", metavar="ID", help="Start after this id (a page's last).  [default: the head]")
@monitor_options
def queue_peek(ask, name, dead, limit, after) -> None:
    """The first ready messages (or --dead letters) of NAME, one JSON object per line, each with the
    first 1024 bytes of its body as "head" (UTF-8, bad bytes replaced). Read-only."""
    answer = ask(["DEAD" if dead else "PEEK", name, str(limit), *([after] if after else [])])
    for row in answer["letters" if dead else "messages"]:
        head = base64.b64decode(row.pop("head_b64"))
        click.echo(json.dumps({**row, "head": head.decode("utf-8", "replace")}))
    if answer["more"] and answer.get("next_after"):
        click.echo(f"more: --after {answer['next_after']}", err=True)


@queue_group.command("purge")
@click.argument("name")
@monitor_options
def queue_purge(ask, name) -> None:
    """Delete NAME's ready messages (what consumers hold stays with them); a big queue is purged over
    the server's next turns."""
    answer = ask(["PURGE", name])
    click.echo(f"purged {answer['purged']}" + ("; the rest follows over the next turns" if answer["more"] else ""))


@queue_group.command("publish")
@click.argument("name")
@click.argument("body")
@monitor_options
def queue_publish(ask, name, body) -> None:
    """Store BODY (a UTF-8 text; "-" reads the body from standard input) as one message of queue NAME,
    which must exist; prints its id."""
    data = sys.stdin.buffer.read(MAX_BODY + 1) if body == "-" else body.encode("utf-8")
    if len(data) > MAX_BODY:
        fail(f"the body is over {MAX_BODY} bytes, the most the monitor socket takes in one request")
    click.echo(ask(["PUBLISH", name], data)["id"])


@click.command("clients")
@click.option("-n", "limit", type=click.IntRange(1), default=200, show_default=True, help="Rows of each list at most.")
@click.option(
    "--offset", type=click.IntRange(0), default=0, show_default=True, help="Skip this many rows of each list."
)
@_json_option
@monitor_options
def clients(ask, limit, offset, as_json) -> None:
    """The server's clients, each gateway's lists (connections with their peer address and connected
    since, workers, schedules), a page of -n rows from --offset."""
    answer = ask(["CLIENTS", str(limit), str(offset)])
    if as_json:
        click.echo(json.dumps(answer))
        return
    for table in answer["tables"]:
        shown = f"{table['offset'] + 1}-{table['offset'] + len(table['rows'])}" if table["rows"] else "none"
        click.echo(f"{table['gateway']}: {table['title']} ({shown} of {table['total']})")
        click.echo("  " + "\t".join(table["columns"]))
        for row in table["rows"]:
            click.echo("  " + "\t".join(str(cell) for cell in row))
    if not answer["tables"]:
        click.echo("no lists: the gateways that run list no clients")


@click.command("delete")
@click.argument("queue")
@click.argument("which", metavar="ID|all")
@monitor_options
def dead_letters_delete(ask, queue, which) -> None:
    """Delete dead letter ID of QUEUE for good, or up to 1000 of them (all)."""
    click.echo(f"deleted {ask(['DELETEDEAD', queue, which])['deleted']}")


def _when(us: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(us / 1e6)) if us else "-"
