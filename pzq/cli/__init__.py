"""The `pzq` command line (click). Wiring only: the work lives in server, clients, check and bench.

``serve`` (pzq/cli/serve.py) takes its options from Config's fields; the native clients' commands are in
clients.py, the MQKS ones in mqks.py, the store and key commands in admin.py, the queue and clients
commands through the monitor in queues.py, the benchmark in bench.py.
"""

from __future__ import annotations

import click

from pzq import __version__
from pzq.cli import admin, backup, bench, clients, console, mqks, queues, serve
from pzq.cli.common import Group


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
    admin.check_store,
    admin.dump_store,
    backup.backup,
    backup.restore,
    bench.bench,
):
    cli.add_command(command)


admin.dead_letters.add_command(queues.dead_letters_delete)


def main() -> None:
    """The console script `pzq` (and `python -m pzq`)."""
    cli(prog_name="pzq")
