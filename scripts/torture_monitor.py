"""The torture benchmark's monitor, console and implicit-queue cases (scripts/torture.py; issue 39): DEALERs
that pipeline STATS over 9,000 queues and never read, the console's once-a-second poll of those 9,000
queues, short API connections that fill the queues clients may make, and half-sent requests held open
on the console. Wire helpers only: nothing of pzq is imported, so the same case measures an old tree."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

import msgpack
from torture_cases import dealer
from torture_wire import Server, api_call, find, monitor

NAME_BYTES = 255  # the longest name a queue may have: STATS of 9,000 of them is 2.98 MB


def queue_names(n: int) -> list[str]:
    return [f"q{i:05d}-".ljust(NAME_BYTES, "x") for i in range(n)]


def make_queues(srv: Server, n: int, per_connection: int) -> int:
    """``n`` queues of 255-byte names, each holding one message, made by API PRODUCEs of
    ``per_connection`` names from a connection each (a client's share of the queues requests may make);
    how many were made."""
    names, made = queue_names(n), 0
    for start in range(0, n, per_connection):
        batch = names[start : start + per_connection]
        ok, _ = api_call(srv.api, "PRODUCE", {"messages": [[name, b"m"] for name in batch], "key": f"mk-{start}"})
        made += len(batch) if ok else 0
    return made


def wait_for_console(srv: Server, seconds: float = 30) -> bool:
    """True once the console (a child process of the server) answers a page."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(srv.http + "/", timeout=5) as page:
                page.read()
            return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    return False


def _stats_args(short: bool) -> tuple[str, ...]:
    return ("--max-queues", "20000")  # (9,000 made by 45 clients of 200, with the room for them to spare)


def monitor_stats_flood(srv: Server, size: int, short: bool) -> str:
    """9,000 queues of 255-byte names (300 when short); ``size`` DEALERs each pipeline 20 STATS and read
    none (round 9: 1,124 MiB held, and the memory alarm then refused every producer). An operator's
    STATS every second meanwhile: answered, and how fast."""
    queues = 300 if short else 9_000
    made = make_queues(srv, queues, 200)
    srv.begin()
    socks = [dealer(srv.monitor, rcvhwm=1, rcvbuf=4096) for _ in range(size)]
    for sock in socks:
        for _ in range(20):
            sock.send_multipart([b"", b"STATS"])
    waits, unanswered, figures = [], 0, None
    until = time.monotonic() + (2 if short else 12)
    while time.monotonic() < until:
        started = time.monotonic()
        answer = monitor(srv.monitor, "STATS", timeout_ms=5_000)
        if answer is None:
            unanswered += 1
        else:
            waits.append(time.monotonic() - started)
            figures = answer
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    for sock in socks:
        sock.close(0)
    alarms = find(figures, "alarms_total") if figures else None
    peak = (find(figures, "counted_peak_bytes") or 0) / (1 << 20) if figures else 0.0
    busy = find(figures.get("monitor"), "busy_total") if figures and isinstance(figures.get("monitor"), dict) else None
    said = (
        "operator STATS NOT answered" if unanswered or not waits else f"operator STATS max {max(waits) * 1000:.0f} ms"
    )
    alarm = "alarm not raised" if alarms == 0 else f"alarm NOT kept down ({alarms} raised)"
    return (
        f"{made} queues, {size} x 20 STATS unread; {said} ({len(waits)} asked); {alarm}, counted peak "
        f"{peak:.0f} MiB" + (f", {busy} busy" if busy is not None else "")
    )


def console_stats(srv: Server, seconds: int, short: bool) -> str:
    """9,000 queues of 255-byte names (300 when short) and the console's poll of STATS once a second, for
    ``seconds``; a page of the queues each second meanwhile (round 9: the poll rendered 2.97 MB inside
    the loop, honest p99 7.7 -> 34.6 ms, max 132 ms)."""
    queues = 300 if short else 9_000
    made = make_queues(srv, queues, 200)
    up = wait_for_console(srv)
    srv.begin()
    pages, failed, until = 0, 0, time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(srv.http + "/queues?sort=depth&order=desc", timeout=10) as page:
                page.read()
            pages += 1
        except (urllib.error.URLError, OSError):
            failed += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    figures = monitor(srv.monitor, "STATS", timeout_ms=10_000)
    shown = len(figures.get("queues", {})) if figures else 0
    console = "console up" if up else "console NOT up"
    return f"{made} queues ({shown} in STATS); {console}, {pages} queue pages served, {failed} failed in {seconds} s"


def _implicit_args(short: bool) -> tuple[str, ...]:
    return ("--max-queues", "300") if short else ()


def implicit_queues(srv: Server, size: int, short: bool) -> str:
    """``size`` short API connections, each producing one message to each of its share of new names
    (100, 3 when short: 1/100 of --max-queues), never consumed, so none expires (round 9: 9,000 queues,
    and an honest new queue was refused on API and MQKS). Then an honest client's new queue on each."""
    share = 3 if short else 100
    made = refused = 0
    for k in range(size):
        sock = dealer(srv.api)
        for i in range(share):  # (one at a time: an API client's pipe holds two replies)
            frames = [b"", b"r%d" % i, b"PRODUCE", msgpack.packb({"messages": [[f"imp{k}-{i}", b"x"]]})]
            sock.send_multipart(frames)
            if not sock.poll(10_000):
                break
            answer = sock.recv_multipart()
            ok = len(answer) > 2 and answer[2] == b"OK"
            made, refused = made + ok, refused + (not ok)
        sock.close(0)
    api_ok, _ = api_call(srv.api, "PRODUCE", {"messages": [["honest-new-api", b"hello"]]})
    mqks_ok = False
    with socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=10) as conn:
        conn.sendall(b"c1 consume --confirm honest-new-mqks ev.honest-new\n")
        conn.settimeout(10)
        line = b""
        while not line.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            line += chunk
        mqks_ok = line.startswith(b"c1 ok")
    verdict = "accepted" if api_ok and mqks_ok else "NOT accepted"
    return (
        f"{made} queues made by {size} connections ({refused} refused); an honest new queue {verdict} "
        f"(API {'ok' if api_ok else 'refused'}, MQKS {'ok' if mqks_ok else 'refused'})"
    )


