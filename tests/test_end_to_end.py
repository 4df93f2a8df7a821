"""A real server (in a thread) with real ZeroMQ producers, consumers and monitors on ipc endpoints."""

from __future__ import annotations

import time

import pytest
import zmq

from pzq.clients import native as client
from pzq.protocols.monitor import PZQ_FIELDS
from pzq.protocols.native import QUEUE_FULL

from conftest import recv, wait_connected, wait_until


def produce(sockets, server, *bodies: list[bytes]) -> list[list[bytes]]:
    d = sockets(zmq.DEALER, server.receive)
    for i, body in enumerate(bodies):
        d.send_multipart([b"m%d" % i, b"", *body])
    return [recv(d) for _ in bodies]


def delivered_before_marker(sockets, server, c: zmq.Socket) -> list[bytes]:
    """The bodies delivered to ``c`` (the only consumer) before a marker message produced now, which
    is then acked: "nothing more arrives" without a fixed wait. The server's DEALER sends to one
    consumer through one ordered pipe, so whatever it meant to deliver before comes first."""
    produce(sockets, server, [b"marker"])
    bodies = []
    while True:
        peer, key, *frames = recv(c)
        if frames[-1] == b"marker":
            c.send_multipart([peer, key, b"1"])
            return bodies
        bodies.append(frames[-1])


def consumer(sockets, server) -> zmq.Socket:
    """A ROUTER consumer that connects and never speaks first, as PZQ consumers do."""
    c = sockets(zmq.ROUTER, None)
    return wait_connected(c, server.send)


def test_a_produced_message_reaches_a_waiting_router_consumer_with_pzq_frames(server, sockets):
    c = consumer(sockets, server)
    acks = produce(sockets, server, [b"hello", b"", b"\x00world"])
    assert acks == [[b"m0", b"1", b""]]
    peer, key, sent, timeout, delimiter, *body = recv(c)
    assert body == [b"hello", b"", b"\x00world"]
    assert delimiter == b""
    assert int(timeout) == server.config.ack_timeout * 1_000_000  # seconds in the config, µs on the wire
    assert abs(int(sent) / 1e6 - time.time()) < 5


def test_an_acked_message_is_deleted_and_never_delivered_again(make_server, sockets):
    server = make_server(ack_timeout=0.2)
    c = consumer(sockets, server)
    produce(sockets, server, [b"once"])
    peer, key, *_ = recv(c)
    redelivery_due = time.monotonic() + 0.2  # (the server sent it before we got it: its deadline is earlier)
    c.send_multipart([peer, key, b"1"])
    wait_until(lambda: server.stats()["messages"] == 0)
    assert c.poll(max(0, int((redelivery_due - time.monotonic()) * 1000))) == 0  # the ack timeout passes
    assert delivered_before_marker(sockets, server, c) == [], "the acked message came again"


def test_a_nacked_message_comes_back_at_once_with_the_same_key(server, sockets):
    c = consumer(sockets, server)
    produce(sockets, server, [b"again"])
    peer, key, *_ = recv(c)
    c.send_multipart([peer, key, b"0"])
    started = time.monotonic()
    peer2, key2, *rest = recv(c)
    assert key2 == key and rest[-1] == b"again"
    assert time.monotonic() - started < 0.5
    assert server.stats()["nacked_total"] == 1


def test_an_unacked_message_is_redelivered_after_the_ack_timeout_and_counted_as_expired(make_server, sockets):
    server = make_server(ack_timeout=0.2)
    c = consumer(sockets, server)
    produce(sockets, server, [b"slow"])
    first = recv(c)
    second = recv(c, 3000)
    assert second[1] == first[1]
    assert int(second[2]) - int(first[2]) >= 180_000
    assert server.stats()["expired_messages"] == 1
    assert server.stats()["redelivered_total"] == 1


def test_a_late_ack_for_a_redelivered_message_deletes_it(make_server, sockets):
    server = make_server(ack_timeout=0.2)
    c = consumer(sockets, server)
    produce(sockets, server, [b"late"])
    peer, key, *_ = recv(c)
    recv(c, 3000)  # delivered again after the timeout
    c.send_multipart([peer, key, b"1"])
    wait_until(lambda: server.stats()["messages"] == 0)
    assert server.stats()["messages_inflight"] == 0


def test_messages_are_delivered_fifo_also_after_a_redelivery(server, sockets):
    c = consumer(sockets, server)
    produce(sockets, server, *[[b"%d" % i] for i in range(5)])
    got = [recv(c) for _ in range(5)]
    assert [f[-1] for f in got] == [b"0", b"1", b"2", b"3", b"4"]
    # Nack the first two in reverse order: they come back oldest first, before anything newer.
    c.send_multipart([got[1][0], got[1][1], b"0"])
    c.send_multipart([got[0][0], got[0][1], b"0"])
    produce(sockets, server, [b"5"])
    again = [recv(c) for _ in range(3)]
    assert sorted(f[-1] for f in again[:2]) == [b"0", b"1"]
    assert again[2][-1] == b"5"


def test_consumers_share_the_queue_round_robin(make_server, sockets):
    server = make_server(ack_timeout=30.0)
    consumers = [consumer(sockets, server) for _ in range(2)]
    produce(sockets, server, *[[b"%d" % i] for i in range(10)])
    # The 10 are all the queue holds (and no redelivery within 30 s): once 10 came, nothing more can.
    counts = [0, 0]
    poller = zmq.Poller()
    for c in consumers:
        poller.register(c, zmq.POLLIN)
    while sum(counts) < 10:
        ready = dict(poller.poll(5000))
        assert ready, f"only {sum(counts)} of 10 delivered"
        for i, c in enumerate(consumers):
            if c in ready:
                c.recv_multipart()
                counts[i] += 1
    assert counts == [5, 5]
    assert server.stats()["messages_inflight"] == 10


