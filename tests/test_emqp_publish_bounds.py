"""The eMQP PUB bounded in bytes, with real subscribers on loopback TCP: what libzmq holds of PUBLISHes is
charged to their publisher until it is gone, a subscriber that reads nothing is cut off, and one that
leaves takes nothing of pzq's memory with it."""

from __future__ import annotations

import time
import uuid

import pytest
import zmq

from pzq.config import Limits

from conftest import free_tcp_endpoint, wait_until

V = b"eMQP/1.0"
KIB = 1 << 10


def publish(client: zmq.Socket, topic: bytes, payload: bytes) -> None:
    client.send_multipart([b"", V, b"PUBLISH", str(uuid.uuid4()).encode(), topic, payload])


@pytest.fixture
def publishing(make_server, sockets):
    """start(limits) -> (server, a publishing client, subscriber(deaf)) on loopback TCP."""

    def start(limits: Limits):
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        pub, _ = free_tcp_endpoint()
        srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back, emqp_publish_dsn=pub, limits=limits)
        made.append(srv)
        client = sockets(zmq.DEALER, front)

        def subscriber(deaf: bool) -> zmq.Socket:
            """A SUB that has heard one PUBLISH (so its subscription is in place); a deaf one then reads
            nothing, and holds nothing itself: libzmq stops reading its connection at once."""
            sub = sockets(zmq.SUB, None)
            if deaf:
                sub.setsockopt(zmq.RCVHWM, 1)
                sub.setsockopt(zmq.RCVBUF, 4 * KIB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub)
            deadline = time.monotonic() + 5
            while not sub.poll(50):  # (a SUB learns of its subscription asynchronously: publish until heard)
                assert time.monotonic() < deadline, "no publication arrived"
                publish(client, b"hello", b"x")
            publish(client, b"hello", b"last")  # (a barrier: what it was sent before comes first, in order)
            while True:
                assert sub.poll(5000), "the last hello did not arrive"
                if sub.recv_multipart() == [b"hello", b"last"]:
                    return sub

        return srv, client, subscriber

    made: list = []
    yield start
    for srv in made:  # before its peers close (conftest's ``sockets``: libzmq 4.3 may abort otherwise)
        srv.stop()


def emqp_stats(srv) -> dict:
    return srv.stats()["emqp"]


def published(srv, n: int) -> dict:
    """The figures once ``n`` PUBLISHes more than the ``hello``s were handled (sent or refused)."""
    return wait_until(
        lambda: (s := emqp_stats(srv))["publish_total"] + s["publish_refused_total"] >= n and s, timeout_s=20
    )


def test_a_publisher_holds_at_most_its_share_of_what_a_deaf_subscriber_has_not_taken(publishing):
    share = 2 << 20
    srv, client, subscriber = publishing(Limits(delivery_share=share, stuck_reader_s=600))
    reader = subscriber(deaf=False)
    subscriber(deaf=True)
    before = published(srv, 0)
    done = before["publish_total"] + before["publish_refused_total"]
    for _ in range(80):
        publish(client, b"news", b"x" * (256 * KIB))  # 20 MiB: ten times its share
    stats = published(srv, done + 80)
    assert 0 < stats["publish_held_bytes"] <= share + 256 * KIB, "past its share and one message"
    # (what libzmq wrote into the deaf one's TCP stream is no longer held: up to tcp_wmem's 4 MiB, autotuned)
    assert stats["publish_refused_total"] >= 40, "what does not fit its share is dropped, and counted"
    assert srv.stats()["memory"]["deliveries_bytes"] >= stats["publish_held_bytes"], "counted in the memory bound"
    sent = stats["publish_total"] - before["publish_total"]
    got = 0
    while got < sent:  # (the hellos of the deaf one's start come first)
        assert reader.poll(5000), f"a reader gets every PUBLISH that was sent: {got} of {sent}"
        got += reader.recv_multipart()[0] == b"news"
    assert not reader.poll(0) and emqp_stats(srv)["publish_total"] == stats["publish_total"]


