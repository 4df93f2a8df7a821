"""A hostile batched consumer against a polite one on the same endpoint (issue 27's consume gateway):
it floods ACK and NACK without reading a SETTLED, names keys it was never given (forged from the
predictable key shape: the polite consumer's own), acks twice, nacks then acks, and leaves with all
of it in flight. The polite consumer's deliveries and acks go on, none of its messages is settled by
the other, and nothing it acked comes back."""

from __future__ import annotations

import shutil
import time

import zmq
from test_curve import curve_settings, keys  # noqa: F401 - keys is a fixture
from test_native_consume_pipelined import produce, receive_all

from pzq.clients import native as client
from pzq.curve import secure_client
from pzq.protocols import native_consume as wire

from conftest import free_tcp_endpoint, recv, wait_until

MARKER = b"0000000000000000|" + b"0" * 32  # (a key never given: its ACK is answered, in order, refused)


def replies_to_marker(sock: zmq.Socket) -> list:
    """Send an ACK of MARKER and return every reply that came before its answer: the socket's commands are
    answered in order, and deliveries sent before it come first (a barrier, not a wait for quiet)."""
    sock.send_multipart(wire.ack([MARKER]))
    before = []
    while (reply := wire.parse_reply(recv(sock))) != wire.Settled(0, [MARKER]):
        before.append(reply)
    return before


def test_a_consumer_flooding_forged_acks_and_nacks_unread_neither_settles_nor_delays_anothers_deliveries(
    make_server, sockets
):
    server = make_server(ack_timeout=30.0)  # (nothing goes back by the clock while the test reads)
    produce(server.receive, 60)
    with client.BatchConsumer(server.config.consume_dsn, ack_window=4) as polite:
        got = receive_all(polite, 40, most=20)
        keys = [key for key, _ in got]
        rude = sockets(zmq.DEALER, server.config.consume_dsn)
        rude.send_multipart(wire.hello())
        assert isinstance(wire.parse_reply(recv(rude)), wire.Limits)
        rude.send_multipart(wire.credit(5))
        mine: list[bytes] = []
        while len(mine) < 5:
            mine += wire.parse_reply(recv(rude)).keys
        # The polite consumer's keys (named by it: the shape is predictable), twice; garbage; its own keys
        # acked twice and nacked then acked; hundreds of commands it never reads the answers of
        forged = b"0000000000000001|ffffffffffffffffffffffffffffffff"
        rude.send_multipart(wire.nack(mine[:1]))
        rude.send_multipart(wire.ack(mine[:1] + mine[1:3] + mine[1:3]))
        for i in range(300):
            rude.send_multipart(wire.ack(keys + keys + [forged, b"x" * 49]) if i % 2 else wire.nack(keys[:10]))
        # ... meanwhile the polite one settles what it holds, then takes and settles the rest
        started = time.monotonic()
        assert polite.ack(keys) == wire.Settled(40, [])
        rest = receive_all(polite, 16, most=20)  # (60 less its 40, the rude one's 2 settled and 2 held)
        assert polite.ack([key for key, _ in rest]) == wire.Settled(16, [])
        assert polite.receive(10, timeout_s=0.3) == []
        assert time.monotonic() - started < 10.0
        bodies = {body[0] for _, body in got + rest}
        assert len(bodies) == 56
        # The rude one's answers, read at last (those past what its pipe held were dropped, and the commands
        # sent meanwhile with them): its own keys settled once, every other key refused
        # (once the server holds none of its answers waiting for room in its pipe, an ACK's answer comes after
        # all the rest: read as they come meanwhile)
        endpoint = next(e for e in server.server.endpoints if e.name == "native_batch")
        answers = []

        def backlog_gone() -> bool:
            while rude.poll(0):
                answers.append(wire.parse_reply(recv(rude)))
            return endpoint.replies.backlog_bytes == 0

        wait_until(backlog_gone)
        answers += replies_to_marker(rude)
        assert 2 <= len(answers) <= 302
        assert (answers[0].count, answers[0].refused) == (1, [])
        assert (answers[1].count, answers[1].refused) == (2, [mine[0], *mine[1:3]])
        assert all(a.count == 0 and len(a.refused) in (10, 82) for a in answers[2:])
        rude.send_multipart(wire.bye())
        assert wire.parse_reply(recv(rude)) == 2  # (the two it held, back to the queue)
        # What it still held goes to the polite consumer (the one it nacked came already); nothing acked comes back
        again = receive_all(polite, 2, most=20)
        assert {body[0] for _, body in again}.isdisjoint(bodies)
        assert polite.ack([key for key, _ in again]) == wire.Settled(2, [])
        assert polite.receive(10, timeout_s=0.3) == []


