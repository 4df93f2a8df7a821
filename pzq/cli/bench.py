"""`pzq bench`: options checked against what the chosen protocol reads; the work lives in pzq.bench."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from pzq.cli.common import Duration, duration_help, errors_to_exit, fail
from pzq.errors import ConfigError

# What each `pzq bench --protocol` reads: an option it does not read is refused, never silently ignored.
_NATIVE_BENCH = {
    *("count", "latency_count", "size", "window", "producers", "consumers", "rate", "paced_seconds", "runs"),
    *("preload", "transport", "hard_sync", "ceiling", "server_args", "json_path", "plot_path", "quiet"),
}
_BENCH_OPTIONS = {
    "pzq": _NATIVE_BENCH | {"client", "batch_size"},
    "phpmq": _NATIVE_BENCH,
    "mqks": {"count", "runs", "size", "server_args", "json_path", "quiet"},
    "emqp": {"count", "concurrent", "broker", "server_args", "json_path", "quiet"},
    "spark": {"count", "runs", "batch", "size", "server_args", "json_path", "quiet", "spark_master"},
}
_BENCH_COUNT = {"pzq": 100_000, "phpmq": 100_000, "mqks": 10_000, "emqp": 5_000, "spark": 100_000}


def _options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Many click options as one decorator, in the order written (as if stacked above the function)."""

    def apply(func: Any) -> Any:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


# What is measured (the workload) and how the run is set up: two groups, so that `bench` itself stays short
_WORKLOAD = _options(
    click.option(
        "--protocol",
        type=click.Choice(list(_BENCH_OPTIONS)),
        default="pzq",
        show_default=True,
        help="What the clients speak: pzq (native, with the no-storage ceiling), phpmq (no ceiling, no send "
        "receipt), mqks (publish, consume, ack), emqp (jobs through a real eventmq JobManager), spark (the connector).",
    ),
    click.option(
        "--count",
        "--messages",
        "--jobs",
        "count",
        type=click.IntRange(1),
        default=None,
        help="Messages per throughput phase (jobs for emqp).  [default: 100000; mqks 10000; emqp 5000]",
    ),
    click.option(
        "--latency-count",
        type=click.IntRange(1),
        default=10_000,
        show_default=True,
        help="Messages of the window-1 (ack latency) phase.",
    ),
    click.option(
        "--size", type=click.IntRange(0), default=100, show_default=True, help="Body bytes (pzq, phpmq: at least 16)."
    ),
    click.option(
        "--window", type=click.IntRange(1), default=100, show_default=True, help="Unacked messages per producer."
    ),
    click.option("--producers", type=click.IntRange(1), default=1, show_default=True, help="Producer processes."),
    click.option("--consumers", type=click.IntRange(1), default=1, show_default=True, help="Consumer processes."),
    click.option(
        "--rate",
        type=click.FloatRange(0, min_open=True),
        default=5000,
        show_default=True,
        help="Messages a second (msg/s) of the paced phase.",
    ),
    click.option(
        "--paced-seconds",
        type=Duration(),
        metavar="DURATION",
        default="5s",
        show_default=True,
        help=duration_help("Length of the paced phase."),
    ),
    click.option(
        "--runs", type=click.IntRange(1), default=3, show_default=True, help="Full runs; the table shows medians."
    ),
    click.option(
        "--preload",
        type=click.IntRange(0),
        default=0,
        show_default=True,
        help="Store this many messages before the server starts (scale test).",
    ),
)
_SETUP = _options(
    click.option(
        "--transport",
        type=click.Choice(["tcp", "ipc"]),
        default="tcp",
        show_default=True,
        help="How clients reach the server.",
    ),
    click.option(
        "--hard-sync/--no-hard-sync",
        default=True,
        show_default=True,
        help="The server fsyncs every commit (as `pzq serve`).",
    ),
    click.option(
        "--ceiling/--no-ceiling",
        default=True,
        show_default=True,
        help="Also drive a no-storage pyzmq echo server with the same producer code.",
    ),
    click.option(
        "--client",
        type=click.Choice(["legacy", "batched", "both"]),
        default="legacy",
        show_default=True,
        help="pzq: one message per ZeroMQ message (legacy), PZQ-BATCH/1 producers and consumers (batched: "
        "the same --window messages in flight, a consumer credit of --window), or both on one server.",
    ),
    click.option(
        "--batch-size",
        type=click.IntRange(1),
        default=50,
        show_default=True,
        help="pzq batched: messages per batch (--window / --batch-size batches in flight, at least one).",
    ),
    click.option(
        "--batch",
        type=click.IntRange(1),
        default=None,
        help="spark: maxMessagesPerBatch, in messages.  [default: the connector's, 500,000]",
    ),
    click.option(
        "--spark-master",
        default="local[2]",
        show_default=True,
        help="spark: where the queries run (spark://HOST:PORT for a standalone cluster).",
    ),
    click.option(
        "--concurrent",
        type=click.IntRange(1),
        default=4,
        show_default=True,
        help="emqp: the JobManager's job processes.",
    ),
    click.option(
        "--broker",
        type=click.Choice(["pzq", "reference", "both"]),
        default="both",
        show_default=True,
        help="emqp: via whom.",
    ),
    click.option(
        "--server-arg",
        "server_args",
        multiple=True,
        help="Extra argument for `pzq serve` (repeatable).  [default: none]",
    ),
    click.option("--json", "json_path", default="pzq-bench.json", show_default=True, help="Where to write JSON."),
    click.option(
        "--plot", "plot_path", default=None, help="Write a latency distribution PNG here (matplotlib).  [default: none]"
    ),
    click.option("--quiet", is_flag=True, help="No progress bar."),
)


