"""Gateway pairs: each protocol's gateway on a real Store and Broker, facing clients that speak its client
codec from pzq/protocols, with no socket in between (in the manner of h11's connection pairs and
uvicorn's parametrized protocol tests). Time moves only when a test moves it (``pair.clock.advance``).

    pair = Pair(PAIRS["mqks"], store)
    a, b = pair.client("a"), pair.client("b")
    tag = a.produce("q", b"m")
    pair.turn()                      # read, dispatch, commit (``fail=True``: roll back), send
    assert Answered(tag, True) in a.take()

The loop is pair_loop.py, the clients pair_clients.py. Each gateway is built by ONE factory function
below (``make_*``), so a change of a constructor is made here once. A protocol joins by a ``Client``
subclass (its verbs in its own codec, its events decoded), a factory and a line in ``PAIRS``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable

from pzq.config import DEFAULT_LIMITS, Limits
from pzq.gateways.api import ApiGateway
from pzq.gateways.contract import Send
from pzq.gateways.emqp import EmqpGateway
from pzq.gateways.mqks import MqksGateway
from pzq.gateways.phpmq import PhpmqGateway
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

from pair_batch import BatchClient, BatchedNative
from pair_clients import ApiClient, EmqpClient, MqksClient, NativeClient, PhpmqClient, native_gateway
from pair_loop import ACK_TIMEOUT_S, HEARTBEAT_S, LIVENESS, MAX_INPUT, Answered, Client, Clock, Closed, Delivered, Loop

__all__ = ["MAX_INPUT", "PAIRS", "Answered", "Closed", "Delivered", "Pair", "Spec"]


# -- one factory per gateway: the one place each constructor is called --------------------------------


def make_phpmq(loop: Loop) -> PhpmqGateway:
    return PhpmqGateway(loop.broker, max_content=MAX_INPUT, limits=loop.limits)


def make_mqks(loop: Loop) -> MqksGateway:
    return MqksGateway(
        loop.broker,
        Bindings(loop.store),
        max_line=MAX_INPUT,
        window=10,
        drop_queue=loop.broker.drop_queue,
        error_id=lambda: "E1",
        limits=loop.limits,
    )


def make_emqp(loop: Loop) -> EmqpGateway:
    ids = itertools.count(1)
    return EmqpGateway(
        loop.broker,
        EmqpJobs(loop.store),
        Schedules(loop.store),
        default_queues=["default"],
        heartbeat_s=HEARTBEAT_S,
        liveness=LIVENESS,
        new_id=lambda: f"server{next(ids)}",
        wall_clock=loop.clock.wall_s,
        limits=loop.limits,
    )


def make_api(loop: Loop) -> ApiGateway:
    return ApiGateway(
        loop.broker,
        loop.leases,
        DedupKeys(loop.store),
        max_message_size=MAX_INPUT,
        dedup_window_s=60,
        limits=loop.limits,
    )


def make_native(loop: Loop):
    """The native gateway serves one queue, the one every rule uses."""
    return native_gateway.NativeGateway(
        loop.broker,
        queue="q",
        max_message_size=MAX_INPUT,
        max_inflight=100,
        ack_timeout_s=ACK_TIMEOUT_S,
        limits=loop.limits,
    )


def make_native_batch(loop: Loop) -> BatchedNative:
    """The batched consume gateway on the native queue, beside the native gateway its producers send to."""
    return BatchedNative(make_native(loop), loop)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A gateway, its factory and the client class that speaks to it."""

    name: str
    make: Callable[[Loop], object]
    client: type[Client]


PAIRS = {
    spec.name: spec
    for spec in (
        Spec("phpmq", make_phpmq, PhpmqClient),
        Spec("mqks", make_mqks, MqksClient),
        Spec("emqp", make_emqp, EmqpClient),
        Spec("api", make_api, ApiClient),
        Spec("native", make_native, NativeClient),
        Spec("native_batch", make_native_batch, BatchClient),
    )
}


class Pair:
    """A gateway and its clients: ``client()`` adds one, ``turn()`` runs the loop and hands every
    client what was sent to it. Time moves only by ``clock.advance``."""

    def __init__(self, spec: Spec, store, clock: Clock | None = None, limits: Limits = DEFAULT_LIMITS):
        self.spec = spec
        self.clock = clock or Clock()
        self.loop = Loop(store, self.clock, spec.make, spec.client.route, limits)
        self.gateway, self.broker, self.store = self.loop.gateway, self.loop.broker, store
        self.clients: dict[bytes, Client] = {}
        self._turns = 0

    def client(self, name: str) -> Client:
        client = self.spec.client(self.loop, name)
        self.clients[client.peer] = client
        return client

    def turn(
        self, *, fail: bool = False, full: frozenset[Hashable] = frozenset(), slow: frozenset[Hashable] = frozenset()
    ) -> None:
        """One turn, then more while clients have something to say (a FETCH after its LEASE), so that
        a rule reads as request, turn, answer. ``fail``, ``full`` and ``slow`` apply to the first turn
        only (see ``Loop.turn``); a pipe no client reads is always blocked."""
        idle = self.spec.client.idle(list(self.clients.values()))
        self._hand_out(self.loop.turn(fail=fail, full=full, slow=slow | idle))
        for _ in range(4):
            if not self.loop.busy:
                break
            self._hand_out(self.loop.turn(slow=self.spec.client.idle(list(self.clients.values()))))

    def _hand_out(self, sends: list[Send]) -> None:
        for send in sends:
            takers = [client for client in self.clients.values() if client.wants(send)]
            assert takers, f"a send no client of the pair reads (lost): {send}"
            takers[self._turns % len(takers)].receive(send)
            self._turns += len(takers) > 1  # (several only behind a DEALER, which takes turns)
        for conn in self.loop.closed:
            if conn in self.clients:
                self.clients[conn].events.append(Closed())
        self.loop.closed = [c for c in self.loop.closed if c not in self.clients]

    def stored(self, queue: str) -> int:
        """Messages of ``queue`` on disk (delivered or not); 0 for a queue that does not exist."""
        info = self.store.queue(queue, create=False)
        return 0 if info is None else info.count
