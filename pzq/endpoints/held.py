"""Output kept until the commit it depends on is on disk: generations of a turn's sends, by commit.

With one synchronous write a commit (pzq/store/environment.py), commit N's meta page reaches the disk with
commit N+1's data sync, or with a sync of its own. An endpoint that holds its output (``holds_output``)
keeps each turn's sends in a generation named by the last commit (``hold``), and lets them go, in order,
once the loop says that commit is on disk (``release``): the sends of the busy native sockets never wait
for a second sync, while a lone producer's ack waits for the sync the loop makes before it would sleep.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Held(Generic[T]):
    """Sends kept per commit, oldest first."""

    def __init__(self) -> None:
        self._generations: collections.deque[tuple[int, list[T]]] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._generations)

    def hold(self, commit: int, sends: list[T]) -> None:
        """Keep ``sends`` (taken over: the caller starts a new list) until ``commit`` is on disk."""
        if not sends:
            return
        if self._generations and self._generations[-1][0] == commit:  # (turns that did not commit)
            self._generations[-1][1].extend(sends)
        else:
            self._generations.append((commit, sends))

    def release(self, durable: int, before: list[T]) -> list[T]:
        """What was held for commits up to ``durable``, in order, followed by ``before`` (the sends not
        held: none when the loop held the turn's output first)."""
        if not self._generations or self._generations[0][0] > durable:
            return before
        out: list[T] = []
        while self._generations and self._generations[0][0] <= durable:
            out += self._generations.popleft()[1]
        return out + before if before else out

    def keep(self, still: Callable[[list[T]], list[T]]) -> None:
        """Keep of each generation what ``still`` returns (deliveries the broker still counts in flight)."""
        for _, sends in self._generations:
            sends[:] = still(sends)
