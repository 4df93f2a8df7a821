"""The `pzq` command line (click). Wiring only: the work lives in server, clients, check and bench.

``serve`` (pzq/cli/serve.py) takes its options from Config's fields; the native clients' commands are in
clients.py, the MQKS ones in mqks.py, the store and key commands in admin.py, the queue and clients
commands through the monitor in queues.py, the benchmark in bench.py.
"""

from __future__ import annotations

import click

from pzq import __version__
from pzq.cli import admin, backup, bench, clients, console, mqks, queue_shards, queues, serve, shards
from pzq.cli.common import Group, QueueName


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="pzq")
def cli() -> None:
    """pzq: a durable message queue that speaks PZQ (and more) on ZeroMQ and LMDB."""


for command in (
    serve.serve,
    console.console,
    clients.monitor,
    clients.produce,
    clients.consume,
    admin.keygen,
    mqks.mqks_group,
    admin.dead_letters,
    queues.queue_group,
    queues.clients,
    shards.shards_group,
    admin.check_store,
    admin.dump_store,
    backup.backup,
    backup.restore,
    bench.bench,
):
    cli.add_command(command)


admin.dead_letters.add_command(queues.dead_letters_delete)
queues.queue_group.add_command(queue_shards.queue_where)  # (they know shards: a module of their own)
queues.queue_group.add_command(queue_shards.queue_create)

# One whole sentence each for `pzq --help`'s list (click cuts a long docstring mid-sentence there, "...")
SHORT_HELP = {
    "serve": "Run the server in the foreground until SIGTERM or SIGINT.",
    "console": "Serve the web console of a running server.",
    "monitor": "Show a running server's figures, once or every --watch.",
    "produce": "Store messages and wait until every one is acked.",
    "consume": "Print and acknowledge messages of a running server.",
    "keygen": "Write a CURVE key pair (NAME.key and NAME.key_secret).",
    "mqks": "Publish and consume through the MQKS gateway.",
    "dead-letters": "List, requeue or delete a queue's dead letters.",
    "queue": "Work with a running server's queues.",
    "clients": "List a running server's connections, workers and schedules.",
    "check": "Read every record of a store or backup: is all of it readable?",
    "dump": "Copy every readable record of a store into a JSON lines file.",
    "backup": "Copy a running server's store into a new backup.",
    "restore": "Put a backup in place as the store of a new or stopped server.",
    "bench": "Measure the throughput and latency of a fresh local server.",
    "shards": "Run N shards on this machine for development.",
}


def _whole_short_help(group: click.Group) -> None:
    """Every command listed by a group's help says one whole sentence: its SHORT_HELP, else its help's
    first sentence (a subcommand added later reads whole too; click's own cut is at 45 characters)."""
    for name, command in group.commands.items():
        if group is cli and name in SHORT_HELP:
            command.short_help = SHORT_HELP[name]
        elif not command.short_help and command.help:
            first = " ".join(command.help.split("\n\n")[0].split())
            command.short_help = first.split(". ")[0].rstrip(".") + "."
        if isinstance(command, click.Group):
            _whole_short_help(command)


_whole_short_help(cli)


def _queue_names(group: click.Group, path: tuple[str, ...] = ()) -> None:
    """Every argument that names a queue (QUEUE anywhere, NAME under the queue commands) takes QueueName,
    a command added later too."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            _queue_names(command, (*path, name))
            continue
        for param in command.params:
            if isinstance(param, click.Argument) and (param.name == "queue" or param.name == "name" and path):
                if param.type is click.STRING:
                    param.type = QueueName()


_queue_names(cli)


def main() -> None:
    """The console script `pzq` (and `python -m pzq`)."""
    cli(prog_name="pzq")