def test_what_a_departed_subscriber_held_is_freed_without_another_publish(publishing):
    srv, client, subscriber = publishing(Limits(stuck_reader_s=600))
    deaf = subscriber(deaf=True)
    done = published(srv, 0)["publish_total"]
    for _ in range(20):
        publish(client, b"news", b"x" * (256 * KIB))
    assert published(srv, done + 20)["publish_held_bytes"] > 1 << 20
    deaf.close(linger=0)
    wait_until(lambda: emqp_stats(srv)["publish_held_bytes"] == 0, timeout_s=3)
    assert srv.stats()["memory"]["deliveries_bytes"] == 0


def test_a_subscriber_that_reads_nothing_is_cut_off_and_what_it_held_is_freed(publishing):
    srv, client, subscriber = publishing(Limits(stuck_reader_s=0.5, stuck_check_s=0.1))
    reader = subscriber(deaf=False)
    subscriber(deaf=True)
    done = published(srv, 0)["publish_total"]
    for _ in range(16):
        publish(client, b"news", b"x" * (1 << 20))  # (past what the kernel buffers of its connection take)
    published(srv, done + 16)
    stats = wait_until(lambda: (s := emqp_stats(srv))["publish_subscribers_cut_total"] == 1 and s, timeout_s=10)
    wait_until(lambda: emqp_stats(srv)["publish_held_bytes"] == 0, timeout_s=3)
    publish(client, b"news", b"after")
    while True:  # (what it was sent before comes first)
        assert reader.poll(5000), "a reader is never cut off"
        if reader.recv_multipart() == [b"news", b"after"]:
            break
    assert stats["publish_subscribers_cut_total"] == 1


def test_a_subscriber_whose_pipe_is_full_is_counted_as_missing_publishes(publishing):
    srv, client, subscriber = publishing(Limits(stuck_reader_s=600))
    subscriber(deaf=True)
    done = published(srv, 0)["publish_total"]
    for _ in range(3000):  # 4 KiB each: past its pipe (1,000) and its connection's buffers, under the share
        publish(client, b"news", b"x" * (4 * KIB))
    stats = published(srv, done + 3000)
    assert stats["publish_missed_total"] >= 1
    assert stats["publish_refused_total"] == 0


def disconnected(sock: zmq.Socket, endpoint: str, timeout_s: float = 5.0) -> bool:
    """Connect ``sock`` and tell whether the server ends its connection within ``timeout_s``."""
    mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        sock.connect(endpoint)
        return bool(mon.poll(int(timeout_s * 1000)))
    finally:
        sock.disable_monitor()
        mon.close(linger=0)


def test_a_subscription_past_its_bound_cuts_its_subscriber_off_and_the_others_are_served_on(publishing, sockets):
    from pzq.endpoints.emqp_publish import SUBSCRIPTION_BYTES

    srv, client, subscriber = publishing(Limits())
    reader = subscriber(deaf=False)
    # (libzmq files a subscription in a trie at ~45 bytes of memory a byte, in the loop's thread: with no
    # bound on the frame, one of 500 MB grew the server past 13 GB)
    hostile = sockets(zmq.SUB, None)
    hostile.setsockopt(zmq.SUBSCRIBE, b"t" * (SUBSCRIPTION_BYTES + 1))
    assert disconnected(hostile, srv.config.emqp_publish_dsn), "a subscription past the bound is cut off"
    fitting = sockets(zmq.SUB, None)
    fitting.setsockopt(zmq.SUBSCRIBE, b"t" * SUBSCRIPTION_BYTES)
    assert not disconnected(fitting, srv.config.emqp_publish_dsn, timeout_s=0.5)
    publish(client, b"news", b"after")
    assert reader.poll(5000) and reader.recv_multipart() == [b"news", b"after"]
