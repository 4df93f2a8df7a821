"""Delivery counts not yet written: each taken message's count waits in memory for a commit, with a
journal so that a rolled-back turn undoes only its own changes.

Most deliveries are acked within a millisecond, and a count then never costs a write: the core's
commit writes only the counts still pending for messages still stored (``Core.commit``).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable

_MISSING = (-1, 0.0)  # (in the journal: the key had no pending count)


def run_all(calls: Iterable) -> None:
    """Run an iterator of calls made for their effect to its end, in C."""
    collections.deque(calls, 0)


class PendingCounts(dict[bytes, tuple[int, float]]):
    """Delivery counts not yet written (key -> (count, monotonic time of the delivery)), with a journal
    of what changed since ``mark()``. A rolled-back turn undoes only its own changes (``undo()``): its
    deliveries never left, but those of earlier turns did, and their counts must not be lost with it."""

    def __init__(self) -> None:
        super().__init__()
        self._undo: dict[bytes, tuple[int, float]] = {}

    def mark(self) -> None:
        """What ``undo()`` goes back to: a turn begins, or a commit made the counts so far durable."""
        self._undo.clear()

    def _note(self, key: bytes) -> None:
        if key not in self._undo:
            self._undo[key] = dict.get(self, key, _MISSING)

    def __setitem__(self, key: bytes, value: tuple[int, float]) -> None:
        self._note(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self._note(key)
        super().__delitem__(key)

    def pop(self, key: bytes, *default):
        if key in self:
            self._note(key)
        return super().pop(key, *default)

    def set_many(self, keys: list[bytes], values: Iterable[tuple[int, float]]) -> None:
        """``self[key] = value`` for each key and value (a take's run of counts), in one call and in C."""
        if self._undo:
            run_all(map(self._undo.setdefault, keys, map(self.get, keys, itertools.repeat(_MISSING))))
        else:  # (the usual first change of a turn: a dict of them at once)
            self._undo = dict(zip(keys, map(self.get, keys, itertools.repeat(_MISSING)), strict=True))
        dict.update(self, zip(keys, values, strict=True))

    def set_new(self, keys: list[bytes], value: tuple[int, float]) -> None:
        """``self[key] = value`` for each of ``keys``, none of which has a pending count (a run of first
        deliveries): one shared value, with no object per key."""
        if self._undo:
            run_all(map(self._undo.setdefault, keys, itertools.repeat(_MISSING)))
        else:
            self._undo = dict.fromkeys(keys, _MISSING)
        dict.update(self, dict.fromkeys(keys, value))

    def pop_many(self, keys: list[bytes]) -> None:
        """``self.pop(key, None)`` for each key (an ack run's counts), in one call and in C."""
        olds = list(map(dict.pop, itertools.repeat(self), keys, itertools.repeat(_MISSING)))
        run_all(map(self._undo.setdefault, keys, olds))  # (the first change of a key is the one kept)

    def undo(self) -> None:
        """Put back every count as it was at ``mark()``."""
        for key, value in self._undo.items():
            if value is _MISSING:
                super().pop(key, None)
            else:
                super().__setitem__(key, value)
        self._undo.clear()
