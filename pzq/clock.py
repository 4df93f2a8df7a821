"""The turn's time: one ``Now`` (monotonic seconds and wall-clock µs, read together) handed to all of a turn.

Two clocks, because they answer different questions. ``mono`` (``time.monotonic()``, seconds) measures:
deadlines, ack timeouts, waits, rates; it never jumps, so an NTP step cannot expire every delivery at once.
``wall_us`` (``time.time_ns() // 1000``, µs since the epoch) is what a record carries and a client reads:
enqueued and expiry stamps, schedules, a message's age on a restart; it survives the process, the
monotonic clock does not. The server loop reads both once a turn (``Now.read()``) and hands the same value
to every endpoint, gateway and chore of that turn, so one turn's work agrees on when it happened; a test
makes its own (``Now(mono=5.0, wall_us=T0)``). Nothing of pzq is imported: every layer may take one.
"""

from __future__ import annotations

import time
from typing import NamedTuple


class Now(NamedTuple):
    """One moment on both clocks: ``mono`` monotonic seconds (for durations), ``wall_us`` wall-clock µs
    (for the stamps records carry). Immutable; a turn reads one and passes it on."""

    mono: float
    wall_us: int

    @classmethod
    def read(cls) -> Now:
        """Both clocks, read one right after the other (a few hundred ns apart)."""
        return cls(time.monotonic(), time.time_ns() // 1000)