def test_no_more_than_max_inflight_unacked_messages_are_pushed(make_server, sockets):
    server = make_server(max_inflight=3, ack_timeout=30.0)
    c = consumer(sockets, server)
    produce(sockets, server, *[[b"%d" % i] for i in range(10)])
    held = [recv(c) for _ in range(3)]
    # A monitor request is answered in the turn that reads it, before that turn's deliveries; the
    # second one is read in a later turn: its count includes whatever the first turn pushed.
    assert [server.stats()["messages_inflight"] for _ in range(2)] == [3, 3]
    c.send_multipart([held[0][0], held[0][1], b"1"])
    assert recv(c)[-1] == b"3"


def test_a_message_over_max_deliveries_goes_to_the_dead_letters_and_can_be_requeued(make_server, sockets):
    server = make_server(max_deliveries=2)
    c = consumer(sockets, server)
    produce(sockets, server, [b"poison"])
    for _ in range(2):
        peer, key, *_ = recv(c)
        c.send_multipart([peer, key, b"0"])
    stats = wait_until(lambda: (s := server.stats())["queues"]["default"]["dead_letters"] == 1 and s)
    assert stats["messages"] == 0
    assert delivered_before_marker(sockets, server, c) == [], "a third delivery passed --max-deliveries 2"
    letters = client.monitor_request(server.monitor, "DEADLETTERS default")
    assert '"reason":"max-deliveries"' in letters and '"deliveries":2' in letters
    assert '"requeued":1' in client.monitor_request(server.monitor, "REQUEUE default all")
    assert recv(c)[-1] == b"poison"


def test_a_full_store_refuses_with_queue_full_and_keeps_what_it_has(make_server, sockets):
    server = make_server(max_store_size=1 << 20)
    big = b"x" * 100_000
    acks = produce(sockets, server, *[[big] for _ in range(12)])
    refused = [a for a in acks if a[1] == b"0"]
    assert refused and all(a[3] == QUEUE_FULL.encode() for a in refused)
    stored = server.stats()["messages"]
    assert stored == 12 - len(refused) and stored >= 9
    c = consumer(sockets, server)
    peer, key, *rest = recv(c)
    assert rest[-1] == big
    c.send_multipart([peer, key, b"1"])
    wait_until(lambda: server.stats()["messages"] == stored - 1)
    assert produce(sockets, server, [big])[0][1] == b"1", "room was made, producing must work again"


def test_malformed_producer_messages_get_a_failure_ack_and_store_nothing(server, sockets):
    d = sockets(zmq.DEALER, server.receive)
    for frames in ([b"a", b"no delimiter"], [b"b", b""], [b"c"]):
        d.send_multipart(frames)
        ack = recv(d)
        assert ack[0] == frames[0] and ack[1] == b"0" and ack[2] == b"" and ack[3]
    assert server.stats()["messages"] == 0


def test_garbage_from_a_consumer_is_ignored_and_the_server_keeps_serving(server, sockets):
    c = consumer(sockets, server)
    produce(sockets, server, [b"still here"])
    peer, key, *_ = recv(c)
    c.send_multipart([peer, b"not-a-key", b"1"])
    c.send_multipart([peer, b"x" * 40 + b"|" + b"z" * 32, b"1"])
    c.send_multipart([peer, b"lonely"])
    c.send_multipart([peer, key, b"1"])
    wait_until(lambda: server.stats()["messages"] == 0)


def test_the_monitor_answers_every_request_even_unknown_ones(server):
    text = client.monitor_request(server.monitor, "MONITOR")
    first = text.splitlines()[:6]
    assert tuple(line.split(": ")[0] for line in first) == PZQ_FIELDS
    assert all(line.split(": ")[1].isdigit() for line in first), first
    assert int(first[2].split(": ")[1]) > 0, "db_size: the store's pages on disk"
    assert [first[0], first[1], first[3], first[5]] == [
        "messages: 0",
        "messages_inflight: 0",
        "inflight_db_size: 0",
        "expired_messages: 0",
    ]
    assert client.monitor_request(server.monitor, "HELLO").startswith("error: ")
    assert client.monitor_request(server.monitor, "DEADLETTERS").startswith("error: ")
    assert client.monitor_request(server.monitor, "REQUEUE default nope").startswith("error: ")
    assert "queue.default.depth: 0" in text


@pytest.mark.parametrize("request_frames", [[b"MONITOR"], [b"", b"MONITOR"]], ids=["bare", "with-delimiter"])
def test_a_dealer_monitor_client_gets_the_delimiter_and_the_text_as_from_the_original(server, sockets, request_frames):
    dealer = sockets(zmq.DEALER, server.monitor)
    dealer.send_multipart(request_frames)
    empty, text = recv(dealer)
    assert empty == b"" and text.startswith(b"messages: 0\n")


def test_the_ack_timeout_goes_on_the_wire_in_microseconds_whatever_unit_configured_it(process_server):
    server = process_server(ack_timeout="250ms")  # the flag with a unit; the config holds 0.25 s
    with client.Producer(server.receive, timeout_s=5) as producer:
        assert producer.produce([b"x"]).ok
    with client.Consumer(server.send) as consumer:
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None and delivery.ack_timeout_us == 250_000
        consumer.ack(delivery)
