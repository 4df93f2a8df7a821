"""The garbage collector under the loop's rule: a full collection never holds a turn for long.

CPython's full collection walks every object the collector tracks; a server holding tens of thousands
of deliveries in flight paid 8 to 19 ms for each (measured in the late-acker torture case: the longest
turns were these, in the middle of a take or a flush). Nearly every object it walks is long-lived and
freed by reference counting when it goes (pzq's tables hold no cycles). So whatever survived start-up
and each full collection is frozen (``gc.freeze``): the next full collection walks only what was made
since. Frozen objects that become cyclic garbage are not collected until a whole collection: one runs
every ``whole_s`` seconds (``Limits.gc_whole_s``), which costs one such pause that often instead of
one every few seconds.
"""

from __future__ import annotations

import gc


class Collector:
    """Freezes what survives; the loop calls ``turn_ends`` after each turn."""

    def __init__(self, whole_s: float):
        self.whole_s = whole_s
        self._full = False  # a full collection ran since the last turn's end
        self._next_whole = 0.0
        self.whole_total = 0  # whole collections run (tests count them)

    def start(self, now: float) -> None:
        """After start-up: what the server made so far is frozen, and full collections are watched."""
        gc.collect()
        gc.freeze()
        self._next_whole = now + self.whole_s
        if self._collected not in gc.callbacks:
            gc.callbacks.append(self._collected)

    def stop(self) -> None:
        """The server closes: the collector is as it was (tests run servers one after another)."""
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        gc.unfreeze()

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "stop" and info.get("generation") == 2:
            self._full = True  # (frozen after the turn: not from inside the collector)

    def turn_ends(self, now: float) -> None:
        """Freeze what a full collection of this turn left; a whole collection when one is due."""
        if now >= self._next_whole:
            self._next_whole = now + self.whole_s
            gc.unfreeze()
            gc.collect()
            self.whole_total += 1
            self._full = True
        if self._full:
            self._full = False
            gc.freeze()
