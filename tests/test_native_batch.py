"""Batched producers (PZQ-BATCH/1) through real sockets: a real server, legacy consumers, an old server
simulated by a tiny ROUTER that answers as shared/specs/pzq-wire.md says, and a restart of a real
subprocess server."""

from __future__ import annotations

import threading

import msgpack
import pytest
import zmq

from pzq.clients import native as client
from pzq.protocols import native_batch as wire
from pzq.protocols.native import BUSY, EMPTY_MESSAGE, QUEUE_FULL

from conftest import recv, wait_connected, wait_until


def dealer(sockets, server) -> zmq.Socket:
    return sockets(zmq.DEALER, server.receive)


def ask(sock: zmq.Socket, frames: list[bytes]) -> list[bytes]:
    sock.send_multipart(frames)
    return recv(sock)


def test_a_batch_is_stored_and_acked_once_and_each_message_reaches_a_legacy_consumer_with_its_own_key(server, sockets):
    d = dealer(sockets, server)
    c = wait_connected(sockets(zmq.ROUTER, None), server.send)
    messages = [[b"m%d" % i] for i in range(50)] + [[b"two", b"\x00frames"]]
    assert ask(d, wire.batch(b"b1", messages)) == [b"b1", b"1", b"", b"51"]
    assert not d.poll(100), "one ack for the batch"
    keys, got = set(), []
    for _ in messages:
        peer, key, _sent, _timeout, delimiter, *body = recv(c)
        assert delimiter == b""
        keys.add(key)
        got.append(body)
        c.send_multipart([peer, key, b"1"])
    assert got == messages, "in order, each as produced"
    assert len(keys) == len(messages), "each message has its own key"
    wait_until(lambda: server.stats()["messages"] == 0)


def test_acks_of_one_producer_keep_their_order_around_a_batch(server, sockets):
    d = dealer(sockets, server)
    d.send_multipart([b"m1", b"", b"a"])
    d.send_multipart(wire.batch(b"b1", [[b"b"], [b"c"]]))
    d.send_multipart([b"m2", b"", b"d"])
    assert [recv(d)[0] for _ in range(3)] == [b"m1", b"b1", b"m2"]


def test_a_full_queue_mid_batch_acks_the_prefix_and_stores_nothing_after_it(make_server, sockets):
    server = make_server(max_store_size=1 << 20)
    d = dealer(sockets, server)
    batch_id, ok, _, error, stored = ask(d, wire.batch(b"big", [[b"x" * 100_000]] * 12))
    assert (batch_id, ok, error) == (b"big", b"0", QUEUE_FULL.encode())
    assert 0 < int(stored) < 12 and server.stats()["messages"] == int(stored)
    # (what is there is the prefix: the first `stored` messages, in order)
    assert ask(d, wire.batch(b"big", [[b"x" * 100_000]] * 12)) == [b"big", b"0", b"", QUEUE_FULL.encode(), stored]
    assert server.stats()["messages"] == int(stored), "a resend of it stores nothing more"


def test_a_resent_batch_id_is_stored_once(server, sockets):
    d = dealer(sockets, server)
    assert ask(d, wire.batch(b"once", [[b"a"], [b"b"]]))[1] == b"1"
    assert ask(dealer(sockets, server), wire.batch(b"once", [[b"a"], [b"b"]])) == [b"once", b"1", b"", b"2"]
    assert server.stats()["messages"] == 2


def test_a_resent_batch_id_is_stored_once_across_a_server_restart(process_server, sockets):
    server = process_server()
    d = sockets(zmq.DEALER, server.receive)
    assert ask(d, wire.batch(b"kept", [[b"a"], [b"b"], [b"c"]])) == [b"kept", b"1", b"", b"3"]
    server.restart()
    d = sockets(zmq.DEALER, server.receive)
    assert ask(d, wire.batch(b"kept", [[b"a"], [b"b"], [b"c"]])) == [b"kept", b"1", b"", b"3"]
    assert server.stats()["messages"] == 3


