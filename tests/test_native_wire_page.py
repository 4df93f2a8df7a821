"""What docs/protocols.md and docs/native-batch.md tell a client that never read pzq's code, against a real
server over ipc: every message read is answered (past the frame cap too), the order of answers to
pipelined commands, who gets SETTLED and who ERR, msgpack bin and str, the two delivery layouts, what is
deduplicated and for how long, and where the re-sent rest of a batch lands."""

from __future__ import annotations

import time

import msgpack
import zmq

from pzq.clients import native as client
from pzq.curve import secure_client
from pzq.protocols import native
from pzq.protocols import native_batch as batches
from pzq.protocols import native_consume as consume

from conftest import free_tcp_endpoint, recv, wait_connected, wait_until
from permission_keys import handshake

TOO_MANY = native.TOO_MANY_FRAMES.format(limit=1024, sent=1023).encode()


def ask(sock: zmq.Socket, frames: list[bytes]) -> list[bytes]:
    sock.send_multipart(frames)
    return recv(sock)


def consumer(sockets, srv, credit: int = 0) -> zmq.Socket:
    """A batched consumer that said HELLO (and granted ``credit``)."""
    sock = sockets(zmq.DEALER, srv.config.consume_dsn)
    assert isinstance(consume.parse_reply(ask(sock, consume.hello())), consume.Limits)
    if credit:
        sock.send_multipart(consume.credit(credit))
    return sock


def delivered_keys(sock: zmq.Socket, count: int) -> list[bytes]:
    keys: list[bytes] = []
    while len(keys) < count:
        keys += consume.parse_reply(recv(sock)).keys
    return keys


def test_a_legacy_message_of_1025_frames_with_the_routing_frame_is_answered_0_and_the_next_is_stored(server, sockets):
    producer = sockets(zmq.DEALER, server.receive)
    producer.send_multipart([b"m0", b"", b"before"])
    producer.send_multipart([b"m1", b"", *[b"x"] * 1022])  # 1,024 frames sent: 1,025 as the server reads them
    producer.send_multipart([b"m2", b"", b"after"])
    assert [recv(producer) for _ in range(3)] == [
        [b"m0", b"1", b""],
        [b"m1", b"0", b"", TOO_MANY],
        [b"m2", b"1", b""],
    ], "answered in its place among its producer's acks, and the next message is served"
    assert ask(producer, [b"m3", b"", *[b"y"] * 1021]) == [b"m3", b"1", b""], "1,024 with the routing frame fit"
    assert ask(producer, [b"m4", b"header", b"", *[b"z"] * 1021]) == [b"m4", b"0", b"", TOO_MANY], "headers count"
    assert server.stats()["messages"] == 3


def test_over_curve_a_message_past_the_frame_cap_is_answered_too(make_server, tenants, sockets):
    receive, _ = free_tcp_endpoint()
    srv = make_server(
        receive_dsn=receive, consume_dsn="", queue="orders.native", unauthenticated="monitor", **tenants.config()
    )
    producer = sockets(zmq.DEALER, None)
    secure_client(producer, *tenants.curve("orders"))
    assert handshake(producer, receive)
    assert ask(producer, [b"m1", b"", *[b"x"] * 1022]) == [b"m1", b"0", b"", TOO_MANY]
    assert ask(producer, [b"m2", b"", b"after"]) == [b"m2", b"1", b""]
    assert srv.stats()["queues"]["orders.native"]["depth"] == 1


def test_the_python_client_hears_a_message_no_batch_holds_refused_and_stores_the_rest(server):
    many = [b"f%d" % i for i in range(5000)]  # (past max_frames: sent alone, the legacy way, past 1,024)
    with client.Producer(server.receive, timeout_s=10) as producer:
        results = producer.send_many([[b"before"], many, [b"after"]], batch=10, window=2)
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error == TOO_MANY.decode()
    assert server.stats()["messages"] == 2


