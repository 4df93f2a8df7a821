"""`pzq backup` and `pzq restore` (the work is in pzq/store/backup.py)."""

from __future__ import annotations

import signal

import click

from pzq.cli.common import config_option, errors_to_exit, resolve
from pzq.errors import StoreError


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _progress(copied: int, expected: int, seconds: float) -> None:
    share = f" ({100 * copied // expected}%)" if expected and copied <= expected else ""
    try:
        click.echo(f"pzq backup: {_mib(copied)} of about {_mib(expected)} copied{share}, {seconds:.0f} s", err=True)
    except OSError:  # (stderr gone: `2>&1 | head -1`, a closed terminal) the copy itself goes on
        pass


def _stopped(signum: int, frame: object) -> None:
    raise StoreError(f"stopped by {signal.Signals(signum).name}: no backup was kept")


@click.command("backup")
@config_option
@click.option("--database", help="The store to copy.  [default: --config's database or $PZQ_DATABASE, else ./pzq-data]")
@click.option("--force", is_flag=True, help="Replace DEST if it is an earlier backup.")
@click.argument("dest")
@errors_to_exit
def backup(config_file, database, force, dest) -> None:
    """Copy the store, while its server runs, into the new directory DEST: consistent (what was
    committed when the copy began) and compacted. The server is not paused; while the copy runs, pages
    it frees are not reused, so its store may grow by what it writes meanwhile. DEST appears only once
    the copy is complete and fsync'd; `pzq check DEST` reads it, `pzq restore DEST` puts it back."""
    from pzq.store.backup import backup as take

    settings = resolve(config_file, database=database)
    source = settings.database
    signal.signal(signal.SIGTERM, _stopped)  # (so that the partial copy is removed, as on ^C)
    keeps = settings.min_disk_free + settings.disk_reserve
    done = take(source, dest, replace=force, progress=_progress, server_keeps=keeps)
    click.echo(
        f"{done.path}: backup of {source} complete, {_mib(done.bytes)} (the store's file: "
        f"{_mib(done.store_bytes)}) in {done.seconds:.1f} s; `pzq check {done.path}` reads it back"
    )


@click.command("restore")
@config_option
@click.option(
    "--database",
    help="The store directory to restore into.  [default: --config's database or $PZQ_DATABASE, else ./pzq-data]",
)
@click.option("--force", is_flag=True, help="Replace the store of a directory that is not empty (its server stopped).")
@click.argument("backup_path", metavar="BACKUP")
@errors_to_exit
def restore(config_file, database, force, backup_path) -> None:
    """Put BACKUP (a directory `pzq backup` made, or its data.mdb) in place as the store of --database,
    which must be new or empty unless --force. Then start `pzq serve` on it."""
    from pzq.store.backup import restore as put_back

    target = resolve(config_file, database=database).database
    done = put_back(backup_path, target, force=force)
    click.echo(
        f"{done.path}: restored from {backup_path} ({_mib(done.bytes)}) in {done.seconds:.1f} s; "
        f"start the server on it: pzq serve --database {done.path}"
    )
