"""Big messages on every door, written a part per turn: a gateway hands over a message past
``Limits.body_chunk_bytes`` and its endpoint writes it ``turn_write_bytes`` a turn (the store's chunks,
pzq/store/bodies.py), its answer in the turn of its last part; what its client sent after it waits behind
it, in order. (The native door has its own, older path: pzq/endpoints/native.py ``_commit_held``.)

Why: one 15 MiB record is one 15 MiB commit (and its packing, and a digest), and every client of that
turn waits for it; in parts, no commit carries much more than a turn's bytes, and other clients' work
goes between them.

The interface, for a gateway (``gateway.parts = Parted(broker, limits)``, one per gateway) and the
endpoint that drives it; an ``owner`` is whoever's order is kept (a connection, a ZeroMQ peer):

Gateway, for each request that may store a message:

- ``busy(owner)``: True while ``owner`` has a big message not yet stored, or requests waiting behind
  one: its next requests must wait too (``after``).
- ``big(size)``: True for a body past ``body_chunk_bytes``: hand it to ``write``.
- ``room(owner, size)``: whether ``size`` more bytes may wait for ``owner`` (a big body, or a request
  behind one): everything held stays under ``pipe_in_bytes``, and what waits behind an owner's big
  message under a quarter of it (the big message itself aside). A door that can say "busy" refuses
  when not; one that cannot (PHPMQ) stops reading while ``full`` instead.
- ``after(owner, act, size)``: run ``act(now_us)`` at once when ``owner`` is not busy (its answers are
  returned), else keep it to run once what is ahead of it is stored (its answers then come out of
  ``step``). ``act`` returns its client's error answer rather than raising one, and may ``write``.
- ``write(owner, body, Big(finish, refuse, fail, each))``: a big message, written by ``step``. In the
  turn of its last part ``finish(upload, now_us)`` stores its record (the broker's ``produce`` of the
  upload) or drops it (``drop_big``) and returns its answers; ``refuse(reason)`` answers it when the store has no
  room (StoreFull from the first part, a part, or ``finish``: nothing of it stays); ``fail()`` when a
  turn that wrote one of its parts was rolled back (its parts are gone); ``each(view)``, if given, sees
  every part as it is written (a digest computed a part at a time).

Endpoint:

- ``step(budget, now_us)`` once a turn after its reads (``work``): runs what waited behind stored big
  messages, then writes the next parts (at least one chunk, then while the turn's bytes last); returns
  the answers.
- ``writing``: a part was written since the endpoint's last flush (``flushed()`` resets it): the turn
  must commit (``Endpoint.waiting``), or the parts of several turns would gather in one commit.
- ``rolled_back()``: the turn failed: the answers of the big messages whose parts it lost.
- ``held_bytes`` (bodies not yet stored, ``bodies_bytes``, and what waits behind them), ``behind_of(owner)``,
  ``full`` (bodies past ``pipe_in_bytes``), ``settled()`` (owners whose waiting bytes went down since the
  last call): the memory bound's part and the shares of unfinished input.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Sequence

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.errors import StoreFull
from pzq.gateways.contract import BrokerSurface, Budget, Send
from pzq.store import Upload

Act = Callable[[int], list[Send]]  # a request kept behind a big message: run with the turn's now_us
OWNER_PART = 4  # what waits behind one owner's big message: this part of pipe_in_bytes at most


@dataclasses.dataclass(eq=False)
class Big:
    """What a gateway says about one big message: how to store it and how to answer it (see the module)."""

    finish: Callable[[Upload, int], list[Send]]
    refuse: Callable[[str], list[Send]]
    fail: Callable[[], list[Send]]
    each: Callable[[memoryview], None] | None = None


@dataclasses.dataclass(eq=False)
class _Job:
    owner: Hashable
    body: Sequence[bytes | bytearray | memoryview]
    size: int
    how: Big
    upload: Upload | None = None


class Parted:
    """Big messages of one gateway's clients, written a part per turn, and what waits behind them."""

    def __init__(self, broker: BrokerSurface, limits: Limits = DEFAULT_LIMITS):
        self.broker = broker
        self.chunk = limits.body_chunk_bytes
        self.most = limits.pipe_in_bytes  # bodies held in all (a door that cannot refuse stops reading)
        self.owner_most = limits.pipe_in_bytes // OWNER_PART
        self._jobs: collections.deque[_Job] = collections.deque()  # oldest first; one per owner at most
        self._writing_for: dict[Hashable, _Job] = {}
        self._behind: dict[Hashable, collections.deque[tuple[Act, int]]] = {}
        self._behind_bytes: dict[Hashable, int] = {}
        self._free: list[Hashable] = []  # owners whose big message is done, with requests behind it
        self._settled: set[Hashable] = set()
        self.bodies_bytes = 0
        self.waiting_bytes = 0  # of the requests behind big messages
        self.writing = False
        self.stored_total = 0  # big messages stored (or answered by ``finish``)
        self.refused_total = 0  # refused for want of room in the store

    # -- the gateway's side -----------------------------------------------------------------------

    def busy(self, owner: Hashable) -> bool:
        """True while ``owner`` has a big message not yet stored, or requests waiting behind one."""
        return owner in self._writing_for or owner in self._behind

    def big(self, size: int) -> bool:
        """True for a body that goes to ``write``: past one chunk (``body_chunk_bytes``)."""
        return size > self.chunk

    def room(self, owner: Hashable, size: int) -> bool:
        """Whether ``size`` more bytes may be held for ``owner`` (see the module)."""
        if self.bodies_bytes + self.waiting_bytes + size > self.most:
            return False
        return not self.busy(owner) or self.behind_of(owner) + size <= self.owner_most

    def after(self, owner: Hashable, act: Act, size: int, now_us: int) -> list[Send]:
        """Run ``act`` now if ``owner`` is not busy (its answers), else keep it, in order, for ``step``."""
        if not self.busy(owner):
            return act(now_us)
        self._behind.setdefault(owner, collections.deque()).append((act, size))
        self._behind_bytes[owner] = self._behind_bytes.get(owner, 0) + size
        self.waiting_bytes += size
        return []

    def write(self, owner: Hashable, body: Sequence[bytes | bytearray | memoryview], how: Big) -> None:
        """A big message of ``owner`` to write a part per turn (``step``), stored and answered as ``how`` says."""
        if owner in self._writing_for:
            raise ValueError("one big message per owner at a time: the next waits behind it (after)")
        job = _Job(owner, body, sum(map(len, body)), how)
        self._jobs.append(job)
        self._writing_for[owner] = job
        self.bodies_bytes += job.size

    # -- the endpoint's side ----------------------------------------------------------------------

    @property
    def held_bytes(self) -> int:
        """Everything held: the bodies not yet stored and the requests waiting behind them."""
        return self.bodies_bytes + self.waiting_bytes

    @property
    def pending(self) -> bool:
        """True while there is work for ``step``: parts to write, or requests to run that waited."""
        return bool(self._jobs or self._free)

    @property
    def full(self) -> bool:
        """True while the bodies not yet stored reach ``pipe_in_bytes``: a door that cannot refuse stops reading."""
        return self.bodies_bytes >= self.most

    def held_of(self, owner: Hashable) -> int:
        """Bytes held for ``owner``: its big message and what waits behind it."""
        job = self._writing_for.get(owner)
        return (job.size if job is not None else 0) + self._behind_bytes.get(owner, 0)

    def behind_of(self, owner: Hashable) -> int:
        """Bytes of ``owner``'s requests waiting behind its big message."""
        return self._behind_bytes.get(owner, 0)

    def settled(self) -> set[Hashable]:
        """The owners whose held bytes went down since the last call."""
        settled, self._settled = self._settled, set()
        return settled

    def flushed(self) -> None:
        """The turn's output left (its commit done): ``writing`` starts over."""
        self.writing = False

    def step(self, budget: Budget, now_us: int) -> list[Send]:
        """The turn's part (see the module): what waited behind stored messages runs, then parts are
        written (at least one chunk, then while ``budget``'s bytes last); the answers."""
        out = self._release(budget, now_us)
        wrote = False
        while self._jobs and not (wrote and budget.spent()):
            job = self._jobs[0]
            try:
                if job.upload is None:
                    job.upload = self.broker.begin_big(job.body, self.chunk)
                upload = job.upload
                start = upload.written * upload.chunk
                written = self.broker.write_big(upload, max(budget.bytes_left, 0))
                wrote = self.writing = True
                budget.take(written)
                if job.how.each is not None:
                    job.how.each(upload.data[start : start + written])
                if not upload.done:
                    break
                out += job.how.finish(upload, now_us)
                self.stored_total += 1
            except StoreFull as exc:
                if job.upload is not None:
                    self.broker.drop_big(job.upload)
                self.refused_total += 1
                out += job.how.refuse(str(exc))
            self._done(job)
        return out + self._release(budget, now_us)

    def rolled_back(self) -> list[Send]:
        """A turn that wrote parts failed: the store gave up every body being written (its earlier
        parts go with the next commit); each is answered ``fail``, and what waited behind it goes on."""
        out: list[Send] = []
        for job in [j for j in self._jobs if j.upload is not None]:
            self._jobs.remove(job)
            self._done(job, dequeued=True)
            out += job.how.fail()
        self.writing = False
        return out

    def _done(self, job: _Job, dequeued: bool = False) -> None:
        if not dequeued:
            self._jobs.popleft()
        del self._writing_for[job.owner]
        self.bodies_bytes -= job.size
        self._settled.add(job.owner)
        if job.owner in self._behind:
            self._free.append(job.owner)

    def _release(self, budget: Budget, now_us: int) -> list[Send]:
        """Run what waited behind big messages now stored, each owner's in order, while the turn lasts
        (the first always); an owner whose next request is big again waits for that one."""
        out: list[Send] = []
        ran = 0
        while self._free:
            owner = self._free[0]
            queue = self._behind.get(owner)
            while queue and owner not in self._writing_for and not (ran and budget.spent()):
                act, size = queue.popleft()
                self._behind_bytes[owner] -= size
                self.waiting_bytes -= size
                self._settled.add(owner)
                budget.take(size)
                ran += 1
                out += act(now_us)
            if queue and owner not in self._writing_for:  # (cut short by the turn: the rest next turn)
                break
            self._free.pop(0)
            if not queue:
                self._behind.pop(owner, None)
                self._behind_bytes.pop(owner, None)
        return out

    def stats(self) -> dict:
        """The monitor's figures."""
        return {
            "big_stored_total": self.stored_total,
            "big_refused_total": self.refused_total,
            "big_held_bytes": self.held_bytes,
        }