def console_half_sent(srv: Server, size: int, short: bool) -> str:
    """``size`` connections to the console from 127.0.0.1, each sending half a request and holding it
    open; 40 honest page loads from the same address meanwhile (round 9, 16 of them: 38 of 40 refused by
    the cap of 16 connections an address, which every loopback browser and every one behind a proxy
    shares)."""
    up = wait_for_console(srv)
    srv.begin()
    held = []
    for _ in range(size):
        try:
            conn = socket.create_connection(("127.0.0.1", int(srv.http.rpartition(":")[2])), timeout=5)
            conn.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
            held.append(conn)
        except OSError:
            break
    served, refused, slowest = 0, 0, 0.0
    for _ in range(40):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(srv.http + "/", timeout=10) as page:
                page.read()
            served += 1
            slowest = max(slowest, time.monotonic() - started)
        except (urllib.error.URLError, OSError):
            refused += 1
    still = sum(1 for conn in held if _open(conn))
    for conn in held:
        conn.close()
    mark = "" if served == 40 else "NOT "
    return (
        f"{len(held)} half-sent held ({still} still open after); {mark}{served}/40 honest page loads served "
        f"(slowest {slowest * 1000:.0f} ms){'' if up else ', console NOT up'}"
    )


def _open(conn: socket.socket) -> bool:
    conn.setblocking(False)
    try:
        return conn.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def _console_args(short: bool) -> tuple[str, ...]:
    return ("--http-dsn", "{http}")


def _console_stats_args(short: bool) -> tuple[str, ...]:
    return (*_console_args(short), *_stats_args(short))


# name: (function, full size, short size, extra `pzq serve` arguments, honest clients left out)
CASES = {
    "monitor-stats-flood": (monitor_stats_flood, 20, 2, _stats_args, frozenset()),
    "console-stats-9000-queues": (console_stats, 20, 2, _console_stats_args, frozenset()),
    "implicit-queues-91": (implicit_queues, 91, 91, _implicit_args, frozenset()),
    "console-half-sent": (console_half_sent, 16, 16, _console_args, frozenset()),
    "console-half-sent-200": (console_half_sent, 200, 80, _console_args, frozenset()),
}
