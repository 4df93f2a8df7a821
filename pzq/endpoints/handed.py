"""Bytes handed to libzmq for a payer, charged to its share until libzmq is done with them.

A frame sent zero-copy stays a Python buffer until libzmq frees it: once every connection it was for has
taken it into the kernel, or its pipe was dropped with a peer that went. pyzmq then gives the buffer back
from its garbage-collector thread; a weak reference to the memoryview each frame is built on tells that
moment exactly. Its callback (in that thread) only queues it; ``collect`` (the loop, once a turn) takes
the bytes off the payer's charge in the delivery accounts (its ``Account.charge``, pzq/broker/accounts.py),
which the memory bound counts with the deliveries. So what a peer that reads nothing leaves in a pipe is
charged to whoever it was for until it is known to be gone, not until some timeout: an eMQP PUBLISH to
its publisher (a PUB copies nothing per subscriber: one buffer is shared by every pipe), a worker's REPLY
to the client it is passed on to.

Frames under ``SMALL`` bytes (a topic, an envelope, a msgid) are copied as usual and not charged: a pipe
holds at most its SNDHWM of them.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Hashable, Sequence

import zmq

from pzq.gateways.contract import Account, BrokerSurface

SMALL = 64


class Handed:
    """Frames handed to libzmq whose bytes stay charged to their payer until libzmq frees them."""

    def __init__(self, broker: BrokerSurface):
        self.broker = broker
        # id(weak reference) -> (the reference, its payer's account, bytes); weak references to equal
        # buffers compare equal, so they are kept by identity
        self._live: dict[int, tuple[weakref.ref, Account, int]] = {}
        self._freed: collections.deque[weakref.ref] = collections.deque()  # (appended by pyzmq's gc thread)
        self.bytes = 0  # handed to libzmq and not freed yet
        self.total = 0  # ever handed

    def room(self, payer: Hashable, size: int) -> bool:
        """Whether ``payer``'s share has room for ``size`` bytes more (a payer that holds nothing may have
        one message, whatever its size, while the memory bound allows it: the accounts' rule)."""
        return self.broker.account(payer).may_hand(size)

    def frames(self, payer: Hashable, frames: Sequence[bytes]) -> list:
        """``frames`` to send zero-copy, their bytes charged to ``payer`` from now until libzmq frees them
        (a send that fails frees them at once)."""
        out: list = []
        for frame in frames:
            size = len(frame)
            if size < SMALL:
                out.append(frame)
                continue
            view = memoryview(frame)
            ref = weakref.ref(view, self._freed.append)
            account = self.broker.account(payer)
            account.charge(size)
            self._live[id(ref)] = (ref, account, size)
            self.bytes += size
            self.total += size
            out.append(zmq.Frame(view, copy=False))
        return out

    def collect(self) -> int:
        """Take what libzmq freed since the last call off its payers' charges; returns the bytes."""
        freed = 0
        while self._freed:
            _, account, size = self._live.pop(id(self._freed.popleft()))
            self.bytes -= size
            freed += size
            account.charge(-size)
        return freed
