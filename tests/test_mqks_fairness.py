"""MQKS fairness between connections (issue 26): pipelined lines are served one line of each connection
in turn, so an honest connection's one line waits for at most one line of each other connection."""

from __future__ import annotations

from test_gateway_limits import mqks_on

from pzq.config import Limits
from pzq.gateways.contract import UNBOUNDED


class LineBudget:
    """A budget of ``lines`` requests (the order of service shows, not the time)."""

    def __init__(self, lines: int):
        self.left = lines

    def spent(self) -> bool:
        return self.left <= 0

    def take(self, size: int = 0) -> None:
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
    sent = gateway.serve(now=0.0, now_us=1, budget=LineBudget(11))
    assert [s.peer for s in sent] == [*hostile, b"honest"]
    assert sent[-1].frames[1] == b"mine ok y\n"
    rest = gateway.serve(now=0.0, now_us=2, budget=UNBOUNDED)
    for conn in hostile:  # each connection's answers in the order of its lines
        assert [s.frames[1] for s in rest if s.peer == conn] == [b"p%d ok x\n" % i for i in range(1, 1000)]
    assert gateway.buffered(b"h0") == 0 and not gateway.waiting()
