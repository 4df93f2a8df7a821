"""MQKS fairness between connections (issues 26, 39): pipelined lines wait in their connection's queue,
and connections share the loop's time by what their requests cost (start-time fair queueing), so an
honest connection's line waits for at most one line of each other connection, and a connection of cheap
lines goes before connections of costly ones however many lines they pipelined."""

from __future__ import annotations

from test_gateway_limits import mqks_on

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits
from pzq.gateways.contract import UNBOUNDED
from pzq.gateways.mqks import MqksGateway
from pzq.store.bindings import Bindings


class LineBudget:
    """A budget of ``lines`` requests (the order of service shows, not the time)."""

    bytes_left = 1 << 62

    def __init__(self, lines: int):
        self.left = lines

    def spent(self) -> bool:
        return self.left <= 0

    def take(self, size: int = 0, records: int = 1) -> None:
        self.left -= 1


def test_an_honest_line_behind_ten_connections_pipelining_a_thousand_lines_is_answered_within_eleven_lines(store):
    gateway = mqks_on(store, Limits())
    hostile = [b"h%d" % n for n in range(10)]
    for conn in [*hostile, b"honest"]:
        gateway.connected(conn)
    for conn in hostile:
        assert gateway.keep(conn, b"".join(b"p%d ping x\n" % i for i in range(1000))) == []
    assert gateway.keep(b"honest", b"mine ping y\n") == []
    assert gateway.buffered(b"h0") == sum(len(b"p%d ping x" % i) for i in range(1000)), "its waiting lines count"
    sent = gateway.serve(now=Now(0.0, 1), budget=LineBudget(11))
    assert [s.peer for s in sent] == [*hostile, b"honest"]
    assert sent[-1].frames[1] == b"mine ok y\n"
    rest = gateway.serve(now=Now(0.0, 2), budget=UNBOUNDED)
    for conn in hostile:  # each connection's answers in the order of its lines
        assert [s.frames[1] for s in rest if s.peer == conn] == [b"p%d ok x\n" % i for i in range(1, 1000)]
    assert gateway.buffered(b"h0") == 0 and not gateway.waiting()


def test_cheap_lines_go_before_the_second_of_connections_whose_lines_cost_milliseconds(store):
    broker = Broker(store, ack_timeout_s=5)
    gateway = MqksGateway(broker, Bindings(store), max_line=1 << 20, window=10, drop_queue=broker.drop_queue)
    costly = [b"c%d" % n for n in range(3)]
    for conn in [*costly, b"honest"]:
        gateway.connected(conn)
    for n, conn in enumerate(costly):  # each line replaces its queue's 10,000 events with 10,000 others
        lines = [
            b"k%d consume --confirm q%d " % (k, n) + b" ".join(b"e%d.%d.%d" % (n, k, i) for i in range(10_000))
            for k in range(5)
        ]
        gateway.keep(conn, b"\n".join(lines) + b"\n")
    gateway.keep(b"honest", b"".join(b"p%d ping x\n" % i for i in range(20)))
    sent = gateway.serve(now=Now(0.0, 1), budget=LineBudget(23))
    mine = [s.frames[1] for s in sent if s.peer == b"honest"]
    assert mine == [b"p%d ok x\n" % i for i in range(20)], "every cheap line before a costly connection's second"
    theirs = [s.frames[1] for s in sent if s.peer in costly]
    assert all(line == b"k0 ok \n" for line in theirs), f"none of their second lines yet: {theirs}"
