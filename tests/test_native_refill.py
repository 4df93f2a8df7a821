"""The receive pipe's refill (r7-legacy-rx, issue 27's leaner legacy path): under a 16 MiB
--max-message-size (the default before 1 MiB) and pipes of 64 MiB (before r10-house) a producer's pipe
holds 4 messages (Limits.pipe_messages: the memory bound), so a turn
that stopped at the first empty pipe committed a dozen messages of a window of 100. A turn that ran a full
pipe dry now waits (a few tens of µs at most) for libzmq's I/O thread to refill it, while each wait brings
more: a commit carries the window, and the pipe's bound in bytes is unchanged. These tests count commits
and waits, never the clock."""

from __future__ import annotations

import dataclasses
import time

import zmq

from pzq.config import DEFAULT_LIMITS
from pzq.endpoints.native import NativeEndpoints
from pzq.protocols import native as wire
from pzq.server import Server

from conftest import make_config


def _server(tmp_path, **limits) -> tuple[Server, NativeEndpoints]:
    """A started server on ipc endpoints (libzmq's I/O thread fills its pipes, as over TCP) whose turns
    the test runs itself; its --max-message-size is 16 MiB and its pipes 64 MiB (the bound before
    r10-house), so its receive pipe is 4 messages deep."""
    limits.setdefault("pipe_in_bytes", 64 << 20)
    cfg = make_config(tmp_path, limits=dataclasses.replace(DEFAULT_LIMITS, **limits), max_message_size=16 << 20)
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    native = next(e for e in server.endpoints if isinstance(e, NativeEndpoints))
    return server, native


def _producer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _acks(sock: zmq.Socket, timeout_ms: int = 0) -> list[bytes]:
    """The message ids of the acks waiting on a producer's socket (the first within ``timeout_ms``)."""
    ids = []
    while sock.poll(timeout_ms):
        ack = wire.parse_produce_ack(sock.recv_multipart())
        assert ack is not None and ack.ok
        ids.append(ack.message_id)
        timeout_ms = 0
    return ids


def _turn_until_read(server: Server, native: NativeEndpoints) -> None:
    """Once the receive socket has something to read, a turn."""
    assert native.receive.poll(5000), "the producer's messages reach the server"
    server._turn(0)


def _acked(server: Server, producer: zmq.Socket, count: int) -> list[bytes]:
    """Turns until the producer has ``count`` acks (in at most 100 turns), and the acks' ids."""
    acked: list[bytes] = []
    for _ in range(100):
        server._turn(10)
        acked += _acks(producer, 10)
        if len(acked) >= count:
            break
    return acked


def test_a_pipelining_producers_window_is_committed_in_one_turn_though_its_pipe_holds_four(tmp_path):
    # (the wait's bound raised: on a loaded machine the I/O thread's refill may take a while; it is only
    # the longest a wait may last, each one ends as soon as the pipe is refilled)
    server, native = _server(tmp_path, refill_wait_s=0.2, turn_budget_s=1.0)
    producer = _producer(server.config.receive_dsn)
    try:
        assert native.depth == 4, "a 16 MiB --max-message-size keeps the pipe four messages deep"
        sent = [b"%d" % i for i in range(60)]
        for message_id in sent:
            producer.send_multipart(wire.produce(message_id, [b"body"]))
        syncs = server.store.syncs
        assert native.receive.poll(5000), "the producer's messages reach the server"
        # (libzmq's I/O thread fills the pipe to its depth at once; no event tells when it has, only that
        # it began: a turn at the first message would see it half full, as a producer's first turn may)
        time.sleep(0.1)
        server._turn(0)
        # Without the refill, the turn read the pipe's 4 (and the 2 or so the I/O thread put in beside
        # them) and committed those: ten commits for the window
        assert server.store.syncs == syncs + 1
        assert server.stats()["messages"] == 60, "the whole window in one commit"
        acked: list[bytes] = []
        while len(acked) < 60 and (more := _acks(producer, 5000)):
            acked += more
        assert acked == sent, "acked in order"
    finally:
        producer.close(0)
        server.close()


def test_a_lock_step_producer_never_makes_a_turn_wait_for_a_refill(tmp_path):
    server, native = _server(tmp_path)
    producer = _producer(server.config.receive_dsn)
    try:
        for i in range(20):
            producer.send_multipart(wire.produce(b"%d" % i, [b"body"]))
            assert _acked(server, producer, 1) == [b"%d" % i]
        assert native.refill_waits == 0, "a pipe never full: nothing more was coming, no turn waited"
    finally:
        producer.close(0)
        server.close()


