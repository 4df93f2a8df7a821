"""Commands about keys and the store: keygen, dead-letters list/requeue (through the running server),
check and dump (read-only, beside a running server)."""

from __future__ import annotations

import json
import sys

import click

from pzq.cli.common import config_option, curve, curve_options, errors_to_exit, fail, monitor_endpoint, refusal_code
from pzq.clients import native as client
from pzq.errors import ClientError, ExitCode


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
    """Inspect and requeue a queue's dead letters (through the running server's monitor socket)."""


@dead_letters.command("list")
@config_option
@click.option("--monitor-dsn", help="Monitor endpoint.  [default: as `pzq monitor` finds it]")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True, help="Dead letters to list at most.")
@click.argument("queue", default="default")
@curve_options
@errors_to_exit
def dead_letters_list(config_file, monitor_dsn, limit, queue, curve_client_key, curve_server_key) -> None:
    """List QUEUE's dead letters, oldest first, one JSON object per line."""
    endpoint = monitor_endpoint(config_file, monitor_dsn)
    text = client.monitor_request(
        endpoint, f"DEADLETTERS {queue} {limit}", curve=curve(curve_client_key, curve_server_key)
    )
    if text.startswith("error:"):
        fail(text[len("error:") :].strip(), refusal_code(text[len("error:") :].strip()))
    letters = client.monitor_json(endpoint, text)
    if not isinstance(letters, list):
        raise ClientError(f"the answer from {endpoint} is not a list of dead letters: is a pzq monitor there?")
    if not letters:
        _must_exist(endpoint, queue, curve(curve_client_key, curve_server_key))
    for letter in letters:
        click.echo(json.dumps(letter))


@dead_letters.command("requeue")
@config_option
@click.option("--monitor-dsn", help="Monitor endpoint.  [default: as `pzq monitor` finds it]")
@click.option("--all", "everything", is_flag=True, help="Requeue every dead letter of QUEUE.")
@click.argument("queue")
@click.argument("message_id", required=False)
@curve_options
@errors_to_exit
def dead_letters_requeue(
    config_file, monitor_dsn, everything, queue, message_id, curve_client_key, curve_server_key
) -> None:
    """Move dead letter MESSAGE_ID (or --all) back to the end of QUEUE."""
    if bool(everything) == bool(message_id):
        fail("give either a MESSAGE_ID or --all", ExitCode.USAGE)
    endpoint = monitor_endpoint(config_file, monitor_dsn)
    text = client.monitor_request(
        endpoint,
        f"REQUEUE {queue} {'all' if everything else message_id}",
        curve=curve(curve_client_key, curve_server_key),
    )
    if text.startswith("error:"):
        fail(text[len("error:") :].strip(), refusal_code(text[len("error:") :].strip()))
    answer = client.monitor_json(endpoint, text)
    if not isinstance(answer, dict) or "requeued" not in answer:
        raise ClientError(f"the answer from {endpoint} is not pzq's: is a pzq monitor there?")
    if not answer["requeued"]:
        _must_exist(endpoint, queue, curve(curve_client_key, curve_server_key))
    click.echo(f"requeued {answer['requeued']}")


def _must_exist(endpoint: str, queue: str, keys: tuple[str, str] | None) -> None:
    """Exit NOT_FOUND if ``queue`` is not one of the server's: the server answers an unknown queue as
    an empty one (no dead letters), which hides a typo."""
    if queue not in client.stats(endpoint, curve=keys)["queues"]:
        fail(f"queue {queue!r} does not exist on the server at {endpoint}", ExitCode.NOT_FOUND)


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
