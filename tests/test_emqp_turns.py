"""How many loop turns an eMQP round trip takes (issue 26): a REQUEST stored -> its job to an idle worker
-> the worker's REPLY -> the client. The job must be durable before it leaves (docs/emqp.md, Restarts),
so the round trip needs two turns at least: the job leaves after the commit of the turn that stores the
REQUEST, the REPLY after the commit of the turn that reads it. These tests run the turns themselves, on
inproc endpoints (a message sent on inproc is in the server's pipe when send returns), so they count
turns, never the clock; the turn's budget is bounded by its records (``turn_records``) and the clock
budget is an hour, so what ends a turn is a count."""

from __future__ import annotations

import dataclasses
import itertools
import uuid

import zmq

from pzq.config import DEFAULT_LIMITS
from pzq.protocols import native as wire
from pzq.server import Server

from conftest import make_config

V = b"eMQP/1.0"
_inproc = itertools.count()


def command(name: str, *args: bytes) -> list[bytes]:
    """An eMQP command as a DEALER sends it, with a fresh msgid."""
    return [b"", V, name.encode(), str(uuid.uuid4()).encode(), *args]


def _server(tmp_path, **limits) -> tuple[Server, dict[str, str]]:
    """A started server whose turns the test runs (``_turn``), native and eMQP endpoints on inproc."""
    n = next(_inproc)
    dsn = {role: f"inproc://emqp-turns-{role}-{n}" for role in ("receive", "send", "monitor", "front", "back")}
    cfg = make_config(
        tmp_path,
        receive_dsn=dsn["receive"],
        send_dsn=dsn["send"],
        monitor_dsn=dsn["monitor"],
        emqp_frontend_dsn=dsn["front"],
        emqp_backend_dsn=dsn["back"],
        ack_timeout=30.0,
        limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
    )
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    return server, dsn


