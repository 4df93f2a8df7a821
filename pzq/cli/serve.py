"""`pzq serve`: its options are made from Config's fields, so each setting's default, unit and help are
written once, in pzq/config.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from pzq import config, logs
from pzq.cli.common import config_option, errors_to_exit, resolve


def help_text(name: str) -> str:
    """The help of setting ``name``'s option: what it does, its unit, and its default with the unit."""
    size = (
        " In bytes, or with K, M, G or T (times 1024 each)."
        if config.FIELDS[name].metadata["unit"] == config.SIZE
        else ""
    )
    return f"{config.describe(name)}{size}  [default: {config.show(name, config.FIELDS[name].default)}]"


def _option(name: str) -> Callable[[Any], Any]:
    field = config.FIELDS[name]
    flag, unit, choices = "--" + name.replace("_", "-"), field.metadata["unit"], field.metadata["choices"]
    if isinstance(field.default, bool):
        # default=None: an option not given stays None, so the environment and the file still count
        return click.option(f"{flag}/--no-{flag[2:]}", default=None, help=help_text(name))
    kind: Any
    if choices:
        kind = click.Choice(choices)
    elif unit == "file":
        kind = click.Path(dir_okay=False)
    elif name in config.DURATION_FIELDS:
        kind = click.STRING  # '250ms', '30s' or a plain number: read by config, which names the option
    elif unit == config.SIZE:
        kind = click.STRING
    else:
        kind = type(field.default)
    metavar = "DURATION" if name in config.DURATION_FIELDS else "SIZE" if unit == config.SIZE else None
    return click.option(flag, type=kind, metavar=metavar, help=help_text(name))


def setting_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """One option per Config field, in the fields' order."""
    for name in reversed(list(config.FIELDS)):
        func = _option(name)(func)
    return func


@click.command()
@config_option
@setting_options
@errors_to_exit
def serve(config_file: str | None, **flags: Any) -> None:
    """Run the server in the foreground until SIGTERM or SIGINT."""
    cfg = resolve(config_file, **flags)
    if cfg.http_dsn and cfg.http_auth_file:
        # (the console, pzq's child, reads it: without this, pzq served on with a console that died every second)
        from pzq.console.auth import read_secret

        read_secret(cfg.http_auth_file)
    logs.configure(cfg.log_level, cfg.log_format)
    from pzq.server import serve as run_server

    run_server(cfg, reload=lambda: resolve(config_file, **flags))  # (--http-dsn: the console is its child process)
