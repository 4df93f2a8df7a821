"""`pzq console`: the web console as a process of its own, talking to pzq only through its monitor
socket (pzq/console/server.py). `pzq serve --http-dsn` runs exactly this as its child."""

from __future__ import annotations

import sys

import click

from pzq import logs
from pzq.cli.common import Duration, config_option, duration_help, errors_to_exit, monitor_endpoint, resolve
from pzq.errors import ConfigError


@click.command()
@config_option
@click.option("--http-dsn", help="Where to serve, http://HOST:PORT.  [default: --config's http_dsn]")
@click.option(
    "--monitor-dsn",
    help="pzq's monitor endpoint.  [default: --config's monitor_dsn, else ipc://ABSOLUTE/pzq-data/monitor]",
)
@click.option(
    "--http-auth-file",
    help="File whose first line is the operator's secret: logged in, they may change things.  "
    "[default: --config's http_auth_file, else read-only]",
)
@click.option(
    "--http-host-names",
    help="More names browsers may call the console by, comma-separated.  "
    "[default: --config's http_host_names, else none]",
)
@click.option(
    "--poll-interval",
    type=Duration(),
    default="1s",
    show_default=True,
    metavar="DURATION",
    help=duration_help("Time between two STATS requests to pzq, however many browsers watch (0.5s to 60s)."),
)
@click.option(
    "--curve-server-key", help="pzq's CURVE public key: its Z85 text (40 characters) or its key file.  [default: none]"
)
@click.option("--curve-client-key", help="This console's CURVE key pair file (NAME.key_secret).  [default: none]")
@click.option(
    "--curve-key-stdin",
    is_flag=True,
    help="Read this console's CURVE key pair from standard input, one line 'PUBLIC_Z85 SECRET_Z85' "
    "(how `pzq serve` hands its child a fresh pair).",
)
@errors_to_exit
def console(
    config_file,
    http_dsn,
    monitor_dsn,
    http_auth_file,
    http_host_names,
    poll_interval,
    curve_server_key,
    curve_client_key,
    curve_key_stdin,
) -> None:
    """Serve the web console at --http-dsn for the pzq at --monitor-dsn, until SIGTERM or SIGINT."""
    from pzq.clients import monitor_link
    from pzq.console.server import Options, run

    if not 0.5 <= poll_interval <= 60:
        raise ConfigError(f"--poll-interval: {poll_interval:g} s is not between 0.5 s and 60 s")
    cfg = resolve(config_file)
    http_dsn = http_dsn or cfg.http_dsn
    if not http_dsn:
        raise ConfigError("--http-dsn: where should the console listen? (http://HOST:PORT)")
    logs.configure(cfg.log_level, cfg.log_format)
    curve = None
    if curve_client_key and curve_key_stdin:
        raise ConfigError("--curve-client-key and --curve-key-stdin: give one of them")
    if bool(curve_server_key) != bool(curve_client_key or curve_key_stdin):
        raise ConfigError("--curve-server-key needs --curve-client-key or --curve-key-stdin, and they need it")
    if curve_server_key:
        if curve_key_stdin:
            public, secret = monitor_link.client_pair_from_line(sys.stdin.readline(200))
        else:
            public, secret = monitor_link.client_pair_from_file(curve_client_key)
        curve = monitor_link.CurveKeys(public, secret, monitor_link.server_key(curve_server_key))
    run(
        Options(
            http_dsn=http_dsn,
            monitor_dsn=monitor_endpoint(config_file, monitor_dsn),
            auth_file=http_auth_file if http_auth_file is not None else cfg.http_auth_file,
            host_names=http_host_names if http_host_names is not None else cfg.http_host_names,
            poll_s=poll_interval,
            curve=curve,
        )
    )