HOSTILE = [
    ("over the message cap", wire.batch(b"h1", [[b"a"]] * 1001)),
    ("over the byte cap", [b"h2", wire.MARK, b"", msgpack.packb([[b"x" * (2 << 20)]])]),
    ("over the frame cap", wire.batch(b"h10", [[b""] * 4097])),
    ("malformed msgpack", [b"h3", wire.MARK, b"", b"\xc1\xc1\xc1"]),
    ("nested bomb", [b"h4", wire.MARK, b"", b"\x91" * 200_000 + b"\xc0"]),
    ("an empty batch", [b"h5", wire.MARK, b"", b"\x90"]),
    ("a batch of empty messages", [b"h6", wire.MARK, b"", b"\x93\x90\x90\x90"]),
    ("a non-ascii id", ["bätch".encode(), wire.MARK, b"", msgpack.packb([[b"a"]])]),
    ("two bodies frames", [b"h8", wire.MARK, b"", msgpack.packb([[b"a"]]), b"more"]),
    ("a frame of a million nils", [b"h9", wire.MARK, b"", b"\x91\xdd\x00\x0f\x42\x40" + b"\xc0" * 1_000_000]),
]


@pytest.mark.parametrize(("what", "frames"), HOSTILE, ids=[what for what, _ in HOSTILE])
def test_a_hostile_batch_is_answered_with_a_clear_error_and_the_server_keeps_serving(server, sockets, what, frames):
    honest = dealer(sockets, server)
    answer = ask(dealer(sockets, server), frames)
    assert answer[1:3] == [b"0", b""] and answer[4] == b"0", what
    assert len(answer[3]) > 10 and answer[3].decode().isprintable(), "a clear error text"
    assert ask(honest, wire.batch(b"honest", [[b"ok"]])) == [b"honest", b"1", b"", b"1"]
    assert server.stats()["messages"] == 1, "nothing of the hostile batch was stored"


def test_the_probe_answers_the_servers_caps(server, sockets):
    answer = ask(dealer(sockets, server), wire.probe(b"p1"))
    assert wire.parse_probe_answer(answer) == wire.Caps(1000, 2 << 20, server.config.max_message_size, 4096)


