"""The torture benchmark's queue-command cases (scripts/torture.py; issue 42): a DEALER on the monitor
socket that creates and deletes queues of 255-byte names as fast as the server answers (the operator's
`pzq queue create|delete`, gone wild), while the honest clients measure. Each CREATE and DELETE is a write
answered after its turn's commit, 64 a turn at most; --max-queues bounds what it can make. Wire helpers
only: nothing of pzq is imported, so the same case measures an old tree (which answers both as unknown
requests)."""

from __future__ import annotations

import time

from torture_cases import dealer
from torture_wire import Server

NAME_BYTES = 255
WINDOW = 8  # requests sent before reading their answers: within the monitor's pipe of 16


def _churn_args(short: bool) -> tuple[str, ...]:
    return ("--max-queues", "20000")


def _ask_all(sock, requests: list[bytes]) -> list[bytes]:
    """Every request, WINDOW at a time; the answers (an empty one for a request not answered in 10 s)."""
    answers: list[bytes] = []
    for at in range(0, len(requests), WINDOW):
        batch = requests[at : at + WINDOW]
        for request in batch:
            sock.send_multipart([b"", request])
        for _ in batch:
            answers.append(sock.recv_multipart()[-1] if sock.poll(10_000) else b"")
    return answers


def create_delete_churn(srv: Server, size: int, short: bool) -> str:
    """``size`` queues of 255-byte names created, then deleted, in rounds until the case's time is up."""
    names = [f"churn{i:06d}-".ljust(NAME_BYTES, "x").encode() for i in range(size)]
    sock = dealer(srv.monitor)
    made = deleted = refused = unanswered = rounds = 0
    until = time.monotonic() + (1.5 if short else 12)
    started = time.monotonic()
    try:
        while time.monotonic() < until:
            for word, counted in ((b"CREATE ", "made"), (b"DELETE ", "deleted")):
                answers = _ask_all(sock, [word + name for name in names])
                ok = sum(a.startswith(b"{") for a in answers)
                unanswered += answers.count(b"")
                refused += len(answers) - ok - answers.count(b"")
                if counted == "made":
                    made += ok
                else:
                    deleted += ok
            rounds += 1
    finally:
        sock.close(0)
    seconds = time.monotonic() - started
    said = f"{rounds} round(s): {made:,} created, {deleted:,} deleted, {refused:,} refused"
    said += f", {(made + deleted) / max(seconds, 1e-9):,.0f} writes/s"
    return said + (f"; NOT answered: {unanswered:,}" if unanswered else "")


CASES = {
    "queue-create-delete": (create_delete_churn, 10_000, 300, _churn_args, frozenset()),
}
