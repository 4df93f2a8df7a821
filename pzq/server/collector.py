"""The garbage collector under the loop's rule: a full collection never holds a turn for long.

CPython's full collection walks every object the collector tracks; a server holding tens of thousands
of deliveries in flight paid 8 to 19 ms for each (measured in the late-acker torture case: the longest
turns were these, in the middle of a take or a flush). Nearly every object it walks is long-lived and
freed by reference counting when it goes (pzq's tables hold no cycles). So whatever survived start-up
and each full collection is frozen (``gc.freeze``): the next full collection walks only what was made
since. Frozen objects that become cyclic garbage are not collected until a whole collection: one runs
every ``whole_s`` seconds (``--gc-whole-interval``), which costs one such pause that often instead of
one every few seconds.

A whole walk cannot be cut into slices (CPython walks every tracked object in one call), so its cost is
kept down at the root: pzq's big tables are held in objects the collector does not track (MQKS's
million bindings are strings and tuples: 880,000 of them had made the whole walk 200-260 ms, now a few
ms). And it is guarded: before each whole walk its time is estimated from the objects frozen and the
least a walk measured one to cost (the loop thread's CPU time: a busy machine's waits are not the heap's);
one estimated past ``most_s`` (``Limits.gc_whole_most_s``) is put off and logged, so that a heap grown
big in objects the collector tracks leaves cyclic garbage waiting (pzq's tables make none), and never
holds a turn for hundreds of ms.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("pzq.server")

SLOW_TURNS_MS = (50, 100, 1000)  # the turn lengths STATS counts the turns past (etcd's calls never make one)
FIRST_GUESS_S = 100e-9  # a frozen object's cost in a whole walk before one was measured (30-300 ns)


class Collector:
    """Freezes what survives; the loop calls ``turn_ends`` after each turn."""

    def __init__(self, whole_s: float, most_s: float = float("inf")):
        self.whole_s = whole_s
        self.most_s = most_s  # a whole walk estimated to take longer is put off
        self._full = False  # a full collection ran since the last turn's end
        self._next_whole = 0.0
        self._per_object = FIRST_GUESS_S  # seconds per frozen object, the least a walk measured
        self._measured: float | None = None
        self.whole_total = 0  # whole collections run (tests count them)
        self.put_off_total = 0  # whole collections put off: estimated past ``most_s``
        self.whole_last_s = 0.0  # how long the last whole walk took
        self.frozen = 0  # objects frozen when the last whole walk was weighed
        self.turn_began = 0.0  # the loop sets it after its poll: a turn's length is its work, not its wait
        self.longest_turn_s = 0.0
        self.turns_over = dict.fromkeys(SLOW_TURNS_MS, 0)  # turns longer than 50, 100, 1000 ms

    def start(self, now: float) -> None:
        """After start-up: what the server made so far is frozen, and full collections are watched.
        (A second walk, of what survived the first, measures what a frozen object costs: the first also
        frees start-up's garbage.)"""
        gc.collect()
        self._walk(None)
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
        """Freeze what a full collection of this turn left; a whole collection when one is due (and
        estimated short enough)."""
        took = now - self.turn_began if self.turn_began else 0.0
        if took > self.longest_turn_s:
            self.longest_turn_s = took
        for ms in SLOW_TURNS_MS:
            self.turns_over[ms] += took * 1000 > ms
        if now >= self._next_whole:
            self._next_whole = now + self.whole_s
            self._whole()
        if self._full:
            self._full = False
            gc.freeze()

    def _whole(self) -> None:
        self.frozen = gc.get_freeze_count()  # (a walk of the frozen list alone: no object is looked into)
        estimate = self.frozen * self._per_object
        if estimate > self.most_s:
            self.put_off_total += 1
            log.warning(
                "the garbage collector's whole walk is put off: %d objects frozen, about %.0f ms at %.0f ns "
                "each (more than %.0f ms); cyclic garbage among them waits (%d put off so far)",
                self.frozen,
                estimate * 1000,
                self._per_object * 1e9,
                self.most_s * 1000,
                self.put_off_total,
            )
            return
        self._walk(self.frozen)
        self.whole_total += 1

    def _walk(self, frozen: int | None) -> None:
        """Walk everything, freeze what survives, and learn what each of the ``frozen`` objects cost
        (counted after the walk when None: counting is a walk of the list, about 8 ms a million)."""
        started = time.thread_time()  # (the loop's own CPU: a busy machine's waits are not the heap's cost)
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.whole_last_s = time.thread_time() - started
        count = gc.get_freeze_count() if frozen is None else frozen
        measured = max(self.whole_last_s / max(count, 1), 1e-9)
        # (the least seen: what an object of this heap costs; a walk slowed by a busy machine must not
        # make every later one look too long to run)
        self._per_object = measured if self._measured is None else min(self._measured, measured)
        self._measured = self._per_object
        self._full = False

    def stats(self) -> dict:
        """The monitor's figures."""
        return {
            "whole_total": self.whole_total,
            "whole_put_off_total": self.put_off_total,
            "whole_last_ms": round(self.whole_last_s * 1000, 3),
            "frozen_objects": self.frozen,
            "longest_turn_ms": round(self.longest_turn_s * 1000, 3),
            **{f"turns_over_{ms}ms_total": count for ms, count in self.turns_over.items()},
        }