def test_a_run_acked_every_other_key_brings_back_exactly_the_unacked_once_each_then_dead_letters_them(
    make_server, sockets
):
    # One heap item per taken run (pzq/inflight.py): what was acked out of it must not come back, what was
    # not must come back once each at the ack timeout, in order, and count against --max-deliveries
    server = make_server(ack_timeout=0.5, max_deliveries=2)
    produce(server.receive, 40)
    sock = sockets(zmq.DEALER, server.config.consume_dsn)
    sock.send_multipart(wire.hello())
    assert isinstance(wire.parse_reply(recv(sock)), wire.Limits)
    sock.send_multipart(wire.credit(40))
    first: list[tuple[bytes, list[bytes]]] = []
    while len(first) < 40:
        batch = wire.parse_reply(recv(sock))
        first += zip(batch.keys, batch.bodies, strict=True)
    assert [body for _, body in first] == [[b"m%d" % i] for i in range(40)]
    sock.send_multipart(wire.ack([key for key, _ in first[::2]]))
    assert wire.parse_reply(recv(sock)) == wire.Settled(20, [])
    unacked = first[1::2]

    def again() -> list[tuple[bytes, list[bytes]]]:
        sock.send_multipart(wire.credit(20))  # (after the timeout, when nothing is held: within the credit cap)
        got: list[tuple[bytes, list[bytes]]] = []
        while len(got) < 20:
            batch = wire.parse_reply(recv(sock))
            got += zip(batch.keys, batch.bodies, strict=True)
        return got

    def inflight() -> int:
        return server.stats()["queues"]["default"]["inflight"]

    assert wait_until(lambda: inflight() == 0)  # (the 20 not acked, back at the timeout)
    second = again()
    assert second == unacked  # (the same keys, in order, each once)
    assert replies_to_marker(sock) == []  # (nothing else: none of the acked came back)
    assert wait_until(lambda: inflight() == 0)
    sock.send_multipart(wire.credit(1))
    # (each delivered twice: the cap sent them to the dead letters, not to it)
    assert wait_until(lambda: server.stats()["queues"]["default"]["dead_letters"] == 20)
    assert server.stats()["queues"]["default"]["depth"] == 0
    assert replies_to_marker(sock) == []


def test_a_consumer_whose_deliveries_wait_in_a_backlog_still_gets_the_settled_of_its_ack(make_server):
    # A polite consumer that reads slower than pzq sends: its deliveries fill its pipe and wait in the
    # endpoint's backlog. Its ACK sent meanwhile is carried out and answered after what waits (it was
    # dropped, and the consumer waited for a SETTLED that never came: a CI run hung 20 s on it)
    server = make_server(ack_timeout=30.0)
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"%d" % i + b"x" * 20_000] for i in range(1000)]))
    endpoint = next(e for e in server.server.endpoints if e.name == "native_batch")
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(server.config.consume_dsn)
    try:
        sock.send_multipart(wire.hello())
        assert isinstance(wire.parse_reply(recv(sock)), wire.Limits)
        sock.send_multipart(wire.credit(1000))  # (about 20 DELIVERs of 1 MiB: more than its pipe holds)
        first = wire.parse_reply(recv(sock))
        wait_until(lambda: endpoint.replies.backlog_bytes > 0, timeout_s=10)
        sock.send_multipart(wire.ack(first.keys))
        settled = None
        while settled is None:  # (reading the deliveries that wait before it)
            reply = wire.parse_reply(recv(sock))
            if isinstance(reply, wire.Settled):
                settled = reply
        assert settled == wire.Settled(len(first.keys), [])
    finally:
        sock.close(linger=0)


def test_one_curve_key_opening_256_consumers_leaves_room_for_another_keys_hello(make_server, keys):  # noqa: F811
    shutil.copy(keys / "mallory" / "mallory.key", keys / "clients")  # (both keys allowed)
    consume, _ = free_tcp_endpoint()
    make_server(consume_dsn=consume, **curve_settings(keys, unauthenticated="monitor"))
    server_key = str(keys / "server" / "server.key")
    opened: list[zmq.Socket] = []

    def hello(name: str) -> object:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        secure_client(sock, str(keys / name / f"{name}.key_secret"), server_key)
        sock.connect(consume)
        opened.append(sock)
        sock.send_multipart(wire.hello())
        answer = wire.parse_reply(recv(sock, 10_000))
        if isinstance(answer, wire.Limits):
            sock.send_multipart(wire.credit(1))  # (holds credit: never evicted to make room)
        return answer

    try:
        answers = [hello("mallory") for _ in range(256)]
        accepted = sum(isinstance(a, wire.Limits) for a in answers)
        refused = [a for a in answers if not isinstance(a, wire.Limits)]
        assert accepted == 256 // 8, "one key holds an eighth of the consumer slots"
        assert all(getattr(a, "code", None) == "too-many-consumers" for a in refused)
        assert isinstance(hello("alice"), wire.Limits), "another key's HELLO is answered beside them"
    finally:
        for sock in opened:
            sock.close(0)
