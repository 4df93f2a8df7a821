"""Commands about keys and the store: keygen, dead-letters list/requeue (through the running server),
check and dump (read-only, beside a running server)."""

from __future__ import annotations

import json
import sys

import click

from pzq.cli.common import errors_to_exit, fail
from pzq.cli.queues import dead_letter_choice, monitor_options, settled
from pzq.errors import ExitCode


@click.command()
@click.argument("directory")
@click.argument("name")
@errors_to_exit
def keygen(directory, name) -> None:
    """Write a CURVE key pair: DIRECTORY/NAME.key (public: give it to the other side) and
    DIRECTORY/NAME.key_secret (keep it: owner-only)."""
    from pzq.curve_keys import keygen as make_keys

    public, secret = make_keys(directory, name)
    click.echo(f"public key: {public}\nsecret key: {secret}")


@click.group("dead-letters")
def dead_letters() -> None:
    """List, requeue and delete a queue's dead letters (through the running server's monitor socket):
    one dead letter by its ID, or --all of them."""


@dead_letters.command("list")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True, help="Dead letters to list at most.")
@click.argument("queue", default="default")
@monitor_options
def dead_letters_list(ask, limit, queue) -> None:
    """List QUEUE's dead letters, oldest first, one JSON object per line (a line on standard error when
    it has none; exit 4 when there is no such queue)."""
    letters = ask(["DEADLETTERS", queue, str(limit)])  # (a list, or one line: queues.checked)
    if not letters:
        ask(["QUEUE", queue], missing="")  # (the server lists an unknown queue as empty: a typo says so here)
        click.echo(f"queue {queue!r} has no dead letters", err=True)
    for letter in letters:
        click.echo(json.dumps(letter))


@dead_letters.command("requeue")
@click.option("--all", "everything", is_flag=True, help="Requeue QUEUE's dead letters (1,000 a run, the oldest).")
@click.argument("queue")
@click.argument("message_id", metavar="[ID]", required=False)
@monitor_options
def dead_letters_requeue(ask, everything, queue, message_id) -> None:
    """Move dead letter ID (or --all: 1,000 a run, it says how many remain) back to the end of QUEUE.
    Nothing to requeue (none, or an ID requeued or deleted already) exits 4."""
    which = dead_letter_choice(message_id, everything)
    answer = ask(["REQUEUE", queue, which])
    settled(ask, queue, which, answer["requeued"], answer.get("left"), "requeued")


@click.command("check")
@click.argument("database", default="./pzq-data")
@errors_to_exit
def check_store(database) -> None:
    """Read every record of the store at DATABASE (read-only; a running server goes on) and say what is
    readable; DATABASE may be a backup (`pzq backup`): this is how one is verified. Exit 0 if all of it
    is, 1 if some records are not, 3 if the store cannot be read as one (as `pzq serve` exits on it), 2
    if this user may not read it, 6 if its filesystem is too full to read it (a full disk is not damage)."""
    from pzq import check

    if not check.check(database, sys.stdout):
        fail(f"{database}: some records cannot be read (see above); `pzq dump` copies out the rest")
    click.echo(f"{database}: every record is readable")


@click.command("dump")
@click.argument("database", default="./pzq-data")
@click.argument("output")
@errors_to_exit
def dump_store(database, output) -> None:
    """Copy every readable message, dead letter and set-aside record of DATABASE into OUTPUT, one JSON
    object per line (bytes as {"b64": ...}). Read-only; a running server goes on. Exit 6 if OUTPUT's
    filesystem fills (what is written so far is kept)."""
    from pzq import check

    complete = check.dump(database, output, sys.stderr)
    click.echo(f"written to {output}" + ("" if complete else " (some records could not be read)"), err=True)
    if not complete:
        sys.exit(ExitCode.FAILURE)
