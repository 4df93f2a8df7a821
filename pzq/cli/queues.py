"""Commands on a running server's queues and clients, through its monitor socket: `pzq queue list|show|
peek|create|delete|purge|publish`, `pzq clients` and `pzq dead-letters delete` (the requests the web
console uses too)."""

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
from pzq.errors import ClientError, ExitCode
from pzq.logs import escape

MAX_BODY = 1 << 20  # what the monitor socket takes in one frame (its MAXMSGSIZE): past it, no answer comes


# What each request's answer must hold for the commands that read it (an answer from a peer that is not
# pzq, or is another program, gets one line, not a KeyError's traceback)
ANSWERS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "STATS": {"queues": dict},
    "CREATE": {"created": bool, "queue": str},
    "DELETE": {"messages": int, "dead_letters": int},
    "QUEUE": {"figures": dict, "name": str, "consumers": list, "consumers_total": int},
    "PEEK": {"messages": list, "more": bool},
    "DEAD": {"letters": list, "more": bool},
    "PURGE": {"purged": int, "more": bool},
    "PUBLISH": {"id": str},
    "CLIENTS": {"tables": list},
    "REQUEUE": {"requeued": int},
    "DELETEDEAD": {"deleted": int},
    "WHERE": {"shard": str, "shards": list, "partitions": int, "places": list, "held": list},
}


def checked(endpoint: str, words: list[str], answer: Any) -> Any:
    """``answer`` if it has the shape ``words``' request is answered with (ANSWERS; DEADLETTERS: a list);
    ClientError, naming the endpoint, if not."""
    wanted = ANSWERS.get(words[0])
    if words[0] == "DEADLETTERS":
        fits = isinstance(answer, list)
    else:
        fits = wanted is None or (
            isinstance(answer, dict) and all(isinstance(answer.get(k), kind) for k, kind in wanted.items())
        )
    if not fits:
        raise ClientError(f"the answer to {words[0]} from {endpoint} is not pzq's: is a pzq monitor there?")
    return answer


class Ask:
    """A command's monitor requests: ``ask(words, body=None, missing="")`` asks the server meant, ending
    the command in one line on an ``error:`` answer (exit 4 for a queue that is not there, 5 for no
    right; ``missing``: added to the line that says the queue does not exist); ``at`` asks another."""

    def __init__(self, endpoint: str, config_file: str | None, timeout: float, keys: tuple[str, str] | None):
        self.endpoint, self.config_file, self.timeout, self.keys = endpoint, config_file, timeout, keys

    def at(self, endpoint: str, words: list[str]) -> Any:
        """The answer of the monitor at ``endpoint`` (AdminRefused and ClientError raised, not ended)."""
        return checked(endpoint, words, admin_request(endpoint, words, timeout_s=self.timeout, curve=self.keys))

    def __call__(self, words: list[str], body: bytes | None = None, missing: str = "") -> Any:
        try:
            answer = admin_request(self.endpoint, words, body, timeout_s=self.timeout, curve=self.keys)
            return checked(self.endpoint, words, answer)
        except AdminRefused as exc:
            if exc.no_queue:
                fail(str(exc) + missing, ExitCode.NOT_FOUND)
            fail(str(exc), refusal_code(str(exc)))