def test_a_batch_past_the_frame_cap_is_answered_as_a_batch_that_stored_nothing(server, sockets):
    producer = sockets(zmq.DEALER, server.receive)
    frames = [*batches.batch(b"b1", [[b"a"]]), *[b""] * 1021]
    assert ask(producer, frames) == [b"b1", b"0", b"", TOO_MANY, b"0"]
    assert ask(producer, batches.batch(b"b2", [[b"a"]])) == [b"b2", b"1", b"", b"1"]
    assert server.stats()["messages"] == 1


def test_a_batched_consumers_command_past_the_frame_cap_is_answered_err_and_it_is_still_served(server, sockets):
    sock = consumer(sockets, server)
    reply = consume.parse_reply(ask(sock, [b"ACK", *[b"k"] * 1024]))
    assert reply.code == "bad-frames" and "more than 1024 frames" in reply.detail
    with client.Producer(server.receive) as producer:
        assert producer.produce([b"m"]).ok
    sock.send_multipart(consume.credit(1))
    assert consume.parse_reply(recv(sock)).bodies == [[b"m"]]


def test_answers_to_pipelined_acks_and_credits_come_in_the_order_of_the_commands(server, sockets):
    with client.Producer(server.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"m%d" % i] for i in range(3)]))
    sock = consumer(sockets, server, credit=3)
    k0, k1, k2 = delivered_keys(sock, 3)
    for frames in (
        consume.ack([k0]),
        [b"CREDIT", b"-5"],
        [b"ACK", b"\xc1"],
        consume.credit(10**12),
        consume.nack([k1]),
        consume.credit(0),  # (no answer: accepted)
        consume.ack([k2]),
        consume.ack([k0]),  # (settled already: refused, not ERR)
    ):
        sock.send_multipart(frames)
    answers = [consume.parse_reply(recv(sock)) for _ in range(7)]
    assert [getattr(a, "code", a) for a in answers] == [
        consume.Settled(1, []),
        "bad-credit",
        "bad-keys",
        "too-much-credit",
        consume.Settled(1, []),
        consume.Settled(1, []),
        consume.Settled(0, [k0]),
    ]
    assert not sock.poll(200), "one answer each, none for the accepted CREDIT"


def test_an_ack_or_nack_from_a_consumer_that_never_said_hello_is_answered_settled_0_not_hello_first(server, sockets):
    with client.Producer(server.receive) as producer:
        assert producer.produce([b"m"]).ok
    owner = consumer(sockets, server, credit=1)
    (key,) = delivered_keys(owner, 1)
    stranger = sockets(zmq.DEALER, server.config.consume_dsn)
    assert consume.parse_reply(ask(stranger, consume.ack([key]))) == consume.Settled(0, [key])
    assert consume.parse_reply(ask(stranger, consume.nack([key]))) == consume.Settled(0, [key])
    assert consume.parse_reply(ask(stranger, consume.credit(1))).code == "hello-first"
    assert consume.parse_reply(ask(owner, consume.ack([key]))) == consume.Settled(1, [])


def test_a_str_where_a_batch_expects_bin_is_refused_whole_and_ack_keys_may_be_either(server, sockets):
    producer = sockets(zmq.DEALER, server.receive)
    as_str = [b"s1", batches.MARK, b"", msgpack.packb([[b"fine"], ["text"]], use_bin_type=True)]
    assert ask(producer, as_str) == [
        b"s1",
        b"0",
        b"",
        b"Malformed batch bodies: message 1 has a frame that is not bin",
        b"0",
    ]
    assert server.stats()["messages"] == 0, "nothing of it stored, the message of bin neither"
    assert ask(producer, batches.batch(b"s2", [[b"a"], [b"b"]])) == [b"s2", b"1", b"", b"2"]
    sock = consumer(sockets, server, credit=2)
    first, second = delivered_keys(sock, 2)
    stranger = sockets(zmq.DEALER, server.config.consume_dsn)
    refused = ask(stranger, [b"ACK", msgpack.packb([first.decode()], use_bin_type=True)])  # a str key
    assert refused == [b"SETTLED", b"0", b"\x91\xc4\x31" + first], "read as its bytes, echoed as bin"
    str_ack = [b"ACK", msgpack.packb([first.decode(), second], use_bin_type=True)]
    assert ask(sock, str_ack) == [b"SETTLED", b"2", b"\x90"]


