"""The queue commands that know shards: `pzq queue where` (one server's WHERE answer) and `pzq queue
create [--partitions K]` (sent to every shard of the list; docs/operations.md, Shards)."""

from __future__ import annotations

import json
import time

import click

from pzq import shards
from pzq.cli.common import fail, refusal_code, resolve
from pzq.cli.queues import Ask, json_option, monitor_options
from pzq.clients.admin import AdminRefused
from pzq.errors import ClientError, ConfigError, ExitCode
from pzq.logs import escape

PLACE_WAIT_S = 5.0  # how long CREATE NAME K waits while etcd places the queue (a few ms when it is there)


@click.command("where")
@click.argument("name")
@click.option(
    "--cluster",
    type=click.Path(exists=True, dir_okay=False),
    help="Ask every shard of this shard list (its monitors), not one server.  [default: one server]",
)
@json_option
@monitor_options
def queue_where(ask: Ask, name: str, cluster: str | None, as_json: bool) -> None:
    """Where queue NAME lives, as the server asked says: its shard (if it is one), the partitions it keeps
    for NAME, where the shard list places them, and the queues of NAME (NAME and NAME#i) it holds with
    their depths. --json prints the server's answer (the API's WHERE answer) as it is. With --cluster,
    every shard of the list is asked and each says what it holds (--json: {shard: its answer, or
    {"error": why}}); a shard that does not answer makes the command exit 1, naming it."""
    if cluster is None:
        answer = ask(["WHERE", name])
        click.echo(json.dumps(answer) if as_json else "\n".join(where_lines(name, answer)))
        return
    answers: dict[str, dict] = {}
    for shard, endpoint in _monitors(shards.load(cluster)):
        try:
            answers[shard] = _where_as(ask, shard, endpoint, name)
        except ClientError as exc:  # (AdminRefused too: a peer that is not a pzq of this release)
            answers[shard] = {"error": str(exc)}
    click.echo(json.dumps(answers) if as_json else "\n".join(cluster_lines(name, answers)))
    silent = [shard for shard, answer in answers.items() if "error" in answer]
    if silent:
        fail(f"queue {name!r}: no answer from {', '.join(silent)}: what they hold is not known", ExitCode.FAILURE)


def _where_as(ask: Ask, shard: str, endpoint: str, name: str) -> dict:
    """The WHERE answer of the list's entry ``shard`` at ``endpoint``; ClientError if the server there
    says it is another shard (an entry copied from another's: what it says is not ``shard``'s)."""
    answer = ask.at(endpoint, ["WHERE", name])
    if shard and answer["shard"] and answer["shard"] != shard:
        raise ClientError(f"the list's entry {shard!r} reaches {endpoint}, which is shard {answer['shard']!r}")
    return answer


def cluster_lines(name: str, answers: dict[str, dict]) -> list[str]:
    """`pzq queue where --cluster`'s lines: the placement once (the largest count any shard keeps, as the
    clients take it), then what each shard holds."""
    heard = [answer for answer in answers.values() if "error" not in answer]
    count = max((int(answer["partitions"]) for answer in heard), default=0)
    lines = [f"queue {escape(name)}: {count} partitions" if count > 1 else f"queue {escape(name)}: no partitions kept"]
    places = [answer["places"] for answer in heard if answer["partitions"] == count and answer["places"]]
    placed: list = places[0] if places else []
    if placed:
        lines.append("placed (queue -> shard):")
        lines.extend(f"  {escape(str(queue))} -> {escape(str(home))}" for queue, home in placed)
    lines.append("held (queue: depth in messages):")
    for shard, answer in answers.items():
        if "error" in answer:
            lines.append(f"  shard {escape(shard)}: no answer ({escape(answer['error'])})")
            continue
        held = ", ".join(f"{escape(str(queue))}: {int(depth):,}" for queue, depth in answer["held"]) or "none"
        lines.append(f"  shard {escape(shard)}: {held}")
    return lines


def where_lines(name: str, answer: dict) -> list[str]:
    """`pzq queue where`'s lines for one server's WHERE ``answer``."""
    shard, count = answer["shard"], answer["partitions"]
    names = [str(entry["name"]) for entry in answer["shards"]]
    if names:
        lines = [f"server: shard {escape(shard)} of {len(names)} ({', '.join(map(escape, names))})"]
    else:
        lines = [f"server: shard {escape(shard)} (no shard list)" if shard else "server: not a shard (no shard list)"]
    lines.append(
        f"queue {escape(name)}: {count} partitions" if count > 1 else f"queue {escape(name)}: no partitions kept"
    )
    if "alive" in answer:  # (a cluster kept in etcd)
        gone = [n for n in names if n not in answer["alive"]]
        said = "etcd reachable" if answer.get("reachable") else "etcd UNREACHABLE from this shard"
        lines.append(f"{said}; gone (lease lapsed): {', '.join(map(escape, gone)) or 'none'}")
        if answer.get("placed") is None:
            lines.append(f"queue {escape(name)}: not placed in etcd yet")
    if answer["places"]:
        lines.append("placed (queue -> shard):")
        lines.extend(f"  {escape(str(queue))} -> {escape(str(home))}" for queue, home in answer["places"])
    if answer["held"]:
        lines.append("held here (queue: depth in messages):")
        lines.extend(f"  {escape(str(queue))}: {int(depth):,}" for queue, depth in answer["held"])
    else:
        lines.append("held here: none of its queues")
    return lines


