"""Each queue's rates in and out (messages a second over the last ten seconds), from samples of its
counters that the admin's tick takes with the head ages (the same share of queues a tick).

A queue's ``next_seq`` counts every record ever stored into it (a produce, and a dead letter requeued:
it is stored again, under a new seq) and its ``count`` every record still stored (ready and in flight).
So ``next_seq`` is what came in, and ``next_seq - count`` what went out for good: acked, dead-lettered
(expired or out of deliveries), purged. A delivery, a nack or a redelivery moves neither. Exact, with no
counter of our own to keep in step with the broker's verbs.

Bounded: one array of ``SLOTS`` samples a queue the store has (its count of queues is bounded by
``--max-queues``; 20 doubles, about 300 bytes with its dict entry: 3 MB at 10,000 queues), dropped
when the queue goes; O(1) work a sample and a row. Pure: the tick hands in its clock."""

from __future__ import annotations

import array

from pzq.store import QueueInfo

WINDOW_S = 10.0  # the rates are over the last ten seconds (10 to 11 s: samples are ~2 s apart)
STEP_S = 1.5  # a sample is kept (in the ring) at most every ~2 s of one-second ticks
SLOTS = 6  # 6 samples 2 s apart span the window
_HEAD = 4  # qid, the last slot written, in_per_s, out_per_s; then SLOTS x (t, in, out)


class QueueRates:
    """The rates of every queue sampled, by name."""

    def __init__(self) -> None:
        self._rings: dict[str, array.array] = {}

    def sample(self, info: QueueInfo, now: float) -> None:
        """Take ``info``'s counters at ``now`` (seconds, any one clock), and its rates since the sample
        kept ten seconds before. A queue sampled for less than that counts from its oldest sample over
        the ten seconds (a new queue had none of it before; after a restart the rate climbs to the truth
        within ten seconds rather than showing one second's burst as a rate)."""
        came, went = float(info.next_seq), float(info.next_seq - info.count)
        ring = self._rings.get(info.name)
        if ring is None or ring[0] != info.qid:  # (new, or deleted and made again under the same name)
            ring = self._rings[info.name] = array.array(
                "d", [info.qid, 0.0, 0.0, 0.0, now, came, went] + [-1.0] * 3 * (SLOTS - 1)
            )
            return
        last = int(ring[1])
        base = None  # the newest sample at least WINDOW_S old, else the oldest
        for k in range(1, SLOTS + 1):  # (oldest first, around the ring)
            at = _HEAD + 3 * ((last + k) % SLOTS)
            if ring[at] < 0:
                continue
            if base is None or ring[at] <= now - WINDOW_S:
                base = at
        if base is not None:
            seconds = max(now - ring[base], WINDOW_S)
            ring[2] = round(max(0.0, came - ring[base + 1]) / seconds, 2)
            ring[3] = round(max(0.0, went - ring[base + 2]) / seconds, 2)
        if now - ring[_HEAD + 3 * last] >= STEP_S:
            last = (last + 1) % SLOTS
            ring[1] = last
            ring[_HEAD + 3 * last : _HEAD + 3 * last + 3] = array.array("d", (now, came, went))

    def of(self, name: str) -> tuple[float, float]:
        """(in_per_s, out_per_s) of queue ``name`` as of its last sample (0.0 before it has two)."""
        ring = self._rings.get(name)
        return (0.0, 0.0) if ring is None else (ring[2], ring[3])

    def forget(self, gone) -> None:
        """Drop the samples of the queues for which ``gone(name)`` is true."""
        for name in [name for name in self._rings if gone(name)]:
            del self._rings[name]

    def __len__(self) -> int:
        return len(self._rings)
