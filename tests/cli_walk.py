"""The `pzq` command line walked from its click group, so that a check over every command covers a
command added later without a list to keep."""

from __future__ import annotations

from collections.abc import Iterator

import click

from pzq.cli import cli

Path = tuple[str, ...]


def commands(group: click.Group = cli, path: Path = ()) -> Iterator[tuple[Path, click.Command]]:
    """(path, command) of every command under ``group``, subcommands included (groups themselves not)."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def groups(group: click.Group = cli, path: Path = ()) -> Iterator[tuple[Path, click.Group]]:
    """(path, group) of ``group`` and every group under it."""
    yield path, group
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from groups(command, (*path, name))