def monitor_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--config, --monitor-dsn, --timeout and the CURVE options, as `pzq monitor` has them; the command
    is called with ``ask(words, body=None, missing="")`` in their place (``missing``: added to the line
    that says the queue does not exist)."""

    @config_option
    @click.option("--monitor-dsn", help="Monitor endpoint.  [default: as `pzq monitor` finds it]")
    @answer_timeout_option
    @curve_options
    @errors_to_exit
    @functools.wraps(func)
    def wrapper(config_file, monitor_dsn, timeout, curve_client_key, curve_server_key, **kwargs: Any) -> Any:
        endpoint = monitor_endpoint(config_file, monitor_dsn)
        ask = Ask(endpoint, config_file, timeout, curve(curve_client_key, curve_server_key))

        try:
            return func(ask=ask, **kwargs)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            # (``checked`` saw the answer's top; a row inside it that is not a row is read only here)
            raise ClientError(f"the answer from {endpoint} is not pzq's ({exc!r}): is a pzq monitor there?") from exc

    return wrapper


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print the server's JSON answer as it is.")(func)


@click.group("queue")
def queue_group() -> None:
    """List, create and delete queues; look at one, peek at its messages, purge it, publish to it
    (through the running server's monitor socket)."""


# The columns of `pzq queue list`: (header with its unit, the STATS row's key)
COLUMNS = (
    ("depth (msg)", "depth"),
    ("in flight (msg)", "inflight"),
    ("dead (msg)", "dead_letters"),
    ("in (msg/s)", "in_per_s"),
    ("out (msg/s)", "out_per_s"),
    ("size (bytes)", "bytes"),
)
SORTS = {"name": None, "depth": "depth", "inflight": "inflight", "dead": "dead_letters", "bytes": "bytes"}


@queue_group.command("list")
@click.option(
    "--sort",
    type=click.Choice(sorted(SORTS)),
    default="name",
    show_default=True,
    help="Order of the rows (the figures: biggest first).",
)
@click.option(
    "-n", "--limit", type=click.IntRange(0), default=0, show_default=True, help="Rows at most, after --sort; 0 = all."
)
@json_option
@monitor_options
def queue_list(ask, sort, limit, as_json) -> None:
    """One row per queue: its depth, messages in flight, dead letters, rates (messages a second over the
    last ten seconds: in = stored, out = acked, dead-lettered, expired or purged; "-" from a server that
    does not report them) and size, from one STATS answer. With many queues, `--sort depth -n 20` shows
    the 20 deepest; --json prints the rows as a JSON list (numbers as numbers, null for a missing rate)."""
    queues = ask(["STATS"]).get("queues") or {}
    key = SORTS[sort]
    names = sorted(queues) if key is None else sorted(queues, key=lambda name: (-queues[name].get(key, 0), name))
    shown = names[:limit] if limit else names
    rows = [{"name": name, **_row(queues[name])} for name in shown]
    if as_json:
        click.echo(json.dumps(rows))
    elif not rows:
        click.echo("no queues on this server")
    else:
        click.echo("\n".join(_table(rows)))  # (one write: a line each took 100,000 queues 3 s)
    if len(shown) < len(names):
        click.echo(f"{len(shown)} of {len(names)} queues shown (--limit {limit})", err=True)


def _row(figures: dict) -> dict:
    row = {column: figures.get(column) for _, column in COLUMNS}
    return {k: v if isinstance(v, (int, float)) else None for k, v in row.items()}


def _table(rows: list[dict]) -> list[str]:
    """The rows aligned: the name left, the figures right, each column as wide as its widest cell."""
    headers = ["name", *(header for header, _ in COLUMNS)]
    cells = [[escape(row["name"]), *(_cell(row[column]) for _, column in COLUMNS)] for row in rows]
    widths = [max(len(header), *(len(line[i]) for line in cells)) for i, header in enumerate(headers)]

    def line(values: list[str]) -> str:
        first = values[0].ljust(widths[0])
        return "  ".join([first, *(v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True))]).rstrip()

    return [line(headers), *(line(values) for values in cells)]


