"""The batched consumers' table (PZQ-BATCH/1): who is known, least recently heard first; their share of
the consumer slots per CURVE key; the connection each came over; and forgetting them, for silence, to
make room, or because they are gone (what they held goes back through the broker).

At most ``Limits.consume_max_consumers`` are known at once, shared per CURVE key as every pool is
(``ClientShares``: a key holds at most an eighth of them, and the last eighth is kept for keys that hold
none; without a key each consumer is its own client). A HELLO past its key's part evicts the least
recently heard of its own consumers that holds nothing and has no credit; a HELLO past the whole pool
evicts anyone's such consumer (it costs nothing to forget: its next command is answered "hello-first");
if there is none, it is refused. ROUTER does not report a consumer that left; over tcp:// the socket
monitor does (``disconnected``: what it held goes back at once). Otherwise a consumer silent for
``Limits.consume_idle_s`` loses its credit, and is forgotten once it holds nothing (``sweep``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pzq.config import ClientShares, Limits
from pzq.gateways.contract import BrokerSurface

HOLDER = "native-batch"  # the broker holder of a consumer is (HOLDER, its routing id)
SWEEP_LOOK = 64  # consumers one sweep (or one eviction search) looks at: a bounded share


class Consumer:
    """One consumer: its credit, when it was last heard, its connection and its CURVE key. (What its pipe
    holds is in the broker's byte account: the bodies of its deliveries, its holder's.)"""

    __slots__ = ("peer", "holder", "credit", "seen", "ringed", "fd", "user", "reader")

    def __init__(self, peer: bytes, now: float, user: str | None = None):
        self.peer = peer
        self.holder: Hashable = (HOLDER, peer)
        self.credit = 0
        self.seen = now
        self.ringed = False  # in the gateway's ring of consumers to serve (at most once)
        self.fd = -1  # the descriptor of its connection, as the socket monitor knows it (-1: not known)
        self.user = user  # its CURVE key (z85), if the endpoint is a CURVE server
        self.reader = False  # it showed it reads its DELIVERs (it settled a key of one)

    @property
    def client(self) -> Hashable:
        """Whose share of the consumer slots it draws on: its CURVE key, or itself without one."""
        return self.user if self.user is not None else self.peer


class Consumers:
    """The known consumers of the batched endpoint (``known``: by routing id, least recently heard first)."""

    def __init__(self, broker: BrokerSurface, limits: Limits):
        self.broker = broker
        self.limits = limits
        self.known: dict[bytes, Consumer] = {}
        self.slots = ClientShares(limits.consume_max_consumers, limits)  # (per CURVE key, see the docstring)
        # Connection descriptor -> the consumer whose commands came over it: kept after a consumer is forgotten
        # for silence, so that its stale copies (pzq/broker/accounts.py) are released when the connection goes
        self._fds: dict[int, bytes] = {}
        self.evicted_total = self.forgotten_total = 0

    def heard(self, peer: bytes, now: float) -> Consumer | None:
        """``peer`` sent a command: now its most recently heard (None if it is not known)."""
        consumer = self.known.get(peer)
        if consumer is not None:
            consumer.seen = now
            self.known[peer] = self.known.pop(peer)
        return consumer

    def admit(self, peer: bytes, now: float, user: str | None) -> Consumer | str:
        """A new consumer (a HELLO), evicting an idle one where its key's part or the pool is full; the
        refusal's detail if none may go."""
        consumer = Consumer(peer, now, user)
        client = consumer.client
        refusal = self.slots.refusal(client, len(self.known))
        if refusal is not None and not self._evict_one(client):  # (its own idle one makes room)
            return f"{refusal}, each holding deliveries or credit"
        most = self.limits.consume_max_consumers
        if len(self.known) >= most and not self._evict_one():
            known = len(self.known)
            return f"{known} consumers are known (at most {most}) and each holds deliveries or credit: try again later"
        self.known[peer] = consumer
        self.slots.add(client)
        return consumer

    def _evict_one(self, client: Hashable = None) -> bool:
        """Forget the least recently heard consumer (of ``client``, if given) that holds nothing and has no
        credit (among the first SWEEP_LOOK looked at); False if there is none."""
        looked = 0
        for consumer in list(self.known.values()):
            if client is not None and consumer.client != client:
                continue
            if consumer.credit == 0 and self.broker.deliveries.count(consumer.holder) == 0:
                self.forget(consumer)
                self.evicted_total += 1
                return True
            looked += 1
            if looked >= SWEEP_LOOK:
                break
        return False

    def sweep(self, now: float) -> None:
        """Consumers silent for consume_idle_s lose their credit; those that hold nothing are forgotten
        (a bounded share a call: the least recently heard first)."""
        idle = self.limits.consume_idle_s
        for _ in range(min(SWEEP_LOOK, len(self.known))):
            consumer = next(iter(self.known.values()))
            if now - consumer.seen < idle:
                return
            consumer.credit = 0
            if self.broker.deliveries.count(consumer.holder) == 0:
                self.forget(consumer, gone=False)
                self.forgotten_total += 1
            else:  # (it holds deliveries: its ack timeouts bring them back; looked at again later)
                consumer.seen = now
                self.known[consumer.peer] = self.known.pop(consumer.peer)

    def next_sweep(self) -> float | None:
        """When the least recently heard consumer becomes idle."""
        if not self.known:
            return None
        return next(iter(self.known.values())).seen + self.limits.consume_idle_s

    # -- consumers whose connection closed (tcp://: the socket monitor says so) ------------------------

    def known_connections(self, came: Sequence[tuple[bytes, int, str | None]]) -> bool:
        """True if each (consumer, descriptor, CURVE key) came over the connection already mapped to its
        consumer, or from a consumer not known (``connection`` would change nothing for any of them)."""
        known = self.known
        for peer, fd, _ in came:
            consumer = known.get(peer)
            if consumer is not None and consumer.fd != fd and fd >= 0:
                return False
        return True

    def connection(self, peer: bytes, fd: int, user: str | None = None) -> None:
        """Commands of ``peer`` came over the open connection of descriptor ``fd`` (with CURVE key ``user``)."""
        consumer = self.known.get(peer)
        if consumer is None:
            return
        if fd < 0 or consumer.fd == fd:
            return
        self._fds[fd] = peer
        consumer.fd = fd

    def disconnected(self, fd: int) -> None:
        """The connection of descriptor ``fd`` closed: its consumer is gone, and what it held goes back to
        the queue at once (not at its ack timeouts)."""
        peer = self._fds.pop(fd, None)
        if peer is not None:
            self.gone(peer, counted=True)

    def gone(self, peer: bytes, *, counted: bool = False) -> int:
        """``peer`` is gone (BYE; a DELIVER it could not be sent, ``counted`` as forgotten): what it held
        goes back to the queue, and it is forgotten; returns how many deliveries went back."""
        returned = self.broker.gone((HOLDER, peer))
        consumer = self.known.get(peer)
        if consumer is not None:
            self.forget(consumer, gone=True)
            self.forgotten_total += counted
        return returned

    def revoke(self, users: set[str]) -> int:
        """These CURVE keys were revoked: their consumers are forgotten (no more deliveries to them) and
        what they held goes back to the queue; returns how many consumers."""
        gone = [c for c in self.known.values() if c.user is not None and c.user in users]
        for consumer in gone:
            self.broker.gone(consumer.holder)
            self.forget(consumer, gone=True)
        return len(gone)

    def forget(self, consumer: Consumer, *, gone: bool = False) -> None:
        """Forget ``consumer``; ``gone``: its connection closed (or it said BYE, or was revoked), and
        ``BrokerSurface.gone`` released what it held. Forgotten for silence or to make room, it holds
        nothing in flight, but copies of deliveries that timed out may still sit in its pipe: they stay
        charged to it until its connection closes (over ipc://, where no connection is known, now)."""
        if gone and self._fds.get(consumer.fd) == consumer.peer:
            del self._fds[consumer.fd]
        elif not gone and consumer.fd < 0:
            self.broker.gone(consumer.holder)  # (it holds nothing in flight: its charges)
        if self.known.pop(consumer.peer, None) is consumer:
            self.slots.add(consumer.client, -1)
        consumer.credit = 0  # (its ring entry is skipped, then dropped)