@click.command()
@_WORKLOAD
@_SETUP
@click.pass_context
@errors_to_exit
def bench(
    ctx, protocol, json_path, plot_path, quiet, server_args, batch, concurrent, broker, spark_master, **options
) -> None:
    """Measure throughput and latency of a fresh local server (with the no-storage ceiling beside it for
    --protocol pzq); figures are printed and written to --json."""
    from pzq.bench import report

    flags = {param.name: param.opts[0] for param in ctx.command.params}
    given = {name for name in ctx.params if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    unused = sorted(flags[name] for name in given - _BENCH_OPTIONS[protocol] - {"protocol"})
    if unused:
        raise ConfigError(f"{', '.join(unused)}: not used by --protocol {protocol}")
    if options["count"] is None:
        options["count"] = _BENCH_COUNT[protocol]
    if protocol in ("mqks", "emqp", "spark"):
        result = _bench_other(protocol, options, batch, concurrent, broker, tuple(server_args), spark_master)
    else:
        result = _bench_native(protocol, options, server_args, quiet)
        click.echo(report.table(result))
    report.write_json(result, json_path)
    click.echo(f"\nJSON written to {json_path}")
    if plot_path:
        report.plot(result, plot_path)
        click.echo(f"latency plot written to {plot_path}")
    problems = report.lost_or_duplicated(result)
    if problems:
        fail(f"messages were lost or duplicated ({'; '.join(problems[:3])})")


def _bench_native(protocol: str, options: dict, server_args, quiet: bool) -> dict:
    from pzq.bench import native

    if options["size"] < 16:
        raise ConfigError("--size: at least 16 bytes (the benchmark stamps each body)")
    if (
        min(
            options["count"],
            options["latency_count"],
            options["window"],
            options["producers"],
            options["consumers"],
            options["runs"],
            options["batch_size"],
        )
        < 1
    ):
        raise ConfigError(
            "--count, --latency-count, --window, --producers, --consumers, --runs, --batch-size: at least 1"
        )
    kind = "native" if protocol == "pzq" else protocol
    opts = native.BenchOptions(server_args=tuple(server_args), progress=not quiet, protocol=kind, **options)
    return native.bench(opts)


def _bench_other(
    protocol: str, options: dict, batch: int | None, concurrent: int, broker: str, server_args: tuple, master: str
) -> dict:
    count, runs, size = options["count"], options["runs"], options["size"]
    if min(count, runs, 1 if batch is None else batch, concurrent) < 1 or size < 0:
        raise ConfigError("--count, --runs, --batch, --concurrent: at least 1; --size: at least 0")
    if protocol == "mqks":
        from pzq.bench import mqks

        return mqks.bench(mqks.MqksOptions(count, runs, size, server_args), click.echo)
    if protocol == "emqp":
        from pzq.bench import emqp

        return emqp.bench(emqp.EmqpOptions(count, concurrent, broker, server_args), click.echo)
    from pzq.bench import spark

    return spark.bench(spark.SparkOptions(count, runs, batch, size, server_args, master), click.echo)