def _dealer(endpoint: str, **options: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(endpoint)
    return sock


def _waiting(sock: zmq.Socket) -> list[list[bytes]]:
    """Every message waiting on ``sock`` now."""
    got = []
    while sock.poll(0):
        got.append(sock.recv_multipart())
    return got


def _worker(server: Server, back: str, queue: bytes, ready: int = 1) -> zmq.Socket:
    """A JobManager INFORMed for ``queue`` with ``ready`` free slots, once the server has read them all."""
    worker = _dealer(back, SNDHWM=0)
    worker.send_multipart(command("INFORM", b'[[10, "' + queue + b'"]]', b"worker"))
    for _ in range(ready):
        worker.send_multipart(command("READY"))
    for _ in range(10 + ready):
        server._turn(0)
    _waiting(worker)  # (its ACK and heartbeat)
    return worker


def _round_trips(server: Server, client: zmq.Socket, worker: zmq.Socket, rounds: int) -> list[tuple[int, int]]:
    """(turns until the job reached the worker, turns until the REPLY reached the client) of each of
    ``rounds`` REQUESTs, one at a time, counted from the first turn after the client sent it. The worker
    answers at once: REPLY and READY, as eventmq's JobManager does."""
    counts = []
    for _ in range(rounds):
        request = command("REQUEST", b"q", b"reply-requested", b"[]")
        client.send_multipart(request)
        begun, job_at, reply_at = server.turns, 0, 0
        while not reply_at and server.turns - begun < 100:
            server._turn(0)
            for job in _waiting(worker):
                if job[2] == b"REQUEST" and job[4] == b"q":
                    job_at = server.turns - begun
                    worker.send_multipart(command("REPLY", b"{}", job[3]))
                    worker.send_multipart(command("READY"))
            if any(answer[2] == b"REPLY" and answer[-1] == request[3] for answer in _waiting(client)):
                reply_at = server.turns - begun
        assert job_at and reply_at, f"no round trip within 100 turns (job after {job_at})"
        counts.append((job_at, reply_at))
    return counts


def test_an_emqp_round_trip_beside_a_producer_flood_takes_two_turns_one_each_way(tmp_path):
    # Each turn, the flood's read spends the turn's records. Before: the next turn began with the
    # flood's read again (the rotation restarted at the first task after a turn that reached every
    # task), so the REQUEST waited a turn and the REPLY another: four turns.
    server, dsn = _server(tmp_path, turn_budget_s=3600.0, turn_records=50)
    flood, client = _dealer(dsn["receive"], SNDHWM=0), _dealer(dsn["front"])
    try:
        worker = _worker(server, dsn["back"], b"q")
        for i in range(5000):
            flood.send_multipart(wire.produce(b"%d" % i, [b"flood"]))
        server._turn(0)  # the flood is being read
        counts = _round_trips(server, client, worker, rounds=5)
        assert counts == [(1, 2)] * 5, f"(turns to the job, turns to the REPLY) of each request: {counts}"
        assert server.stats()["produced_total"] < 5000, "the flood was still being read all along"
        worker.close(0)
    finally:
        flood.close(0)
        client.close(0)
        server.close()


def test_an_emqp_request_to_an_idle_worker_is_handed_out_in_the_turn_that_stores_it_when_the_budget_ends_there(
    tmp_path,
):
    # A zero budget ends the turn after the REQUEST is read, before the eMQP endpoint's dispatch task
    # (before: the job left three turns after the ACK). The job is still durable before it leaves: it
    # goes out after the commit, with the ACK.
    server, dsn = _server(tmp_path, turn_budget_s=0.0)
    client = _dealer(dsn["front"])
    try:
        worker = _worker(server, dsn["back"], b"q")
        request = command("REQUEST", b"q", b"reply-requested", b"[]")
        client.send_multipart(request)
        for _ in range(30):
            server._turn(0)
            acks = [a for a in _waiting(client) if a[2] == b"ACK"]
            jobs = [j for j in _waiting(worker) if j[2] == b"REQUEST"]
            if acks or jobs:
                break
        assert len(acks) == 1 and acks[0][-1] == request[3], "the REQUEST was acked"
        assert len(jobs) == 1 and jobs[0][3] == request[3], "its job left in the same turn"
        worker.close(0)
    finally:
        client.close(0)
        server.close()


def test_a_worker_with_hundreds_of_free_slots_is_handed_at_most_a_turns_records_of_jobs_a_turn(tmp_path):
    # A client pipelines 300 REQUESTs to a worker with 300 free slots: each REQUEST draws the record of
    # the job it lets out, so a turn's records bound both. Then a hostile worker READYs 300 slots and
    # the first one, which holds the 300 jobs, disconnects: they all come back to the queue at once.
    # Before, the next dispatch handed all 300 out in one turn, whatever the turn's records said (the
    # commit and the sends after it pay for each).
    server, dsn = _server(tmp_path, turn_budget_s=3600.0, turn_records=40)
    producer = _dealer(dsn["front"], SNDHWM=0)
    try:
        holder = _worker(server, dsn["back"], b"q", ready=300)
        for i in range(300):
            producer.send_multipart(command("REQUEST", b"q", b"", b"[%d]" % i))
        first = []  # the pipelined REQUESTs' jobs, handed out in the turns that read them
        while sum(first) < 300 and len(first) < 100:
            server._turn(0)
            first.append(sum(1 for job in _waiting(holder) if job[2] == b"REQUEST"))
        assert sum(first) == 300, f"the first worker holds {sum(first)} jobs"
        assert max(first) <= 40, f"jobs handed out a turn as the REQUESTs came: {first}"
        greedy = _worker(server, dsn["back"], b"q", ready=300)
        holder.send_multipart(command("DISCONNECT"))
        per_turn = []
        while sum(per_turn) < 300 and len(per_turn) < 100:
            server._turn(0)
            per_turn.append(sum(1 for job in _waiting(greedy) if job[2] == b"REQUEST"))
        assert sum(per_turn) == 300, "every job requeued went to the other worker"
        assert max(per_turn) <= 40, f"jobs handed out a turn: {per_turn}"
        holder.close(0)
        greedy.close(0)
    finally:
        producer.close(0)
        server.close()


class _SendsAfterPolling(zmq.Poller):
    """The server's own poller, which sends what the test gives it just after each poll returns: a peer
    whose message comes while the turn is under way (a worker answers a job within a turn)."""

    def __init__(self, poller: zmq.Poller):
        super().__init__()
        self.sockets = list(poller.sockets)
        self.later: list[tuple[zmq.Socket, list[bytes]]] = []

    def poll(self, timeout=None):
        ready = super().poll(timeout)
        for sock, frames in self.later:
            sock.send_multipart(frames)
        self.later.clear()
        return ready


def test_a_workers_reply_that_comes_after_the_turns_poll_is_forwarded_in_that_turn(tmp_path):
    # Before, the eMQP reader read only the sockets the turn's poll named: a REPLY that came a moment
    # later waited a whole turn, and under load a turn is several milliseconds.
    server, dsn = _server(tmp_path)
    client = _dealer(dsn["front"])
    try:
        worker = _worker(server, dsn["back"], b"q")
        server.poller = poller = _SendsAfterPolling(server.poller)
        request = command("REQUEST", b"q", b"reply-requested", b"[]")
        client.send_multipart(request)
        server._turn(0)
        [job] = [j for j in _waiting(worker) if j[2] == b"REQUEST"]
        poller.later.append((worker, command("REPLY", b"{}", job[3])))
        server._turn(0)
        replies = [a for a in _waiting(client) if a[2] == b"REPLY"]
        assert [r[-1] for r in replies] == [request[3]], "the REPLY went on in the turn it came in"
        worker.close(0)
    finally:
        client.close(0)
        server.close()