def test_several_lock_step_producers_read_together_never_make_a_turn_wait(tmp_path):
    # Eight producers' messages in one turn fill no pipe (one each): the wait is for one producer's
    # window held back by its full pipe, not for many producers' single messages.
    server, native = _server(tmp_path)
    producers = [_producer(server.config.receive_dsn) for _ in range(8)]
    try:
        for n, producer in enumerate(producers):
            producer.send_multipart(wire.produce(b"p%d" % n, [b"body"]))
        acked: list[bytes] = []
        for _ in range(100):
            server._turn(10)
            acked += [a for p in producers for a in _acks(p, 10)]
            if len(acked) == 8:
                break
        assert sorted(acked) == sorted(b"p%d" % n for n in range(8))
        assert native.refill_waits == 0
    finally:
        for producer in producers:
            producer.close(0)
        server.close()


def test_a_producer_whose_window_is_the_pipes_depth_costs_a_turn_one_short_wait_at_most(tmp_path):
    # Its pipe was full, so the turn waits for more, which never comes (it waits for its acks): one wait
    # of refill_wait_s (tens of µs), never more in a turn.
    server, native = _server(tmp_path)
    producer = _producer(server.config.receive_dsn)
    try:
        for round_ in range(5):
            sent = [b"%d-%d" % (round_, i) for i in range(native.depth)]
            waits, turns = native.refill_waits, server.turns
            for message_id in sent:
                producer.send_multipart(wire.produce(message_id, [b"body"]))
            assert _acked(server, producer, len(sent)) == sent
            assert native.refill_waits - waits <= server.turns - turns, "at most one fruitless wait a turn"
    finally:
        producer.close(0)
        server.close()


def test_a_hostile_producer_pipelining_the_largest_messages_still_parks_at_most_the_pipe_budget(tmp_path):
    # The refill reads again sooner; it does not deepen the pipe: libzmq still holds at most RCVHWM of a
    # producer's messages of up to --max-message-size, Limits.pipe_in_bytes (64 MiB here) of 16 MiB ones, and
    # the server holds no more than before (past its part, a big message is answered busy, unstored).
    server, native = _server(tmp_path, refill_wait_s=0.2)
    producer = _producer(server.config.receive_dsn)
    try:
        limits, largest = server.config.limits, server.config.max_message_size
        assert native.receive.getsockopt(zmq.RCVHWM) == limits.pipe_messages(largest + 4096, 1000)
        assert native.receive.getsockopt(zmq.RCVHWM) * server.config.max_message_size <= limits.pipe_in_bytes
        body = b"x" * (server.config.max_message_size - 1024)
        for i in range(8):
            producer.send_multipart(wire.produce(b"%d" % i, [body]))
        answers: list[wire.ProduceAck] = []
        for _ in range(200):
            if len(answers) < 8:
                server._turn(10)  # (some turns only commit what an earlier one held)
            held = native.memory()["native_held"]
            assert held <= limits.held_in_bytes // 4 + len(body) + 4096, "held no more than its part"
            while producer.poll(50):
                answer = wire.parse_produce_ack(producer.recv_multipart())
                assert answer is not None
                answers.append(answer)
            if len(answers) == 8:
                break
        stored = [a.message_id for a in answers if a.ok]
        assert len(answers) == 8 and stored and stored == sorted(stored, key=int), "each answered, stored in order"
        assert all(a.error.startswith("busy") for a in answers if not a.ok)
        assert server.stats()["messages"] == len(stored)
    finally:
        producer.close(0)
        server.close()


def test_a_turn_holding_a_producers_big_messages_waits_no_more_to_read_further_into_its_pipeline(tmp_path):
    # A hostile producer pipelines messages bigger than what a turn lets in: each is held for a turn of its
    # own and its next ones wait behind it. A refill would only add to what is held (8 MiB of held
    # messages raised the memory alarm in test_native_consume), so a turn that holds any waits no more.
    server, native = _server(tmp_path, refill_wait_s=0.2, turn_write_bytes=1 << 20)
    producer = _producer(server.config.receive_dsn)
    try:
        body = b"x" * (200 << 10)
        sent = [b"%d" % i for i in range(30)]
        for message_id in sent:
            producer.send_multipart(wire.produce(message_id, [body]))
        acked: list[bytes] = []
        most_held = 0
        for _ in range(300):
            waits = native.refill_waits
            server._turn(10)
            held = native.memory()["native_held"]
            most_held = max(most_held, held)
            # (a wait before the turn held anything may bring the message it holds: two at most, as
            # the turn's 1 MiB lets in five; a turn that waited while holding waited six to ten times)
            assert not held or native.refill_waits - waits <= 2, "waited for refills while holding messages"
            acked += _acks(producer, 10)
            if len(acked) == len(sent):
                break
        assert acked == sent, "every message stored once, in order"
        # (what is held is bounded as before: a quarter of held_in_bytes for one producer, and one message)
        assert most_held <= server.config.limits.held_in_bytes // 4 + len(body) + 4096, f"held {most_held} bytes"
    finally:
        producer.close(0)
        server.close()
