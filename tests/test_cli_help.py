"""Every option of every `pzq` command says in its help what it defaults to, and every duration option
says its default with a unit and what a plain number is (seconds, µs for the original PZQ's two, or
refused in this release where its meaning changed: pzq/units.py's rule)."""

from __future__ import annotations

import re

import click
from cli_walk import commands, groups
from click.testing import CliRunner

from pzq import config
from pzq.cli import cli
from pzq.cli.common import Duration

# Option names that are durations whatever their type: a new one must take Duration.
LOOKS_LIKE_A_DURATION = re.compile(r"timeout|interval|seconds|ttl|frequency|watch|dedup_window|_s$|_ms$|_us$")
DURATION_WITH_UNIT = re.compile(r"\d+(\.\d+)?(h|m|s|ms|µs)")


def shown_default(option: click.Option) -> str | None:
    """The default as the help shows it: click's own "[default: X]" or one the help writes itself."""
    written = re.search(r"\[default: ([^\]]+)\]", option.help or "")
    if written:
        return written.group(1)
    if option.show_default and option.default is not None:
        return str(option.default)
    return None


def test_every_option_has_help_that_shows_its_default():
    missing = []
    for path, command in commands():
        for option in command.params:
            if not isinstance(option, click.Option) or option.is_flag and not option.secondary_opts:
                continue  # an on/off flag is off unless given
            if not option.help or shown_default(option) is None:
                missing.append(f"pzq {' '.join(path)} {option.opts[0]}")
    assert missing == []


def test_every_duration_option_names_its_unit_and_its_default_has_one():
    durations = []
    for path, command in commands():
        for option in command.params:
            if not isinstance(option, click.Option) or option.name is None:
                continue
            is_duration = isinstance(option.type, Duration) or option.name in config.DURATION_FIELDS
            where = f"pzq {' '.join(path)} {option.opts[0]}"
            if LOOKS_LIKE_A_DURATION.search(option.name):
                assert is_duration, f"{where} looks like a duration but does not take units"
            if not is_duration:
                continue
            durations.append(where)
            rule = r"plain number is (µs|seconds)\.|plain number is refused in this release, as its meaning changes"
            assert re.search(rule, " ".join((option.help or "").split())), where
            default = shown_default(option)
            assert default is not None, where
            assert DURATION_WITH_UNIT.fullmatch(default) or not re.search(r"\d", default), (where, default)
    assert {"pzq produce --timeout", "pzq consume --timeout", "pzq mqks consume --timeout"} <= set(durations)
    assert {"pzq serve --ack-timeout", "pzq serve --lease-timeout", "pzq monitor --watch"} <= set(durations)


def test_the_rendered_help_shows_defaults_with_units():
    out = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output
    assert re.search(r"--ack-timeout DURATION +.*A plain number is µs\.  \[default: 5s\]", out)
    assert re.search(r"--max-store-size SIZE +.*\[default: 4G\]", out)
    out = CliRunner().invoke(cli, ["mqks", "consume", "--help"], terminal_width=200).output
    assert re.search(r"--timeout DURATION +Wait for each message\. A plain number is seconds\.  \[default: 10s\]", out)
    out = CliRunner().invoke(cli, ["produce", "--help"], terminal_width=200).output
    refused = r"Give a unit \(500us, 2ms, 1s\): a plain number is refused in this release, as its meaning changes"
    refused += r" from ms to seconds\.  \[default: 10s\]"
    assert re.search(r"--timeout DURATION +Wait for each ack\. " + refused, out)


# What counts as naming a unit in an option's help: a time unit (or the plain-number rule), bytes, or the
# noun a count counts. A new option about time, size or a count must use one of these words.
UNIT_WORDS = re.compile(
    r"\b(seconds|ms|µs|plain number is|bytes|messages|msg/s|deliveries|queues|connections|intervals|rows|"
    r"processes|runs|jobs|dead letters|batches|port number)\b",
    re.IGNORECASE,
)


def test_every_option_about_time_size_or_a_count_names_its_unit():
    unnamed = []
    for path, command in commands():
        for option in command.params:
            if not isinstance(option, click.Option) or option.is_flag:
                continue
            unit = config.FIELDS[option.name].metadata["unit"] if option.name in config.FIELDS else None
            counted = isinstance(option.type, click.types.IntParamType | click.types.FloatParamType)
            timed = isinstance(option.type, Duration) or option.name in config.DURATION_FIELDS
            if (counted or timed or unit == config.SIZE) and not UNIT_WORDS.search(option.help or ""):
                unnamed.append(f"pzq {' '.join(path)} {option.opts[-1]}: {option.help}")
    assert unnamed == []


def test_monitor_s_timeout_and_watch_both_say_a_plain_number_is_seconds_or_refused():
    out = " ".join(CliRunner().invoke(cli, ["monitor", "--help"], terminal_width=200).output.split())
    assert "--watch DURATION Redraw this often" in out and "A plain number is seconds." in out
    assert "a plain number is refused in this release, as its meaning changes from ms to seconds" in out


def test_no_command_list_cuts_a_description_mid_sentence():
    for path, _ in groups():
        for width in (80, 200):
            out = CliRunner().invoke(cli, [*path, "--help"], terminal_width=width).output
            listing = out.split("Commands:\n", 1)[1] if "Commands:\n" in out else ""
            assert listing, (path, out)
            cut = [line for line in listing.splitlines() if line.rstrip().endswith("...")]
            assert cut == [], (path, width)
            # (each description is whole: its last line ends a sentence)
            assert listing.rstrip().endswith((".", ")")), (path, listing)
