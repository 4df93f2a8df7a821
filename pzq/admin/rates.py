"""Each queue's rates in and out (messages a second over the last ten seconds), from samples of its
counters that the admin's tick takes with the head ages (the same share of queues a tick).

A queue's ``next_seq`` counts every record ever stored into it (a produce, and a dead letter requeued:
it is stored again, under a new seq) and its ``count`` every record still stored (ready and in flight).
So ``next_seq`` is what came in, and ``next_seq - count`` what went out for good: acked, dead-lettered
(expired or out of deliveries), purged. A delivery, a nack or a redelivery moves neither. Exact, with no
counter of our own to keep in step with the broker's verbs.

Bounded: one ring of ``SLOTS`` samples a queue the store has (its count of queues is bounded by
``--max-queues``; a list of 27 numbers, about 1 KB with them and its dict entry, measured: 10 MB at
10,000 queues), dropped when the queue goes; O(1) work a sample and a row. Pure: the tick hands in its
clock."""

from __future__ import annotations

from pzq.store import QueueInfo

WINDOW_S = 10.0  # the rates are over ten seconds (to 12 s) ending at the queue's last sample (~2 s ago at most)
STEP_S = 1.5  # a sample is taken at most every ~2 s of one-second ticks (the ticks between cost a look)
SLOTS = 7  # 7 samples 2 s apart span 12 s: the one ten seconds old is never the next overwritten
# qid, the base slot (the newest sample at least WINDOW_S old), the last slot written, in_per_s,
# out_per_s, the last sample's time; then SLOTS x (t, in, out)
_HEAD = 6
_EMPTY = [-1.0] * 3 * (SLOTS - 1)


class QueueRates:
    """The rates of every queue sampled, by name."""

    def __init__(self) -> None:
        self._rings: dict[str, list] = {}

    def sample(self, info: QueueInfo, now: float) -> None:
        """Take ``info``'s counters at ``now`` (seconds, any one clock), and its rates since the sample
        kept ten seconds before. A queue sampled for less than that counts from its oldest sample over
        the ten seconds (a new queue had none of it before; after a restart the rate climbs to the truth
        within ten seconds rather than showing one second's burst as a rate). O(1): the base slot only
        moves on, and a tick within STEP_S of the last sample only looks (a walk of the ring at every
        tick cost 2.6 us a queue, 2.6 ms a tick of 1,000 queues; now 0.3 us a look, about 1 us a sample)."""
        ring = self._rings.get(info.name)
        if ring is None or ring[0] != info.qid:  # (new, or deleted and made again under the same name)
            came = info.next_seq
            self._rings[info.name] = [info.qid, 0, 0, 0.0, 0.0, now, now, came, came - info.count, *_EMPTY]
            return
        if now - ring[5] < STEP_S:
            return
        came = info.next_seq
        went = came - info.count
        base, last = ring[1], ring[2]
        old = now - WINDOW_S
        while base != last:  # (on to the newest sample at least ten seconds old)
            following = base + 1 if base + 1 < SLOTS else 0
            if ring[_HEAD + 3 * following] > old:
                break
            base = following
        at = _HEAD + 3 * base
        seconds = now - ring[at]
        hundredths = (seconds if seconds > WINDOW_S else WINDOW_S) / 100
        # (to two decimals, half up: both counts only grow; round() was a third of a sample's time)
        ring[3] = int((came - ring[at + 1]) / hundredths + 0.5) / 100
        ring[4] = int((went - ring[at + 2]) / hundredths + 0.5) / 100
        last = last + 1 if last + 1 < SLOTS else 0
        if last == base:  # (the ring spans less than the window, samples sparse: the oldest goes)
            base = base + 1 if base + 1 < SLOTS else 0
        at = _HEAD + 3 * last
        ring[at], ring[at + 1], ring[at + 2] = now, came, went
        ring[1], ring[2], ring[5] = base, last, now

    def of(self, name: str) -> tuple[float, float]:
        """(in_per_s, out_per_s) of queue ``name`` as of its last sample (0.0 before it has two)."""
        ring = self._rings.get(name)
        return (0.0, 0.0) if ring is None else (ring[3], ring[4])

    def names(self) -> list[str]:
        """The names of the queues sampled."""
        return list(self._rings)

    def drop(self, name: str) -> None:
        """Forget queue ``name``'s samples (it went)."""
        self._rings.pop(name, None)

    def __len__(self) -> int:
        return len(self._rings)