class OldServer:
    """A ROUTER that answers as the original PZQ server does (shared/specs/pzq-wire.md): header frames are
    ignored, "" then the body; no body is "Trying to save empty message"; each message stored is "1"."""

    def __init__(self, endpoint: str):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.linger = 0
        self.sock.bind(endpoint)
        self.bodies: list[list[bytes]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            routing, mid, *rest = self.sock.recv_multipart()
            body = rest[rest.index(b"") + 1 :]
            if not body:
                self.sock.send_multipart([routing, mid, b"0", b"", EMPTY_MESSAGE.encode()])
                continue
            self.bodies.append(body)
            self.sock.send_multipart([routing, mid, b"1", b""])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close(linger=0)


def test_the_client_falls_back_to_one_message_at_a_time_against_an_old_server(tmp_path):
    old = OldServer(f"ipc://{tmp_path}/old")
    try:
        with client.Producer(f"ipc://{tmp_path}/old", timeout_s=5) as producer:
            assert producer.batch_caps() is None
            results = producer.send_many([[b"m%d" % i] for i in range(30)], batch=10, window=2)
        assert all(r.ok for r in results) and len(results) == 30
        assert old.bodies == [[b"m%d" % i] for i in range(30)], "one message per multipart, nothing packed"
    finally:
        old.close()


def test_the_client_sends_batches_in_order_and_splits_them_at_the_servers_caps(make_server):
    server = make_server(max_message_size=4096)
    with client.Producer(server.receive) as producer:
        bodies = [[b"%05d" % i, b"y" * (i % 7)] for i in range(2500)] + [[b"z" * 4096]]
        results = producer.send_many(bodies, batch=2000, window=3)
        assert all(r.ok for r in results) and len(results) == len(bodies)
        assert producer.batches.sent_batches == 3, "batches of at most the server's 1,000 messages"
        too_big = producer.send_many([[b"z" * 4097]])
        assert not too_big[0].ok and "too large" in too_big[0].error
    with client.Consumer(server.send) as consumer:
        for body in bodies[:50]:
            delivery = consumer.receive(timeout_s=5)
            assert delivery is not None and delivery.body == body
            consumer.ack(delivery)


def test_the_client_sends_a_batch_answered_busy_again_and_every_message_is_stored(make_server):
    # Batches near max_bytes, 12 in flight: one bigger than what is left of a turn is held, the next ones
    # wait behind it and past its producer's share (a quarter of held_in_bytes) are answered busy
    server = make_server()
    with client.Producer(server.receive) as producer:
        bodies = [[b"%06d" % i + b"x" * 10_000] for i in range(190 * 40)]
        results = producer.send_many(bodies, batch=190, window=12)
        assert [r.error for r in results if not r.ok] == [] and len(results) == len(bodies)
    assert server.stats()["messages"] == len(bodies)
    # (how many were busy depends on the timing of the turns; each was sent again)
    assert server.stats()["native"]["busy_refused_total"] == producer.batches.busy_resent


def test_the_client_resends_the_unstored_rest_of_a_batch_as_a_new_batch(make_server):
    server = make_server(max_store_size=1 << 20)
    with client.Producer(server.receive) as producer:
        results = producer.send_many([[b"x" * 100_000]] * 12, batch=12, window=1)
    stored = server.stats()["messages"]
    assert [r.ok for r in results] == [True] * stored + [False] * (12 - stored)
    assert {r.error for r in results if not r.ok} == {QUEUE_FULL}
    assert producer.batches.sent_batches == 2, "the rest went once more, and was refused whole"


class ForgetfulServer(OldServer):
    """A ROUTER that speaks PZQ-BATCH/1 but leaves the first answer to each batch unsent (as if the ack
    were lost), then answers its resend."""

    def _run(self) -> None:
        caps = wire.Caps(1000, 4 << 20, 1 << 20, 4096)
        seen: list[bytes] = []
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            event = wire.parse_batch(frames, caps)
            if isinstance(event, wire.Probe):
                self.sock.send_multipart(wire.probe_answer(event.routing, event.probe_id, caps))
            elif isinstance(event, wire.Batch):
                self.bodies.append([event.batch_id])
                if event.batch_id in seen:
                    self.sock.send_multipart(wire.batch_ack(event.routing, event.batch_id, len(event.bodies)))
                seen.append(event.batch_id)


def test_a_batch_whose_ack_is_lost_is_sent_again_with_the_same_id(tmp_path):
    forgetful = ForgetfulServer(f"ipc://{tmp_path}/forgetful")
    try:
        with client.Producer(f"ipc://{tmp_path}/forgetful", timeout_s=0.3) as producer:
            results = producer.send_many([[b"a"], [b"b"]], batch=10)
        assert all(r.ok for r in results) and producer.batches.resent == 1
        [first], [again] = forgetful.bodies
        assert first == again, "the same id: the server stores it once"
    finally:
        forgetful.close()


def test_a_batch_draws_each_of_its_messages_on_the_turns_records_and_is_never_split(tmp_path):
    from test_turn_budget import _producer, _turn_by_turn

    server, receive = _turn_by_turn(tmp_path, turn_records=100)
    producer = _producer(receive)
    try:
        for i in range(4):
            producer.send_multipart(wire.batch(b"b%d" % i, [[b"m"]] * 60))
        per_turn: list[list[bytes]] = []
        for _ in range(30):
            server._turn(0)
            acked = []
            while producer.poll(0):
                answer = wire.parse_batch_ack(producer.recv_multipart())
                assert answer is not None and answer.ok and answer.stored == 60, "whole, never split"
                acked.append(answer.batch_id)
            if acked:
                per_turn.append(acked)
            if sum(map(len, per_turn)) == 4:
                break
        # 100 records a turn: the first batch leaves 40, the second is let in whole (a request is never cut)
        # and spends the turn; one by one, the same 240 messages would take three turns too
        assert [b for turn in per_turn for b in turn] == [b"b0", b"b1", b"b2", b"b3"]
        assert max(map(len, per_turn)) <= 2, per_turn
        assert server.stats()["messages"] == 240
    finally:
        producer.close(0)
        server.close()


def test_a_batch_past_what_a_turn_can_still_let_in_is_committed_whole_in_a_turn_of_its_own(tmp_path):
    from test_turn_budget import _producer, _turn_by_turn

    server, receive = _turn_by_turn(tmp_path, turn_write_bytes=600_000, body_chunk_bytes=64 << 10)
    producer = _producer(receive)
    try:
        producer.send_multipart([b"m1", b"", b"y" * 200_000])
        producer.send_multipart(wire.batch(b"b1", [[b"x" * 50_000]] * 10))
        # (counted in what each commit stored, not in acks a turn: the acks of consecutive commits may leave
        # together, one sync carrying both, as on a busy machine; docs/semantics.md, "One sync a commit")
        acked: list[bytes] = []
        commits: list[int] = []
        stored = server.stats()["messages"]
        for _ in range(30):
            server._turn(0)
            if (now := server.stats()["messages"]) != stored:
                commits.append(now - stored)
                stored = now
            while producer.poll(0):
                frames = producer.recv_multipart()
                acked.append(frames[0])
                if frames[0] == b"b1":
                    assert frames == [b"b1", b"1", b"", b"10"], "stored whole, as its ten messages"
            if len(acked) == 2:
                break
        assert acked == [b"m1", b"b1"]
        assert commits == [1, 10], "the batch whole, in a commit of its own"
    finally:
        producer.close(0)
        server.close()


def test_a_batch_behind_its_producers_big_message_past_its_share_hears_busy_as_a_batch(tmp_path):
    from test_turn_budget import _producer, _turn_by_turn

    server, receive = _turn_by_turn(
        tmp_path, turn_write_bytes=600_000, body_chunk_bytes=64 << 10, held_in_bytes=2_000_000
    )
    producer = _producer(receive)
    try:
        producer.send_multipart([b"big", b"", b"y" * 700_000])
        producer.send_multipart(wire.batch(b"b1", [[b"x" * 50_000]] * 4))
        answers: dict[bytes, list[bytes]] = {}
        for _ in range(30):
            server._turn(0)
            while producer.poll(0):
                frames = producer.recv_multipart()
                answers[frames[0]] = frames
            if len(answers) == 2:
                break
        assert answers[b"big"] == [b"big", b"1", b""]
        assert wire.parse_batch_ack(answers[b"b1"]) == wire.BatchAck(b"b1", False, 0, BUSY)
        assert server.stats()["messages"] == 1
    finally:
        producer.close(0)
        server.close()


def test_pzq_produce_sends_batches_and_says_what_it_always_said(server):
    from click.testing import CliRunner

    from pzq.cli import cli

    lines = "".join(f"line {i}\n" for i in range(250))
    result = CliRunner().invoke(cli, ["produce", "--receive-dsn", server.receive, "--batch", "100"], input=lines)
    assert result.exit_code == 0, result.output
    assert result.output == "250 stored, 0 refused\n"
    assert server.stats()["native"]["batches"] == 3, "in batches of 100"
    with client.Consumer(server.send) as consumer:
        for i in range(250):
            delivery = consumer.receive(timeout_s=5)
            assert delivery is not None and delivery.body == [b"line %d" % i]
            consumer.ack(delivery)


def test_pzq_produce_with_batch_1_sends_one_message_at_a_time(server):
    from click.testing import CliRunner

    from pzq.cli import cli

    result = CliRunner().invoke(cli, ["produce", "--receive-dsn", server.receive, "--batch", "1", "a", "b"])
    assert result.exit_code == 0 and server.stats()["messages"] == 2
    assert server.stats()["native"]["batches"] == 0
