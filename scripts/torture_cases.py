"""The torture benchmark's hostile clients (scripts/torture.py), one function per case: each gets the
server, its size and whether the run is short, does its harm, and returns what it achieved in a few
words. They speak the wire themselves, so that they work against any pzq tree.

These are issue 26's symptoms, in its order (round 2's cases, kept, are in torture_kept.py), and the
helpers both share.
"""

from __future__ import annotations

import os
import socket
import time

import msgpack
import zmq
from torture_wire import Server, api_call, api_request, depth, emqp, find, monitor, phpmq


def dealer(endpoint: str, **options: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    for name, value in options.items():
        setattr(sock, name, value)
    sock.connect(endpoint)
    return sock


def unread_then_stats(endpoint: str, request: bytes, size: int) -> tuple[list[zmq.Socket], dict | None, float]:
    """``size`` monitor DEALERs at ``endpoint`` each send ``request`` 40 times and read nothing (their
    sockets returned, for the caller to close after its own checks); an operator's STATS meanwhile:
    its answer (None if none came in 5 s) and how long it took, in ms."""
    socks = [dealer(endpoint, rcvhwm=1, rcvbuf=4096) for _ in range(size)]
    for sock in socks:
        for _ in range(40):
            sock.send_multipart([b"", request])
    time.sleep(0.5)
    started = time.monotonic()
    stats = monitor(endpoint, "STATS", timeout_ms=5_000)
    return socks, stats, (time.monotonic() - started) * 1000


def collect(sock: zmq.Socket, want: int, timeout_s: float) -> list[list[bytes]]:
    """Up to ``want`` answers, none waited for past ``timeout_s`` in all."""
    answers, deadline = [], time.monotonic() + timeout_s
    while len(answers) < want and sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        answers.append(sock.recv_multipart())
    return answers


def emqp_outcome(answers: list[list[bytes]], sent: int, seconds: float, dispatched: str = "") -> str:
    acked = sum(1 for a in answers if a[2:3] == [b"ACK"])
    refused = sum(1 for a in answers if a[2:3] == [b"REPLY"] and b"error" in a[-2])
    errors = [a[-2] for a in answers if a[2:3] == [b"REPLY"] and b"error" in a[-2]]
    why = f" ({errors[0][10:60].decode('utf-8', 'replace')})" if errors else ""
    unanswered = sent - len(answers)
    return f"refused {refused}/{sent}{why}, stored {acked}, unanswered {unanswered}{dispatched} ({seconds:.1f} s)"


def baseline(srv: Server, size: int, short: bool) -> str:
    """Nothing hostile: the honest clients alone for ``size`` seconds, to read the others against."""
    time.sleep(size)
    return "nothing hostile"


# -- issue 26's symptoms --------------------------------------------------------------------------


def emqp_bad_cron(srv: Server, size: int, short: bool) -> str:
    """``size`` SCHEDULEs of a cron expression that names no date (a 31st of April), at once."""
    sock = dealer(srv.emqp_frontend, sndhwm=0)
    started = time.monotonic()
    for i in range(size):
        sock.send_multipart(emqp("SCHEDULE", "cronq", "", "-1", f'["run", {{"callable": "f{i}"}}]', "0 0 31 4 *"))
    answers = collect(sock, size, 120)
    sock.close(0)
    return emqp_outcome(answers, size, time.monotonic() - started)


def cron_seconds(srv: Server, size: int, short: bool) -> str:
    """``size`` valid schedules with a seconds field (every second), then some seconds of them running."""
    sock = dealer(srv.emqp_frontend, sndhwm=0)
    started = time.monotonic()
    for i in range(size):
        sock.send_multipart(emqp("SCHEDULE", "cronq", "", "-1", f'["run", {{"callable": "s{i}"}}]', "* * * * * *"))
    answers = collect(sock, size, 120)
    sock.close(0)
    outcome = emqp_outcome(answers, size, time.monotonic() - started)
    time.sleep(1 if short else 6)
    return f"{outcome}; then {depth(srv.monitor, 'cronq')} jobs queued"


def emqp_big_headers(srv: Server, size: int, short: bool) -> str:
    """``size`` REQUESTs whose headers frame is 16 MiB of items (2 MiB when short), served by a worker."""
    worker = dealer(srv.emqp_backend)
    worker.send_multipart(emqp("INFORM", '[[10, "bigq"]]', "worker"))
    worker.poll(10_000) and worker.recv_multipart()
    worker.send_multipart(emqp("READY"))
    headers = b"x," * (((2 if short else 16) << 20) // 2 - 32_768)
    sock = dealer(srv.emqp_frontend, sndhwm=0)
    started = time.monotonic()
    for _ in range(size):
        sock.send_multipart(emqp("REQUEST", "bigq", headers, "[]"))
    answers, dispatched = [], 0
    deadline = time.monotonic() + 120
    while (len(answers) < size or dispatched < size) and time.monotonic() < deadline:
        if sock.poll(0):
            answers.append(sock.recv_multipart())
        if worker.poll(20):
            job = worker.recv_multipart()
            if job[2:3] == [b"REQUEST"]:
                dispatched += 1
                worker.send_multipart(emqp("REPLY", "{}", job[3]))
                worker.send_multipart(emqp("READY"))
        if len(answers) == size and all(a[2:3] == [b"REPLY"] for a in answers):
            break  # (all refused: nothing will be dispatched)
    sock.close(0)
    worker.close(0)
    return emqp_outcome(answers, size, time.monotonic() - started, f", dispatched {dispatched}")


def api_produce_items(srv: Server, size: int, short: bool) -> str:
    """One API PRODUCE of ``size`` (empty) messages."""
    started = time.monotonic()
    ok, answer = api_call(srv.api, "PRODUCE", {"messages": [["many", b""]] * size, "key": "k"})
    return f"{'stored' if ok else 'refused ' + str(answer.get('code'))} in {time.monotonic() - started:.2f} s"


def api_info_nils(srv: Server, size: int, short: bool) -> str:
    """One API INFO whose arguments are ``size`` MiB of msgpack nils (arrays of under 2^20 each)."""
    per = (1 << 20) - 1
    body = b"\xdc" + (size).to_bytes(2, "big") + (b"\xdd" + per.to_bytes(4, "big") + b"\xc0" * per) * size
    sock = dealer(srv.api)
    started = time.monotonic()
    sock.send_multipart(api_request("INFO", body))
    answer = collect(sock, 1, 60)
    sock.close(0)
    seconds = time.monotonic() - started
    if not answer:
        return f"no answer in {seconds:.1f} s"
    code = msgpack.unpackb(answer[0][3], raw=False).get("code") if answer[0][2] == b"ERR" else "ok"
    return f"refused {code} in {seconds:.2f} s"


def _rebind(srv: Server, size: int, short: bool, connections: int) -> str:
    events = 1_000 if short else 10_000
    conns = [socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=120) for _ in range(connections)]
    for n, conn in enumerate(conns):
        bound = " ".join(f"e{i}.x.y" for i in range(events))
        conn.sendall(f"c{n} consume --confirm rb{n} {bound}\n".encode())
        read_answers(conn, 1, 60)
    srv.begin()
    masks = " ".join(f"m{j}.*.z" for j in range(100))
    started = time.monotonic()
    each = size // connections
    for n, conn in enumerate(conns):
        conn.sendall(b"".join(f"r{i} rebind --confirm rb{n} --remove-mask {masks}\n".encode() for i in range(each)))
    lines = [line for conn in conns for line in read_answers(conn, size // connections, 120)]
    ok = sum(1 for line in lines if line.split(b" ")[1:2] == [b"ok"])
    seconds = time.monotonic() - started
    return f"{size} rebinds of {events} events x 100 masks: {ok} ok, {len(lines) - ok} refused in {seconds:.2f} s"


def read_answers(conn: socket.socket, want: int, timeout_s: float) -> list[bytes]:
    data, deadline = b"", time.monotonic() + timeout_s
    conn.settimeout(1)
    while data.count(b"\n") < want and time.monotonic() < deadline:
        try:
            chunk = conn.recv(1 << 16)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
    return data.splitlines()


def mqks_rebind(srv: Server, size: int, short: bool) -> str:
    """``size`` rebinds at the limits (10,000 events, 100 masks) pipelined on one MQKS connection."""
    return _rebind(srv, size, short, 1)


def mqks_rebind_two(srv: Server, size: int, short: bool) -> str:
    """The same, spread over two connections."""
    return _rebind(srv, size, short, 2)


def big_messages(srv: Server, size: int, short: bool) -> str:
    """``size`` messages of 16 MiB from one producer, sent at once; those answered "busy" (past what
    one producer may have held) are sent again as its earlier ones are acked (one more for each ack, and
    at once when none is left in flight), until all are stored."""
    body = os.urandom(16 << 20)
    sock = dealer(srv.receive, sndhwm=0)
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", body])
    acked, busy, deadline = 0, 0, time.monotonic() + 120
    in_flight, refused = size, list[bytes]()
    while acked < size and sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        answer = sock.recv_multipart()
        in_flight -= 1
        if answer[1:2] == [b"1"]:
            acked += 1
        elif len(answer) > 3 and answer[3].startswith(b"busy"):
            busy += 1
            refused.append(answer[0])
        if refused and (answer[1:2] == [b"1"] or in_flight == 0):
            sock.send_multipart([refused.pop(0), b"", body])
            in_flight += 1
    sock.close(0)
    return f"{size} x 16 MiB: {acked} acked, {busy} answered busy and sent again after an ack"


def partial_limit(short: bool) -> tuple[str, int]:
    return ("16M", 16 << 20) if short else ("64M", 64 << 20)


def partial_input(srv: Server, size: int, short: bool) -> str:
    """``size`` MQKS connections park unfinished lines filling --max-partial-input, then an honest
    PHPMQ client sends a 3 MiB message (1 MiB when short)."""
    _, limit = partial_limit(short)
    each = (limit - (512 << 10)) // size
    parkers = []
    for _ in range(size):
        raw = socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=30)
        try:
            raw.sendall(b"p1 publish e " + b"x" * each)
        except OSError:
            pass  # closed by the server
        parkers.append(raw)
    time.sleep(0.5)
    victim = socket.create_connection(("127.0.0.1", srv.phpmq_port), timeout=30)
    try:
        victim.sendall(phpmq(1, [(1, b"victim"), (2, b"v" * ((1 if short else 3) << 20)), (5, b"0")]))
    except OSError:
        pass
    deadline = time.monotonic() + 5
    while not depth(srv.monitor, "victim") and time.monotonic() < deadline:
        time.sleep(0.05)
    stored, victim_open = depth(srv.monitor, "victim"), is_open(victim)
    alive = sum(1 for raw in parkers if is_open(raw))
    for raw in [*parkers, victim]:
        raw.close()
    victim_state = f"{'stored' if stored else 'NOT stored'}, its connection {'open' if victim_open else 'closed'}"
    return f"PHPMQ message {victim_state}; {alive}/{size} parkers open"


def is_open(raw: socket.socket) -> bool:
    raw.setblocking(False)
    try:
        while raw.recv(65536):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def mqks_queues(srv: Server, size: int, short: bool) -> str:
    """``size`` anonymous MQKS connections x 1,000 consumes (100 when short) naming new queues, then an
    honest API PRODUCE to a new queue name."""
    per = 100 if short else 1_000
    conns = [socket.create_connection(("127.0.0.1", srv.mqks_port), timeout=60) for _ in range(size)]
    for n, conn in enumerate(conns):
        conn.sendall(b"".join(b"c%d consume --confirm q%d-%d e%d-%d\n" % (i, n, i, n, i) for i in range(per)))
    lines = [line for conn in conns for line in read_answers(conn, per, 60)]
    made = sum(1 for line in lines if line.split(b" ")[1:2] == [b"ok"])
    for conn in conns:
        conn.close()
    time.sleep(0.5)
    ok, answer = api_call(srv.api, "PRODUCE", {"messages": [["fresh-name", b"x"]], "key": "fresh"})
    after = "stored" if ok else f"NOT stored ({answer.get('code')})"
    return f"{made}/{size * per} consumes made a queue; then a new queue name: {after}"


def max_connections(srv: Server, size: int, short: bool) -> str:
    """950 PHPMQ + 200 MQKS idle connections (``size`` in all) against --max-connections 1000 (100
    when short), then a new native producer."""
    php, held = size * 950 // 1150, []
    for i in range(size):
        try:
            port = srv.phpmq_port if i < php else srv.mqks_port
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError as exc:
            return f"client stopped at {i}: {exc}"
    time.sleep(1)
    sock = dealer(srv.receive)
    started = time.monotonic()
    sock.send_multipart([b"new", b"", b"new producer"])
    acked = collect(sock, 1, 5)
    waited = time.monotonic() - started
    sock.close(0)
    stats = monitor(srv.monitor, timeout_ms=5_000)
    refused = "(monitor unanswered)" if stats is None else find(stats.get("connections", {}), "refused_total")
    alive = sum(1 for raw in held if is_open(raw))
    for raw in held:
        raw.close()
    producer = f"acked in {waited * 1000:.0f} ms" if acked and acked[0][1] == b"1" else "NOT acked in 5 s"
    return f"{alive}/{size} idle kept; new native producer {producer}; refused_total {refused}"


def drain(sock: zmq.Socket, want: int, seconds: float, late: zmq.Socket | None = None) -> tuple[int, float]:
    """Acks what ``sock`` receives until ``want`` (or ``seconds`` passed): how many, in how long.
    ``late`` (if any) holds each of its deliveries 4 s before it acks it."""
    got, held, started = 0, [], time.monotonic()
    while got < want and time.monotonic() < started + seconds:
        if sock.poll(10):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                sock.send_multipart([frames[0], frames[1], b"1"])
                got += 1
        while late is not None and late.poll(0):
            frames = late.recv_multipart()
            held.append((time.monotonic() + 4, frames[0], frames[1]))
        while held and held[0][0] <= time.monotonic():
            _, peer, key = held.pop(0)
            late.send_multipart([peer, key, b"1"])
    return got, time.monotonic() - started


def late_acker(srv: Server, size: int, short: bool) -> str:
    """An honest native consumer's rate alone (over a third of ``size`` stored messages), then beside
    one that acks every delivery 4 s late (over the next third)."""
    sock = dealer(srv.receive, sndhwm=0)
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", b"x" * 100])
    collect(sock, size, 120)
    sock.close(0)
    srv.begin()
    ctx = zmq.Context.instance()
    honest = ctx.socket(zmq.ROUTER)
    honest.connect(srv.send)
    alone, alone_s = drain(honest, size // 3, 30)
    late = ctx.socket(zmq.ROUTER)
    late.connect(srv.send)
    beside, beside_s = drain(honest, size // 3, 4 if short else 30, late)
    honest.close(0)
    late.close(0)
    rate_alone, rate_beside = alone / alone_s, beside / beside_s
    share = 100 * rate_beside / rate_alone
    floor = "" if share >= 40 else " (NOT the 40 % floor)"
    alone_text = f"of alone ({rate_alone:,.0f}/s){floor}"
    return f"honest consumer beside a late acker: {rate_beside:,.0f}/s = {share:.0f} % {alone_text}"


def snapshot_readers(srv: Server, size: int, short: bool) -> str:
    """``size`` API connections each send 12 SNAPSHOTs of 4 MiB replies (4 when short) and read nothing."""
    for i in range(8):
        api_call(srv.api, "PRODUCE", {"messages": [["snap", os.urandom(512 << 10)]], "key": f"s{i}"})
    srv.begin()
    each = 4 if short else 12
    socks = [dealer(srv.api, rcvhwm=1, rcvbuf=4096) for _ in range(size)]
    args = msgpack.packb({"queue": "snap", "after": 0, "before": (1 << 62) - 1, "limit": 1000}, use_bin_type=True)
    for sock in socks:
        for _ in range(each):
            sock.send_multipart(api_request("SNAPSHOT", args))
    time.sleep(1 if short else 6)
    for sock in socks:
        sock.close(0)
    return f"{size} x {each} SNAPSHOTs of 4 MiB unread"
