"""How the console shows a number: rounded in a unit for the eye (``show``: ``268435456`` bytes is
``256 MiB``), exact in the cell's title for the hover (``exact``). The JSON twins carry the numbers as
numbers and each figure's unit apart (``units``); console.js formats them by the same rules, so a page
updated in place looks as it did when it was rendered.

Units: ``count`` (a whole number, or two decimals), ``msg/s``, ``bytes``, ``s`` and ``ms`` (durations),
``time_us`` (epoch microseconds, shown as UTC), ``text`` (as it is)."""

from __future__ import annotations

import datetime
from typing import Any

UNITS = ("count", "msg/s", "bytes", "s", "ms", "time_us", "text")


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(value: Any) -> str:
    if not is_number(value):
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:,.2f}"


def size(value: Any) -> str:
    """Bytes in the largest binary unit under 1,024 of it: ``1.5 KiB``, ``256 MiB`` (one decimal at most)."""
    if not is_number(value):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{value:,.0f} B"
            text = f"{value:,.1f}"
            return f"{text.removesuffix('.0')} {unit}"
        value /= 1024
    return "-"


def duration(value: Any) -> str:
    """Seconds: ``850 ms``, ``12.5 s``, ``4.2 min``, ``3.1 h``, ``2.0 d``."""
    if not is_number(value):
        return "-"
    if value == 0:
        return "0 s"
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    for limit, unit, per in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if abs(value) < limit:
            return f"{value / per:.1f} {unit}".replace(".0 ", " ") if unit != "s" else f"{value:.1f} s"
    return f"{value / 86400:,.1f} d"


def when(us: Any) -> str:
    """An epoch time in µs as UTC text ("-" for 0 or nothing: not known)."""
    if not is_number(us) or us <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def show(value: Any, unit: str = "count") -> str:
    """``value`` rounded for a cell or a figure, with its unit."""
    if unit == "text":
        return "-" if value is None or value == "" else str(value)
    if not is_number(value):
        return "-"
    if unit == "bytes":
        return size(value)
    if unit == "s":
        return duration(value)
    if unit == "ms":
        return f"{value:.2f} ms" if abs(value) < 10 else f"{number(value)} ms"
    if unit == "time_us":
        return when(value)
    if unit == "msg/s":
        return f"{number(value)} msg/s"
    return number(value)


def exact(value: Any, unit: str = "count") -> str:
    """``value`` in full, for a cell's title ("" where the shown text is already exact)."""
    if not is_number(value) or unit in ("text", "time_us"):
        return ""
    text = f"{int(value):,}" if float(value).is_integer() else f"{value:,}"
    names = {"count": "", "bytes": " bytes", "s": " s", "ms": " ms", "msg/s": " msg/s"}
    return text + names.get(unit, "")


def unit_of(key: str) -> str:
    """The unit of a gateway's figure or a client list's column, from its name (pzq's naming: ``_bytes``,
    ``_s``, ``_ms``, ``_us``)."""
    if key.endswith(("bytes", "_size", "bytes_all")) or "bytes_" in key:
        return "bytes"
    if key.endswith(("_us", "since")):
        return "time_us"
    if key.endswith(("_per_s", "_rate")):
        return "msg/s"
    if key.endswith("_ms"):
        return "ms"
    if key.endswith(("_s", "s ago", "seconds")):
        return "s"
    return "count"