def _cell(value: int | float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"


@queue_group.command("delete")
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (needed when not on a terminal).")
@monitor_options
def queue_delete(ask, name, yes) -> None:
    """Delete queue NAME with its messages (those consumers hold too) and dead letters, for good. Asks
    first on a terminal; without one, --yes is needed (exit 11 otherwise). The queue is gone at once;
    its records are deleted over the server's next turns."""
    if not yes:
        figures = ask(["QUEUE", name])["figures"]  # (a missing queue: one line, exit 4, before asking anything)
        what = f"queue {name!r} with {figures['depth']:,} message(s) and {figures['dead_letters']:,} dead letter(s)"
        if not sys.stdin.isatty():
            fail(f"not deleting {what}: there is no terminal to ask on; give --yes", ExitCode.NOT_CONFIRMED)
        if not click.confirm(f"Delete {what}, for good?", default=False, err=True):
            fail(f"not deleted: queue {name!r}", ExitCode.NOT_CONFIRMED)
    answer = ask(["DELETE", name])
    click.echo(
        f"deleted queue {name!r} with {answer['messages']:,} message(s) and {answer['dead_letters']:,} dead letter(s)"
    )


@queue_group.command("show")
@click.argument("name")
@json_option
@monitor_options
def queue_show(ask, name, as_json) -> None:
    """NAME's figures and its consumers (protocol, client, address, connected since, messages held)."""
    answer = ask(["QUEUE", name])
    if as_json:
        click.echo(json.dumps(answer))
        return
    f = answer["figures"]
    click.echo(f"queue {escape(answer['name'])}")
    click.echo(
        f"depth {f['depth']}  inflight {f['inflight']}  dead {f['dead_letters']}  bytes {f['bytes']}  "
        f"oldest {f['oldest_age_s']:.1f} s"
    )
    click.echo(f"consumers: {answer['consumers_total']}")
    for c in answer["consumers"]:
        since = _when(c["connected_us"])
        client, address = escape(str(c["client"])), escape(c["address"] or "-")
        click.echo(f"  {c['protocol']:<7} {client:<40} {address:<22} {since:<20} held {c['held']}")


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
@click.option(
    "--create",
    is_flag=True,
    help="Create NAME first, as `pzq queue create` does (explicit: a queue a client made becomes explicit).",
)
@monitor_options
def queue_publish(ask, name, body, create) -> None:
    """Store BODY (a UTF-8 text; "-" reads the body from standard input) as one message of queue NAME;
    prints its id. NAME must exist, or --create makes it (as `pzq queue create`: explicit, which needs
    the manage right where permissions apply): a typo must not make a queue nobody reads."""
    data = sys.stdin.buffer.read(MAX_BODY + 1) if body == "-" else body.encode("utf-8")
    if len(data) > MAX_BODY:
        fail(f"the body is over {MAX_BODY} bytes, the most the monitor socket takes in one request")
    if create:
        ask(["CREATE", name])
    hint = f": publish with --create, or `pzq queue create {name}` first"
    click.echo(ask(["PUBLISH", name], data, missing=hint)["id"])


@click.command("clients")
@click.option("-n", "limit", type=click.IntRange(1), default=200, show_default=True, help="Rows of each list at most.")
@click.option(
    "--offset", type=click.IntRange(0), default=0, show_default=True, help="Skip this many rows of each list."
)
@json_option
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
            click.echo("  " + "\t".join(escape(str(cell)) for cell in row))
    if not answer["tables"]:
        click.echo("no lists: the gateways that run list no clients")


@click.command("delete")
@click.argument("queue")
@click.argument("message_id", metavar="[ID]", required=False)
@click.option("--all", "everything", is_flag=True, help="Delete QUEUE's dead letters (1,000 a run, the oldest).")
@monitor_options
def dead_letters_delete(ask, queue, message_id, everything) -> None:
    """Delete dead letter ID of QUEUE for good, or --all of them (1,000 a run: it says how many remain).
    An ID that is not there (requeued or deleted already) exits 4. (`delete QUEUE all` still works.)"""
    which = dead_letter_choice(message_id, everything)
    answer = ask(["DELETEDEAD", queue, which])
    settled(ask, queue, which, answer["deleted"], answer.get("left"), "deleted")


def dead_letter_choice(message_id: str | None, everything: bool) -> str:
    """The dead letters a command names: ``all`` (--all) or one id; the old spelling, ``all`` as the ID,
    still works with a line that says so."""
    if message_id == "all" and not everything:
        click.echo("pzq: note: `... QUEUE all` is deprecated: write `... QUEUE --all`", err=True)
        return "all"
    if message_id is None or everything:
        if everything == bool(message_id):
            fail("give either an ID or --all", ExitCode.USAGE)
        return "all"
    return message_id


def settled(ask: Callable[..., Any], queue: str, which: str, done: int, left: int | None, verb: str) -> None:
    """Say what a requeue or delete of dead letters did: how many, how many remain past its cap (and how
    to go on), or, when it did nothing, why (exit 4: the queue has none, or the id is not there)."""
    if not done:
        ask(["QUEUE", queue])  # (the server takes an unknown queue's "all" as none: a typo says so here)
        if which == "all":
            fail(f"queue {queue!r} has no dead letters: none {verb}", ExitCode.NOT_FOUND)
        fail(
            f"dead letter {which} is not in queue {queue!r} (requeued or deleted already?): none {verb}",
            ExitCode.NOT_FOUND,
        )
    click.echo(f"{verb} {done}")
    if which == "all" and left:
        click.echo(f"{left:,} dead letter(s) remain (1,000 a run): run it again to go on", err=True)


def _when(us: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(us / 1e6)) if us else "-"
