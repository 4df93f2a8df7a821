"""Big bodies in chunks (issue 26: a 16 MiB message must not hold every client for one long commit):
past ``Limits.body_chunk_bytes`` a native message is written a part per turn, no turn's commit
carrying much more than ``turn_write_bytes`` of it, and acked after the commit of its last part; it
reads back to the byte wherever its record moves, its chunks go with its record, and neither a failed
turn nor a killed server leaves half-written bodies behind."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time

import pytest
import zmq
from test_failing_commits import plant_a_foreign_record

from pzq.clients import native as client
from pzq.config import DEFAULT_LIMITS
from pzq.protocols import native as wire
from pzq.server import Server
from pzq.store import Store

from conftest import make_config

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


def _entries(store: Store, table: str) -> int:
    """Committed records of ``table`` (what a crash would leave)."""
    with store.env.snapshot() as txn:
        return txn.stat(store.env.dbs[table])["entries"]


def _written(store: Store, frames: list[bytes], chunk: int = MIB):
    upload = store.bodies.begin(frames, chunk)
    while not upload.done:
        store.bodies.write(upload, 2 * MIB)
        store.commit()
    return upload


def test_a_chunked_body_reads_back_to_the_byte_wherever_its_record_moves_and_its_chunks_go_with_its_ack(tmp_path):
    store = Store(tmp_path / "db", max_size=1 << 30)
    body = [os.urandom(3 * MIB + 5), b"tail", os.urandom(100)]
    empty = store.stored_bytes
    message = store.put_body("q", _written(store, body), now_us=5)
    store.commit()
    stored = store.stored_bytes
    assert stored - empty > sum(map(len, body)), "its chunks count toward the store limit"
    assert store.get("q", message.seq).frames == body
    [preview] = store.previews.first("q", 5, 10)
    assert (preview.body_head, preview.body_size) == (body[0][:10], sum(map(len, body)))

    moved = store.requeue_at_end(store.get("q", message.seq))
    store.commit()
    assert store.dead_letters.add(store.get("q", moved.seq), "too many deliveries", now_us=9)
    store.commit()
    [letter] = store.dead_letters.read("q")
    assert letter.message.frames == body
    [preview] = store.previews.first("q", 5, 10, dead=True)
    assert (preview.body_head, preview.body_size, preview.reason) == (
        body[0][:10],
        sum(map(len, body)),
        "too many deliveries",
    )
    [again] = store.dead_letters.requeue("q")
    store.commit()
    assert store.get("q", again.seq).frames == body
    assert store.stored_bytes == stored, "moving a record neither copies nor loses its chunks"

    assert store.delete("q", again.seq)
    store.commit()
    assert _entries(store, "bodies") == 0
    assert store.stored_bytes == empty
    store.close()
    reopened = Store(tmp_path / "db", max_size=1 << 30)
    assert reopened.stored_bytes == empty
    reopened.close()


def test_dropping_a_queue_deleting_a_range_or_a_dead_letter_removes_their_chunks(tmp_path):
    store = Store(tmp_path / "db", max_size=1 << 30)
    empty = store.stored_bytes
    seqs = [store.put_body("a", _written(store, [os.urandom(MIB + 1)]), now_us=1).seq for _ in range(3)]
    store.put_body("b", _written(store, [os.urandom(2 * MIB)]), now_us=1)
    store.commit()
    assert store.delete_range("a", seqs[0], seqs[1] + 1, 10) == (2, seqs[1] + 1)
    assert store.dead_letters.add(store.get("a", seqs[2]), "expired", now_us=2)
    assert store.dead_letters.delete("a") == 1
    store.commit()
    assert _entries(store, "bodies") == 2, "only queue b's body is left"
    store.drops.drop("b")
    store.drops.share(100)  # (its records go a share at a time: store/drops.py)
    store.commit()
    assert _entries(store, "bodies") == 0
    assert store.stored_bytes == empty
    store.close()


def test_a_body_half_written_when_the_store_closed_is_removed_at_start_up(tmp_path):
    store = Store(tmp_path / "db", max_size=1 << 30)
    empty = store.stored_bytes
    upload = store.bodies.begin([os.urandom(5 * MIB)], MIB)
    store.bodies.write(upload, 2 * MIB)
    store.commit()
    assert _entries(store, "bodies") == 2 and _entries(store, "uploads") == 1
    store.close()
    store = Store(tmp_path / "db", max_size=1 << 30)
    assert (_entries(store, "bodies"), _entries(store, "uploads")) == (0, 0)
    assert store.stored_bytes == empty
    store.close()


def _server(tmp_path, name: str, **limits) -> Server:
    cfg = make_config(
        tmp_path,
        receive_dsn=f"inproc://chunked-receive-{name}",
        send_dsn=f"inproc://chunked-send-{name}",
        monitor_dsn=f"inproc://chunked-monitor-{name}",
        limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
        max_message_size=16 << 20,  # (big bodies: the default before 1 MiB)
    )
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    return server


def _next_turn(server: Server) -> None:
    """A turn of ``server``, waiting for an event as long as its loop would (at most 100 ms): with work left
    over (a big message's next parts), at once; a turn waiting 100 ms for nothing was most of these tests."""
    server._turn(min(100, server._poll_timeout_ms()))


def _producer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _acks(sock: zmq.Socket) -> list[wire.ProduceAck]:
    out = []
    while sock.poll(0):
        ack = wire.parse_produce_ack(sock.recv_multipart())
        assert ack is not None
        out.append(ack)
    return out


def test_a_big_message_is_written_over_turns_no_commit_carrying_more_than_the_turns_bytes_and_acked_after_its_last(
    tmp_path,
):
    server = _server(tmp_path, "turns", turn_write_bytes=2 * MIB, body_chunk_bytes=MIB)
    store = server.store
    big, small = _producer(server.config.receive_dsn), _producer(server.config.receive_dsn)
    body = os.urandom(16 * MIB)
    try:
        big.send_multipart(wire.produce(b"big", [body]))
        server._turn(1000)  # (reads it and holds it: more than a turn lets in)
        small.send_multipart(wire.produce(b"small", [b"x"]))
        chunks_before, chunks_per_turn, acked_at = 0, [], {}
        for turn in range(60):
            _next_turn(server)
            chunks = _entries(store, "bodies")
            chunks_per_turn.append(chunks - chunks_before)
            chunks_before = chunks
            for ack in _acks(big) + _acks(small):
                assert ack.ok, ack
                acked_at[ack.message_id] = (turn, chunks)
            if len(acked_at) == 2:
                break
        assert acked_at[b"big"][1] == 16, "acked only once every chunk was committed"
        assert max(chunks_per_turn) <= 2, f"no turn wrote more than turn_write_bytes of it: {chunks_per_turn}"
        assert acked_at[b"small"][0] < acked_at[b"big"][0], "another producer's message went between its parts"
        with client.Consumer(server.config.send_dsn, ctx=zmq.Context.instance()) as consumer:
            for _ in range(60):
                server._turn(0)
                delivery = consumer.receive(timeout_s=0)
                if delivery is not None and delivery.body == [body]:
                    break
            else:
                raise AssertionError("the big message was not delivered to the byte")
    finally:
        big.close(0)
        small.close(0)
        server.close()


def test_a_turn_that_fails_mid_upload_answers_store_failure_and_removes_the_parts_written_before(tmp_path):
    cfg_queue = make_config(tmp_path).queue
    plant_a_foreign_record(tmp_path / "db", cfg_queue, 0)  # (seq 2 is taken: the second message's put fails)
    server = _server(tmp_path, "fails", turn_write_bytes=2 * MIB, body_chunk_bytes=MIB)
    store = server.store
    producer = _producer(server.config.receive_dsn)
    try:
        producer.send_multipart(wire.produce(b"first", [b"small"]))
        producer.send_multipart(wire.produce(b"big", [os.urandom(6 * MIB)]))
        acks: dict[bytes, wire.ProduceAck] = {}
        for _ in range(40):
            _next_turn(server)
            acks.update((ack.message_id, ack) for ack in _acks(producer))
            if len(acks) == 2 and _entries(store, "bodies") == 0:
                break
        assert acks[b"first"].ok
        assert not acks[b"big"].ok and acks[b"big"].error == wire.STORE_FAILED
        assert (_entries(store, "bodies"), _entries(store, "uploads")) == (0, 0)
    finally:
        producer.close(0)
        server.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_server_killed_while_big_messages_are_written_keeps_every_acked_one_and_no_half_written_one(
    process_server, tmp_path
):
    srv = process_server("--max-message-size", str(20 * MIB))
    bodies = {b"m%d" % i: os.urandom(4 * MIB + i) for i in range(40)}
    acked: list[bytes] = []
    stop = threading.Event()

    def produce() -> None:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(srv.receive)
        for mid, body in bodies.items():  # (pipelined: the server is writing one body or another at any time)
            sock.send_multipart(wire.produce(mid, [body]))
        while not stop.is_set():
            if sock.poll(100):
                ack = wire.parse_produce_ack(sock.recv_multipart())
                if ack is not None and ack.ok:
                    acked.append(ack.message_id)
        sock.close(0)

    half_written = 0
    for _ in range(10):  # killed at random moments of the stream until one fell between a body's parts
        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        target = len(acked) + 1
        while len(acked) < target and thread.is_alive():
            thread.join(0.01)
        time.sleep(random.uniform(0, 0.05))  # (no poll can say "mid-body": any moment will do)
        srv.stop(signal.SIGKILL)
        stop.set()
        thread.join(15)
        stop.clear()
        store = Store(srv.database, max_size=1 << 30, readonly=True)
        half_written += _entries(store, "uploads") > 0
        store.close()
        srv.start()
        if half_written >= 2:
            break
    assert half_written, "no kill fell between a body's parts"
    srv.stop()  # (the last start removed what the last kill left half written)
    store = Store(srv.database, max_size=1 << 30, readonly=True)
    try:
        messages = store.scan(make_config(tmp_path).queue, 0, 1000)
        got = {m.frames[0] for m in messages}
        assert acked and all(bodies[mid] in got for mid in acked), "every acked big message is stored, to the byte"
        assert _entries(store, "uploads") == 0
        named = sum(m.body[1] for m in messages if m.body is not None)
        assert _entries(store, "bodies") == named, "no chunk is left that no message names"
    finally:
        store.close()


def test_a_producers_pipeline_of_big_messages_is_answered_busy_past_its_part_and_others_are_read_meanwhile(tmp_path):
    # One producer holds at most a quarter of what may be held (held_in_bytes) and always one message:
    # past it, its messages are answered "busy" at once instead of stopping the reading for everyone.
    server = _server(tmp_path, "busy", turn_write_bytes=2 * MIB, body_chunk_bytes=MIB, held_in_bytes=16 * MIB)
    big, small = _producer(server.config.receive_dsn), _producer(server.config.receive_dsn)
    try:
        for i in range(3):
            big.send_multipart(wire.produce(b"b%d" % i, [os.urandom(4 * MIB)]))
        server._turn(1000)
        small.send_multipart(wire.produce(b"s", [b"x"]))
        answers: dict[bytes, tuple[int, wire.ProduceAck]] = {}
        for turn in range(40):
            _next_turn(server)
            answers.update((ack.message_id, (turn, ack)) for ack in _acks(big) + _acks(small))
            if len(answers) == 4:
                break
        assert answers[b"b0"][1].ok and answers[b"s"][1].ok
        assert [answers[m][1].error for m in (b"b1", b"b2")] == [wire.BUSY, wire.BUSY]
        assert answers[b"s"][0] < answers[b"b0"][0], "the small message was read while the big one was written"
        assert server.stats()["native"]["busy_refused_total"] == 2
    finally:
        big.close(0)
        small.close(0)
        server.close()


def test_big_bodies_are_handed_out_one_a_turn_as_their_reading_draws_on_the_turns_bytes(tmp_path):
    server = _server(tmp_path, "reads", turn_write_bytes=2 * MIB, body_chunk_bytes=MIB)
    producer = _producer(server.config.receive_dsn)
    bodies = [os.urandom(3 * MIB + i) for i in range(4)]
    try:
        for i, body in enumerate(bodies):
            producer.send_multipart(wire.produce(b"m%d" % i, [body]))
            for _ in range(20):
                _next_turn(server)
                if _acks(producer):
                    break
        with client.Consumer(server.config.send_dsn, ctx=zmq.Context.instance()) as consumer:
            # Counted where they are handed out, a turn at a time (counted where they arrive, a delivery
            # late on a busy machine was counted with the next turn's: [1, 0, 1, 2])
            per_turn, got, handed = [], [], server.broker.counters.delivered
            for _ in range(30):
                _next_turn(server)
                per_turn.append(server.broker.counters.delivered - handed)
                handed = server.broker.counters.delivered
                while (delivery := consumer.receive(timeout_s=0.05)) is not None:
                    got.append(delivery.body[0])  # (unacked: the credit would let all four go at once)
                if len(got) == len(bodies):
                    break
        assert got == bodies
        assert max(per_turn) == 1, f"deliveries a turn: {per_turn}"
    finally:
        producer.close(0)
        server.close()