@click.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    type=click.IntRange(1, shards.MAX_PARTITIONS),
    default=1,
    show_default=True,
    help=f"Make NAME of this many queues, NAME#0 to NAME#K-1, spread over the shard list (1 to "
    f"{shards.MAX_PARTITIONS}; 1 = one queue). Never changed once made.",
)
@click.option(
    "--cluster",
    type=click.Path(exists=True, dir_okay=False),
    help="The shard list: with --partitions, every shard of it is asked.  [default: --config's cluster or "
    "$PZQ_CLUSTER, else the one server of --monitor-dsn]",
)
@monitor_options
def queue_create(ask: Ask, name: str, partitions: int, cluster: str | None) -> None:
    """Make queue NAME, explicit (the operator's: it never expires, as the --queue one). A queue that
    exists already is no error (exit 0, nothing changed); one that a client's request made becomes
    explicit. Names are 1 to 255 bytes, without whitespace. With --partitions K, every shard of the
    shard list keeps "NAME has K partitions" and makes those the list places on it (no list given: the
    list of the server asked, if it is a shard; a server of no list makes them all): run it again, it is
    idempotent, if a shard did not answer (exit 1, naming it). Another K than the one kept is refused:
    partitions never change."""
    if partitions == 1:
        answer = ask(["CREATE", name])
        if answer["created"]:
            click.echo(f"created queue {name!r}")
        elif answer.get("was_implicit"):
            click.echo(f"queue {name!r} exists (made by a client's request): now explicit, it no longer expires")
        else:
            click.echo(f"queue {name!r} exists already: nothing changed")
        return
    listed_at = cluster or resolve(ask.config_file).cluster
    targets = _monitors(shards.load(listed_at)) if listed_at else _served(ask, name)
    _create_everywhere(ask, name, partitions, targets)


def _served(ask: Ask, name: str) -> list[tuple[str, str]]:
    """No list given: the monitors of the list the server of --monitor-dsn reads, if it is a shard (it alone
    would keep the count, the others holding none of the partitions), else that one server."""
    answer = ask(["WHERE", name])
    if not answer["shards"]:
        return [("", ask.endpoint)]
    click.echo(f"shard {answer['shard']} reads a list of {len(answer['shards'])} shards: asking each", err=True)
    return _monitors(shards.ShardList.from_dict(answer["shards"], f"the shard list of {ask.endpoint}"))


def _monitors(listed: shards.ShardList) -> list[tuple[str, str]]:
    missing = [shard.name for shard in listed.shards if not shard.monitor_dsn]
    if missing:
        raise ConfigError(f"the shard list gives no monitor_dsn for {', '.join(missing)}: CREATE cannot reach them")
    return [(shard.name, shard.monitor_dsn) for shard in listed.shards]


def _create_placed(ask: Ask, endpoint: str, name: str, partitions: int) -> dict:
    """CREATE NAME K at ``endpoint``; in a cluster kept in etcd, asked again while the queue is being
    placed (a few ms; PLACE_WAIT_S at most)."""
    deadline = time.monotonic() + PLACE_WAIT_S
    while True:
        try:
            return ask.at(endpoint, ["CREATE", name, str(partitions)])
        except AdminRefused as exc:
            if "being placed" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _create_everywhere(ask: Ask, name: str, partitions: int, targets: list[tuple[str, str]]) -> None:
    """CREATE NAME K on every monitor of ``targets`` ((shard name, endpoint)), each in turn; one line a
    shard; exit 1 (5 for a key without the right) naming those that did not do it."""
    failed: list[str] = []
    code = ExitCode.FAILURE
    for shard, endpoint in targets:
        who = f"shard {shard}" if shard else endpoint
        try:
            _where_as(ask, shard, endpoint, name)  # (before CREATE: another shard would keep the count for ever)
            answer = _create_placed(ask, endpoint, name, partitions)
            here, made = list(answer["here"]), list(answer["made"])
        except AdminRefused as exc:
            click.echo(f"{who}: refused: {exc}", err=True)
            failed.append(shard or endpoint)
            code = refusal_code(str(exc)) if len(failed) == 1 else code
            continue
        except (ClientError, KeyError, TypeError) as exc:
            click.echo(f"{who}: {exc if isinstance(exc, ClientError) else 'an answer that is not pzq’s'}", err=True)
            failed.append(shard or endpoint)
            continue
        shown = ", ".join(map(escape, map(str, here))) or "none of them"
        news = f" (made now: {len(made)})" if made else " (all there already)"
        click.echo(f"{who}: {name!r} has {partitions} partitions; here: {shown}{news}")
    if failed:
        fail(
            f"queue {name!r}: not done on {', '.join(failed)}: run the command again once they answer "
            "(it is idempotent)",
            code,
        )
