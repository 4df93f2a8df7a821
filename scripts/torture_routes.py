"""The torture benchmark's ROUTES case (scripts/torture.py; issue 42, h42-hostile): monitor DEALERs that ask
ROUTES of an event a thousand long-named MQKS queues are bound to (about 260 KB an answer) and never read,
while the honest clients measure. Such answers had no room to ask of the memory bound (unlike QUEUE, PEEK,
DEAD and CLIENTS pages): eight such clients raised the memory alarm, refusing every producer. Wire helpers
only: nothing of pzq is imported."""

from __future__ import annotations

import time

from torture_cases import unread_then_stats
from torture_mqks import Lines
from torture_wire import Server, find, monitor

NAME_BYTES = 250
BOUND = 1_000  # queues bound to the event: one connection's share of --max-queues 100,000


def routes_args(short: bool) -> tuple[str, ...]:
    return ("--max-queues", "100000")


def routes_unread(srv: Server, size: int, short: bool) -> str:
    """``size`` monitor DEALERs each send 40 ROUTES of the event and read nothing; an operator's STATS
    meanwhile, and what the memory bound did."""
    setup = Lines(srv)
    names = [b"%04d" % i + b"q" * (NAME_BYTES - 4) for i in range(BOUND)]
    setup.send(*(b"r%d rebind --confirm %s routes.event" % (i, name) for i, name in enumerate(names)))
    bound = len(setup.answers(lambda got: len(got) >= BOUND, 120))
    srv.begin()
    socks, stats, took_ms = unread_then_stats(srv.monitor, b"ROUTES routes.event", size)
    time.sleep(1 if short else 4)
    after = monitor(srv.monitor, "STATS", timeout_ms=5_000) or {}
    for sock in socks:
        sock.close(0)
    setup.close()
    said = f"STATS in {took_ms:.0f} ms" if stats is not None else "STATS NOT answered in 5 s"
    alarms = find(after, "alarms_total")
    busy = find(after.get("monitor", {}), "busy_total")
    return f"{size} x 40 ROUTES of {bound} bound queues unread; {said}; memory alarms {alarms}, busy {busy}"


CASES = {
    "monitor-routes-unread": (routes_unread, 16, 8, routes_args, frozenset()),
}
