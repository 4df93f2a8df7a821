"""The torture benchmark's round 2 cases, kept (scripts/torture.py): hostile clients that round 2
bounded, re-measured beside the honest clients so that a change never brings them back."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq
from torture_cases import collect, dealer, drain, read_answers, unread_then_stats
from torture_wire import HonestClients, Server, api_call, api_request


def deaf_producer(srv: Server, size: int, short: bool) -> str:
    """A producer that pipelines messages and never reads its acks."""
    sock = dealer(srv.receive, sndhwm=0)
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", b"d"])
    time.sleep(1 if short else 2)
    sock.close(0)
    return f"{size} sent unread"


def greedy_consumer(srv: Server, size: int, short: bool) -> str:
    """A consumer that reads without acking, beside an honest one draining."""
    sock = dealer(srv.receive, sndhwm=0)
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", b"x" * 100])
    collect(sock, size, 120)
    sock.close(0)
    srv.begin()
    ctx = zmq.Context.instance()
    greedy, honest = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    greedy.connect(srv.send)
    honest.connect(srv.send)
    started, got = time.monotonic(), 0
    while got < size // 2 and time.monotonic() - started < (2 if short else 10):
        got += drain(honest, size, 0.05)[0]
        while greedy.poll(0):
            greedy.recv_multipart()
    elapsed = time.monotonic() - started
    greedy.close(0)
    honest.close(0)
    return f"honest consumer drained {got} in {elapsed:.2f} s"


API_BATCH = 2_000  # messages in one PRODUCE: the most the server takes (Limits.api_max_produce)


def api_pipeline(srv: Server, size: int, short: bool) -> str:
    """``size`` PRODUCE requests of API_BATCH messages each, sent at once."""
    body = msgpack.packb({"messages": [["bulk", b"x" * 100]] * API_BATCH}, use_bin_type=True)
    sock = dealer(srv.api, sndhwm=0)
    started = time.monotonic()
    for _ in range(size):
        sock.send_multipart(api_request("PRODUCE", body))
    answers = collect(sock, size, 120)
    sock.close(0)
    busy = sum(1 for a in answers if a[2:3] == [b"ERR"])
    seconds = time.monotonic() - started
    return f"{size} x PRODUCE of {API_BATCH:,}: {len(answers)} answered ({busy} refused) in {seconds:.2f} s"


def many_frames(srv: Server, size: int, short: bool) -> str:
    """Messages of a million empty frames each."""
    sock = dealer(srv.receive, sndhwm=0)
    started = time.monotonic()
    for i in range(size):
        sock.send_multipart([b"%d" % i, b""] + [b""] * 1_000_000)
    sock.send_multipart([b"last", b"", b"after them"])
    answers, deadline = [], time.monotonic() + 120
    while not any(a[0] == b"last" for a in answers) and sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        answers.append(sock.recv_multipart())
    sock.close(0)
    acked = sum(1 for a in answers if a[0] != b"last" and a[1] == b"1")
    refused = sum(1 for a in answers if a[0] != b"last" and a[1] == b"0")  # (too many frames: answered since issue 40)
    last = "answered" if any(a[0] == b"last" for a in answers) else "NOT answered"
    seconds = time.monotonic() - started
    return (
        f"{size} x 1,000,000 frames: {acked} acked, {refused} refused, a message after them {last} in {seconds:.1f} s"
    )


def big_lease(srv: Server, size: int, short: bool) -> str:
    """One LEASE of a million messages over ``size`` stored ones."""
    for start in range(0, size, API_BATCH):
        batch = [["big", b"x" * 100]] * min(API_BATCH, size - start)
        api_call(srv.api, "PRODUCE", {"messages": batch, "key": f"b{start}"})
    srv.begin()
    started = time.monotonic()
    ok, answer = api_call(srv.api, "LEASE", {"queue": "big", "group": "g", "after": 0, "max": 1_000_000})
    got = answer.get("end", 0) - answer.get("base", 0) if ok else answer.get("code")
    return f"LEASE of 1,000,000 over {size}: got {got} in {time.monotonic() - started:.3f} s"


def mqks_consumers(srv: Server, size: int, short: bool) -> str:
    """``size`` MQKS consumers on one connection."""
    conn = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=60)
    conn.sendall(b"".join(b"c%d consume --confirm q%d e%d\n" % (i, i, i) for i in range(size)))
    lines = read_answers(conn, size, 60)
    conn.close()
    refused = sum(1 for line in lines if b" error " in line)
    return f"{size} consumers asked for: {len(lines) - refused} made, {refused} refused"


def _cpu_s(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used so far, 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the console's, when it runs as a child of `pzq serve`)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _honest_phase(srv: Server, seconds: float, during=None) -> tuple[list[float], float, float]:
    """An honest native producer (window 1) of its own for ``seconds``, with ``during`` running: its ack
    waits, and the CPU seconds the broker process and its children (the console) used meanwhile."""
    producer = HonestClients(srv, ["native-prod"])
    children = _children(srv.proc.pid)
    broker, console = _cpu_s(srv.proc.pid), sum(_cpu_s(c) for c in children)
    began = time.monotonic()
    stop = during() if during else None
    time.sleep(seconds)
    broker, console = _cpu_s(srv.proc.pid) - broker, sum(_cpu_s(c) for c in children) - console
    if stop:
        stop()
    waits, _ = producer.finish(began).get("native-prod", ([], 0))
    return (waits if isinstance(waits, list) else []), broker, console


def _own_cpu_s() -> float:
    """The CPU time this process (the flood's threads) has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ms(waits: list[float]) -> tuple[float, float]:
    """p50 and p99 of ``waits`` (seconds), in ms."""
    if not waits:
        return 0.0, 0.0
    ordered = sorted(waits)
    return ordered[len(ordered) // 2] * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def console_flood(srv: Server, seconds: int, short: bool) -> str:
    """Page views as fast as 16 connections go, of a queue of 50 messages of 4 MiB (10 when short), without
    a login: an honest native producer's ack p50/p99 and the broker's CPU, measured for ``seconds``
    without the flood, then as long with it (the p99 with it must stay within 20 % of the p99 without:
    issue 28). Where the console is a child process, its CPU is shown apart."""
    for i in range(10 if short else 50):
        api_call(srv.api, "PRODUCE", {"messages": [["big", os.urandom(4 << 20)]], "key": f"big-{i}"})
    deadline = time.monotonic() + 30  # (a console in a process of its own answers once it has started)
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(srv.http + "/", timeout=5) as page:
                page.read()
            break
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    srv.begin()
    served, busy, stop = [0], [0], threading.Event()
    # Pages of the old in-loop console and of the console process alike (a 404 costs a request as well)
    paths = ("/", "/queue?name=big", "/queues/big", "/clients")

    def view() -> None:
        while not stop.is_set():
            for path in paths:
                try:
                    with urllib.request.urlopen(srv.http + path, timeout=10) as page:
                        page.read()
                    served[0] += 1
                except urllib.error.HTTPError as exc:
                    busy[0] += exc.code != 404
                    served[0] += exc.code == 404
                except (urllib.error.URLError, OSError):
                    busy[0] += 1

    def flood():
        viewers = [threading.Thread(target=view, daemon=True) for _ in range(16)]
        for viewer in viewers:
            viewer.start()

        def end() -> None:
            stop.set()
            for viewer in viewers:
                viewer.join(15)

        return end

    quiet, quiet_cpu, quiet_console = _honest_phase(srv, seconds)
    flooder = _own_cpu_s()
    flooded, flood_cpu, flood_console = _honest_phase(srv, seconds, flood)
    flooder = _own_cpu_s() - flooder  # (on the same machine as pzq: what the browsers' side took)
    (q50, q99), (f50, f99) = _ms(quiet), _ms(flooded)
    within = f99 <= q99 * 1.2
    return (
        f"{served[0]} pages served, {busy[0]} refused or busy in {seconds} s; honest producer ack p50/p99 "
        f"{q50:.1f}/{q99:.1f} ms without the flood (n={len(quiet)}), {f50:.1f}/{f99:.1f} ms with it "
        f"(n={len(flooded)}): p99 {'' if within else 'NOT '}within 20 %; broker CPU {quiet_cpu:.1f} s then "
        f"{flood_cpu:.1f} s, console process {quiet_console:.1f} s then {flood_console:.1f} s, "
        f"the flooding client {flooder:.1f} s"
    )


def stream_read(srv: Server, size: int, short: bool) -> str:
    """What a Spark query does to ``size`` stored messages in one batch, as fast as one client can:
    lease them all, fetch them all, acknowledge them all."""
    for start in range(0, size, API_BATCH):
        batch = [["stream", b"x" * 100]] * min(API_BATCH, size - start)
        api_call(srv.api, "PRODUCE", {"messages": batch, "key": f"st{start}"})
    srv.begin()
    started = time.monotonic()
    end, calls, base = 0, 0, None
    while end < size:
        ok, answer = api_call(srv.api, "LEASE", {"queue": "stream", "group": "g", "after": end, "max": size - end})
        if not ok:
            return f"LEASE after {end} refused: {answer.get('code')}"
        end, calls = answer["end"], calls + 1
        base = answer["base"] if base is None else base
    leased = time.monotonic() - started
    lo = base or 0
    while lo < end:  # (in pieces of 10,000, as the Spark connector asks)
        hi = min(end, lo + 10_000)
        ok, answer = api_call(srv.api, "FETCH", {"queue": "stream", "group": "g", "lo": lo, "hi": hi})
        if not ok:
            return f"FETCH of {lo}..{hi} refused: {answer.get('code')} {answer.get('detail')}"
        lo = answer["next"]
    fetched = time.monotonic() - started - leased
    api_call(srv.api, "ACK_UPTO", {"queue": "stream", "group": "g", "upto": end})
    deadline = time.monotonic() + 120
    while api_call(srv.api, "INFO", {"queue": "stream"})[1].get("depth") and time.monotonic() < deadline:
        time.sleep(0.01)
    acked = time.monotonic() - started - leased - fetched
    return (
        f"{size:,} leased in {calls} calls ({leased:.2f} s), fetched ({fetched:.2f} s), "
        f"acknowledged and deleted ({acked:.2f} s)"
    )


def monitor_peek_flood(srv: Server, size: int, short: bool) -> str:
    """``size`` monitor DEALERs each send 40 PEEKs of 1,000 rows (about 1.5 MB a page) and read nothing;
    an operator's STATS meanwhile (round 8: the waiting list grew without bound, STATS waited minutes)."""
    api_call(srv.api, "PRODUCE", {"messages": [["peekq", os.urandom(4096)] for _ in range(1000)]})
    srv.begin()
    socks, stats, took_ms = unread_then_stats(srv.monitor, b"PEEK peekq 1000", size)
    answered = stats is not None
    time.sleep(1 if short else 4)
    for sock in socks:
        sock.close(0)
    said = f"STATS in {took_ms:.0f} ms" if answered else "STATS NOT answered in 5 s"
    return f"{size} x 40 PEEKs of 1,000 rows unread; {said}"
