"""``Tally``: a dict that counts, per queue name, the values that name it, so that a gateway answers
the broker's "do you still use this queue?" (``uses_queue``, see pzq/broker/implicit.py) in O(1), not by
walking every worker or schedule it keeps."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Tally(dict[K, V], Generic[K, V]):
    """A dict of values, each naming some queues (``names(value)``); ``counts[queue]`` is how many
    values name ``queue``. Values must not change the queues they name in place: store a new one."""

    def __init__(self, names: Callable[[V], Iterable[str]], items: dict[K, V] | None = None):
        super().__init__()
        self._names = names
        self.counts: collections.Counter[str] = collections.Counter()
        for key, value in (items or {}).items():
            self[key] = value

    def __setitem__(self, key: K, value: V) -> None:
        self.pop(key, None)
        super().__setitem__(key, value)
        self.counts.update(set(self._names(value)))

    def __delitem__(self, key: K) -> None:
        self._forget(super().pop(key))

    def pop(self, key, *default):
        if key in self:
            value = super().pop(key)
            self._forget(value)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self._forget(value)
        return key, value

    def clear(self) -> None:
        super().clear()
        self.counts.clear()

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def _forget(self, value: V) -> None:
        for name in set(self._names(value)):
            self.counts[name] -= 1
            if self.counts[name] <= 0:
                del self.counts[name]
