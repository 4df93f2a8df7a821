"""Durations and sizes as people write them, and the one rule for a plain number of a duration.

The rule (docs/configuration.md has the table): a duration takes a unit ('250ms', '30s', '5m', '1h',
'2us'); a plain number is seconds, but for the original PZQ's two settings, ``--ack-timeout`` and
``--reaper-frequency``, whose plain numbers stay microseconds (their wire and command-line
compatibility). Where a plain number meant something else before this release (``--commit-interval``'s
µs, the client commands' ``--timeout`` ms), a plain number other than 0 is refused for this release
with a line naming the unit, never read again in seconds: ``commit_interval = 500`` must not become
500 s. Every duration is held in seconds.
"""

from __future__ import annotations

import decimal
import math
import re

SECONDS, MICROSECONDS = "s", "µs"  # the units a plain number of a duration is read in
_NAMES = {"s": "seconds", "µs": "microseconds", "ms": "milliseconds"}
_SHORT = {"s": "seconds", "µs": "µs", "ms": "ms"}  # (in help, as conf/pzq.toml has always said it)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION_UNITS = {
    u: decimal.Decimal(f) for u, f in (("h", "3600"), ("m", "60"), ("s", "1"), ("ms", "1e-3"), ("us", "1e-6"))
}
_DURATION_UNITS.update({"µs": _DURATION_UNITS["us"], "μs": _DURATION_UNITS["us"]})  # micro sign and Greek mu


def plain_rule(plain: str, was: str = "") -> str:
    """What a plain number of a duration is, in words for its help: 'A plain number is seconds.', or for a
    duration whose plain number changes meaning in this release, that it is refused and why."""
    if was:
        return (
            f"Give a unit (500us, 2ms, 1s): a plain number is refused in this release, as its meaning changes "
            f"from {_SHORT[was]} to {_SHORT[plain]}."
        )
    return f"A plain number is {_SHORT[plain]}."


def parse_duration(value: str | float, plain: str = SECONDS, was: str = "") -> float:
    """'250ms', '30s', '5m', '1h', '2us' or '2µs' -> seconds; a plain number (or a TOML number) is in
    ``plain`` ('s' or 'µs'), and refused (other than 0, the same in any unit) when ``was`` names the unit
    it meant before this release. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    m = re.fullmatch(r"\s*([+-]?(?:\d+\.?\d*|\.\d+))\s*(h|m|s|ms|us|µs|μs)?\s*", str(value))
    if isinstance(value, int | float):  # repr: the shortest text that reads back as the number (1e-05 too)
        number, unit = decimal.Decimal(repr(value)), ""
    elif m:
        number, unit = decimal.Decimal(m.group(1)), m.group(2) or ""
    else:
        raise ValueError(f"{value!r} is not a duration such as 250ms, 30s, 5m or 1h")
    if not unit and was and number.is_finite() and number != 0:
        raise ValueError(
            f"give a unit (500us, 2ms, 1s): a plain number's meaning changes from {_NAMES[was]} to "
            f"{_NAMES[plain]} in this release"
        )
    seconds = float(number * _DURATION_UNITS[unit or plain])
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a finite duration")
    return seconds


def format_duration(seconds: float) -> str:
    """3600.0 -> '1h', 2.5 -> '2.5s', 0.01 -> '10ms': the largest unit the value is written short in."""
    us = round(abs(seconds) * 1e6)
    sign = "-" if seconds < 0 else ""
    for unit, size, grain in (("h", 3600_000_000, 36_000_000), ("m", 60_000_000, 1_000_000), ("s", 1_000_000, 1000)):
        if us >= size and us % grain == 0:
            return f"{sign}{us / size:.2f}".rstrip("0").rstrip(".") + unit
    if us % 1000 == 0:
        return f"{sign}{us // 1000}ms" if us else "0s"
    return f"{sign}{us}µs"


def format_size(size: int) -> str:
    """4294967296 -> '4G'; a size no suffix divides is plain bytes."""
    for suffix, factor in reversed(list(_SIZE_UNITS.items())):
        if factor > 1 and size and size % factor == 0:
            return f"{size // factor}{suffix.upper()}"
    return str(size)


def parse_size(text: str) -> int:
    """'4G' -> 4294967296; plain digits are bytes. Raises ValueError."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)i?[bB]?\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a size such as 512M or 4G")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
