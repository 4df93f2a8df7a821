"""What every `pzq` command shares: one clear line and a named exit code for each pzq error, settings
resolved from flags, environment and file, and the CURVE client options."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import click

from pzq import config, units
from pzq.clients import reach
from pzq.errors import (
    ConfigError,
    CurveRefused,
    DiskFull,
    ExitCode,
    NoMessage,
    NotListening,
    NotPermitted,
    PzqError,
    StoreDamaged,
    StoreDenied,
    StoreLocked,
    StoreTooNew,
    SyncLost,
    WrongShard,
)


def fail(message: str, code: ExitCode = ExitCode.FAILURE) -> NoReturn:
    """Print ``pzq: error: MESSAGE`` to standard error and exit with ``code``."""
    click.echo(f"pzq: error: {message}", err=True)
    sys.exit(code)


def errors_to_exit(func: Callable[..., Any]) -> Callable[..., Any]:
    """One clear line and a non-zero exit for every pzq error: no tracebacks for users' mistakes."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ConfigError, StoreLocked, StoreDenied) as exc:
            fail(str(exc), ExitCode.CONFIG)
        except WrongShard as exc:  # (another shard's store: one line, its own status)
            fail(str(exc), ExitCode.WRONG_SHARD)
        except (StoreDamaged, StoreTooNew) as exc:
            fail(str(exc), ExitCode.STORE)
        except SyncLost as exc:  # (the answers it held are not sent: a supervisor starts it again from the disk)
            fail(str(exc), ExitCode.SYNC_LOST)
        except DiskFull as exc:  # (a sound store on a full disk: not damage, its own status)
            fail(str(exc), ExitCode.DISK_FULL)
        except NotPermitted as exc:  # (the key refused, or without the right: one line, its own status)
            fail(str(exc), ExitCode.NOT_PERMITTED)
        except NotListening as exc:  # (the three silences a client meets, told apart: pzq/clients/reach.py)
            fail(str(exc), ExitCode.NOT_LISTENING)
        except CurveRefused as exc:
            fail(str(exc), ExitCode.CURVE_REFUSED)
        except NoMessage as exc:
            fail(str(exc), ExitCode.NO_MESSAGE)
        except PzqError as exc:
            fail(str(exc), ExitCode.FAILURE)

    return wrapper


class Group(click.Group):
    """The `pzq` group: every refused input is one line and a named exit code, whether click refuses it
    (a usage error: ExitCode.USAGE, with the command's --help named, not click's usage block) or a
    ConfigError raised while reading options (a duration without its unit: ExitCode.CONFIG). Its client
    commands are impatient (reach.py): nothing listening is said within a second, not after --timeout."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            with reach.impatient():
                return super().main(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc), ExitCode.CONFIG)

    # (click's usage errors are raised while the group's context is made, or its subcommand's in invoke:
    # caught at both, click's own handling of everything else, --help's exit included, stays as it is)
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _usage_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_in_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:  # (`pzq` or `pzq queue` alone: the help is the answer)
        raise
    except click.UsageError as exc:
        where = f" (see {exc.ctx.command_path} --help)" if exc.ctx else ""
        fail(" ".join(exc.format_message().split()) + where, ExitCode.USAGE)
    except click.exceptions.FileError as exc:  # (a file click could not open: one line too)
        fail(" ".join(exc.format_message().split()), ExitCode.CONFIG)


def from_settings(name: str) -> str:
    """The default of a client's endpoint option: the server's setting, as `pzq serve` reads it."""
    default = config.FIELDS[name].metadata["shown"] or config.FIELDS[name].default
    return f"  [default: --config's {name} or $PZQ_{name.upper()}, else {default}]"


def refusal_code(detail: str) -> ExitCode:
    """The exit status for a monitor's ``error:`` answer (its text after ``error:``)."""
    return ExitCode.NOT_PERMITTED if detail.startswith("not permitted") else ExitCode.FAILURE


def resolve(config_file: str | None, **flags: Any) -> config.Config:
    """The settings: ``flags`` (None = not given) over PZQ_* variables over ``config_file`` over defaults."""
    return config.load(flags, os.environ, config_file)


