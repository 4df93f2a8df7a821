"""Durable leases by sequence range, per consumer group: what a Spark query reads a queue through.

A stream processor such as Spark plans a batch (its start and end offsets are written to its
checkpoint), runs it, and acknowledges the batch only when it plans the next one, possibly minutes
later, possibly after its driver restarted. So the queue must hand out messages in ranges that can be
read again, identically, until they are acknowledged. A group does that:

- ``lease(after, max)`` takes the next ready messages of the queue and numbers them with the group's
  own consecutive *lease seqs* (a Spark offset is a lease seq). It is idempotent: asking again from
  the same ``after`` returns the leases already made instead of taking more.
- ``fetch(lo, hi)`` returns the messages leased as ``lo .. hi-1``, read-only, as often as asked, with
  the delivery count they had when they were leased.
- ``ack_upto(seq)`` deletes every leased message below ``seq`` for good (idempotent).

Leases are kept by range: a group's record is a *run* of consecutive queue seqs leased as consecutive
lease seqs (store/groups.py), and the broker holds each run as one range, not one in-flight entry per
message. Leased messages are held exclusively (no other consumer gets them, and another client's late
ack, nack, requeue or dead-letter of one is refused), across restarts too: ``load()`` holds the runs
again. ``ack_upto`` moves the group's base durably at once and deletes the runs below it with a cursor,
a few thousand messages per turn (``work``). A group that nobody has called for ``timeout`` seconds is
expired: its unacknowledged messages return to their queue over the next turns, lowest leases first,
with their delivery count raised, and a later fetch of that range reports them as ``gone``.
"""

from pzq.leases.calls import Leases
from pzq.leases.returns import Group

__all__ = ["Group", "Leases"]
