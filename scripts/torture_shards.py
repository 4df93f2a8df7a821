"""The torture benchmark's shard cases (scripts/torture.py; issue 43, h43-server): a shard whose list names
1,024 shards (the most a list may: each WHERE answer about 110 KB to build, pack and send) asked WHERE by
clients that never read, and by one that asks as fast as it can, while the honest clients measure. Wire
helpers only: nothing of pzq is imported."""

from __future__ import annotations

import os
import tempfile
import time

import msgpack
from torture_cases import dealer, unread_then_stats
from torture_wire import Server, api_call, api_request, find, monitor

SHARDS = 1_024


def shards_args(short: bool) -> tuple[str, ...]:
    """The server is shard s0 of a list of 1,024 (the others' endpoints are never reached)."""
    folder = tempfile.mkdtemp(prefix="pzq-torture-shards-")
    path = os.path.join(folder, "shards.toml")
    with open(path, "w") as out:
        for i in range(SHARDS):
            host = f"10.{i // 250}.{i % 250}.1"
            out.write(
                f'[[shard]]\nname = "s{i}"\nreceive_dsn = "tcp://{host}:11131"\nsend_dsn = "tcp://{host}:11132"\n'
            )
            out.write(f'consume_dsn = "tcp://{host}:11134"\napi_dsn = "tcp://{host}:11133"\n\n')
    return ("--shard", "s0", "--cluster", path)


def api_where_unread(srv: Server, size: int, short: bool) -> str:
    """``size`` API connections each send 16 WHEREs of a queue (answers of ~110 KB: the list of 1,024) and
    read nothing; then one polite WHERE: is it answered, and how fast."""
    api_call(srv.api, "PRODUCE", {"messages": [["orders#3", b"x"]]})
    socks = [dealer(srv.api, rcvhwm=1, rcvbuf=4096) for _ in range(size)]
    args = msgpack.packb({"queue": "orders"}, use_bin_type=True)
    for sock in socks:
        for _ in range(16):
            sock.send_multipart(api_request("WHERE", args))
    time.sleep(1 if short else 4)
    started = time.monotonic()
    answered, answer = api_call(srv.api, "WHERE", {"queue": "orders"}, timeout_s=5)
    took_ms = (time.monotonic() - started) * 1000
    after = monitor(srv.monitor, "STATS", timeout_ms=5_000) or {}
    for sock in socks:
        sock.close(0)
    said = f"a polite WHERE in {took_ms:.0f} ms" if answered else f"a polite WHERE NOT answered ({answer})"
    held = len(answer.get("held", ())) if answered else 0
    return (
        f"{size} x 16 WHEREs unread ({SHARDS} shards); {said}, held {held}; memory alarms {find(after, 'alarms_total')}"
    )


def api_where_flood(srv: Server, size: int, short: bool) -> str:
    """One API client asks WHERE ``size`` times as fast as it can, two in flight (the replies a client's pipe
    holds: more are dropped unanswered, by the API's rule), reading every answer."""
    sock = dealer(srv.api)
    args = msgpack.packb({"queue": "orders"}, use_bin_type=True)
    sent = got = busy = 0
    started = time.monotonic()
    while got < size and time.monotonic() - started < 60:
        while sent - got < 2 and sent < size:
            sock.send_multipart(api_request("WHERE", args))
            sent += 1
        if not sock.poll(5_000):
            break
        answer = sock.recv_multipart()
        got += 1
        busy += answer[2:3] == [b"ERR"]
    sock.close(0)
    seconds = time.monotonic() - started
    return f"{got}/{size} WHEREs answered ({busy} busy) in {seconds:.1f} s, {got / max(seconds, 1e-9):.0f}/s"


def monitor_where_unread(srv: Server, size: int, short: bool) -> str:
    """``size`` monitor DEALERs each send 40 WHEREs (~140 KB of JSON each) and read nothing."""
    socks, stats, took_ms = unread_then_stats(srv.monitor, b"WHERE orders", size)
    time.sleep(1 if short else 4)
    after = monitor(srv.monitor, "STATS", timeout_ms=5_000) or {}
    for sock in socks:
        sock.close(0)
    said = f"STATS in {took_ms:.0f} ms" if stats is not None else "STATS NOT answered in 5 s"
    busy = find(after.get("monitor", {}), "busy_total")
    return (
        f"{size} x 40 WHEREs unread ({SHARDS} shards); {said}; memory alarms {find(after, 'alarms_total')}, busy {busy}"
    )


CASES = {
    "api-where-unread": (api_where_unread, 40, 4, shards_args, frozenset()),
    "api-where-flood": (api_where_flood, 3_000, 200, shards_args, frozenset()),
    "monitor-where-unread": (monitor_where_unread, 16, 4, shards_args, frozenset()),
}