SYSTEM_CONFIG = "/etc/pzq/pzq.toml"  # the service's settings, as scripts/install-systemd writes them


def monitor_endpoint(config_file: str | None, monitor_dsn: str | None, system_config: str = SYSTEM_CONFIG) -> str:
    """The monitor endpoint of the server meant, an ipc:// path made absolute (so that an error names the
    very file). Given nothing (no flag, --config or PZQ_* variable) and no socket at the default path of
    this directory, the server is the installed service: its monitor is read from ``system_config``."""
    endpoint = resolve(config_file, monitor_dsn=monitor_dsn).monitor_dsn
    named = monitor_dsn or config_file or os.environ.get("PZQ_MONITOR_DSN") or os.environ.get("PZQ_DATABASE")
    if not named and not os.path.exists(_ipc_path(endpoint)) and os.access(system_config, os.R_OK):
        endpoint = resolve(system_config).monitor_dsn
    path = _ipc_path(endpoint)
    return f"ipc://{os.path.abspath(path)}" if path else endpoint


def _ipc_path(endpoint: str) -> str:
    return endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""


def curve_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--curve-client-key / --curve-server-key for commands that talk to a CURVE server."""
    func = click.option(
        "--curve-server-key",
        envvar="PZQ_CURVE_SERVER_KEY",
        help="The server's CURVE public key file (server.key).  [default: none]",
    )(func)
    return click.option(
        "--curve-client-key",
        envvar="PZQ_CURVE_CLIENT_KEY",
        help="This client's CURVE key pair file (NAME.key_secret), if the server uses CURVE.  [default: none]",
    )(func)


def curve(client_key: str | None, server_key: str | None) -> tuple[str, str] | None:
    """The (client key pair, server public key) files, or None without CURVE; ConfigError for one alone."""
    if bool(client_key) != bool(server_key):
        raise ConfigError("--curve-client-key and --curve-server-key: give both or neither")
    return (client_key, server_key) if client_key and server_key else None


class Duration(click.ParamType):
    """A client's duration option: '250ms', '30s', '5m', '1h', held in seconds. A plain number is seconds
    (pzq/units.py's rule), and refused where ``was`` names the unit it meant before this release."""

    name = "duration"

    def __init__(self, was: str = ""):
        self.was = was

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        name = param.opts[0] if param else "duration"
        try:
            seconds = value if isinstance(value, float) else units.parse_duration(value, units.SECONDS, self.was)
        except ValueError as exc:  # one line naming the option, as serve's settings say it (cli's Group)
            raise ConfigError(f"{name}: {exc}") from None
        if seconds < 0:  # (a wait of -1s was read as none at all)
            raise ConfigError(f"{name}: a duration is 0 or more, not {value!r}")
        return seconds


class QueueName(click.ParamType):
    """A queue name a request can carry: the monitor's and MQKS's requests are words on one line, so a
    name that is empty, has blanks or control characters, or is over the store's 255 bytes is refused
    here, in one line, not answered by the server as some other request."""

    name = "queue"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if (
            0 < len(value.encode("utf-8", "surrogateescape")) <= 255
            and value.isprintable()
            and not any(c.isspace() for c in value)
        ):
            return value
        self.fail(f"{value!r} is not a queue name (1 to 255 bytes, no blanks or control characters)", param, ctx)


def duration_help(text: str, was: str = "") -> str:
    """An option's help with the rule of its plain number: 'Wait for X. A plain number is seconds.'"""
    return f"{text} {units.plain_rule(units.SECONDS, was)}"


config_option = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    envvar="PZQ_CONFIG",
    help="TOML file of settings (see conf/pzq.toml).  [default: $PZQ_CONFIG, else none]",
)

# How long a monitor client waits for its answer (`pzq monitor` and the admin commands)
answer_timeout_option = click.option(
    "--timeout",
    type=Duration(was="ms"),
    default="5s",
    metavar="DURATION",
    show_default=True,
    help=duration_help("Wait for an answer.", was="ms"),
)