def test_deliver_and_the_send_sockets_delivery_carry_the_ack_timeout_and_the_sent_time_in_opposite_orders(
    server, sockets
):
    with client.Producer(server.receive) as producer:
        assert producer.produce([b"batched"]).ok
        batched = consumer(sockets, server, credit=1)
        before_us = time.time_ns() // 1000
        name, timeout_us, sent_us, _keys, bodies = recv(batched)
        assert (name, timeout_us, msgpack.unpackb(bodies)) == (b"DELIVER", b"1000000", [[b"batched"]])
        legacy = wait_connected(sockets(zmq.ROUTER, None), server.send)
        assert producer.produce([b"legacy"]).ok
        _peer, _key, legacy_sent_us, legacy_timeout_us, delimiter, body = recv(legacy)
    assert (legacy_timeout_us, delimiter, body) == (b"1000000", b"", b"legacy")
    now_us = time.time_ns() // 1000
    for sent in (int(sent_us), int(legacy_sent_us)):  # (wall-clock µs since the epoch, in the other place)
        assert before_us - 5_000_000 <= sent <= now_us


def test_a_legacy_message_sent_again_with_the_same_id_is_stored_again(server, sockets):
    producer = sockets(zmq.DEALER, server.receive)
    assert ask(producer, [b"m1", b"", b"once?"]) == [b"m1", b"1", b""]
    assert ask(producer, [b"m1", b"", b"once?"]) == [b"m1", b"1", b""]
    assert server.stats()["messages"] == 2, "legacy ids are not remembered: a resend is a duplicate"


def test_the_servers_dedup_window_is_how_long_a_batch_id_is_remembered(make_server, sockets):
    srv = make_server(api_dedup_window=0.2)
    producer = sockets(zmq.DEALER, srv.receive)
    resend = batches.batch(b"b1", [[b"a"]])
    assert ask(producer, resend) == [b"b1", b"1", b"", b"1"]
    assert ask(producer, resend) == [b"b1", b"1", b"", b"1"]
    assert srv.stats()["messages"] == 1, "within the window: the first outcome, nothing stored"

    def stored_again() -> bool:
        assert ask(producer, resend) == [b"b1", b"1", b"", b"1"]
        return srv.stats()["messages"] == 2

    assert wait_until(stored_again, timeout_s=5, interval_s=0.1), "past --api-dedup-window: stored again"


def test_the_unstored_rest_of_a_batch_sent_again_lands_behind_a_batch_stored_meanwhile(make_server, sockets):
    srv = make_server(max_store_size=1 << 20)
    producer = sockets(zmq.DEALER, srv.receive)
    a = [[b"a%d" % i + b"x" * 100_000] for i in range(12)]
    answer = ask(producer, batches.batch(b"A", a))
    assert answer[:4] == [b"A", b"0", b"", native.QUEUE_FULL.encode()]
    stored = int(answer[4])
    assert 0 < stored < 12
    drain = consumer(sockets, srv, credit=stored)  # (room is made: what was stored is consumed)
    keys = delivered_keys(drain, stored)
    assert consume.parse_reply(ask(drain, consume.ack(keys))) == consume.Settled(stored, [])
    assert ask(producer, batches.batch(b"B", [[b"b"]])) == [b"B", b"1", b"", b"1"]  # (sent meanwhile)
    assert ask(producer, batches.batch(b"A-rest", [a[stored]])) == [b"A-rest", b"1", b"", b"1"]
    drain.send_multipart(consume.credit(2))
    got: list[list[bytes]] = []
    while len(got) < 2:
        got += consume.parse_reply(recv(drain)).bodies
    assert got == [[b"b"], a[stored]], "the queue's order is the order batches were stored in"
