"""No reply vanishes: a ROUTER's replies to a peer that reads slowly wait in a bounded backlog, and a
producer whose acks cannot leave is stored for no more (backpressure)."""

from __future__ import annotations

import time

import zmq

from pzq import logs
from pzq.clients import native as client
from pzq.endpoints.native import ACKS_UNREAD


def acks_then_marker(sock: zmq.Socket, count: int) -> list[list[bytes]]:
    """``count`` acks, then a marker message's: its ack comes after every ack sent before it (one ordered
    pipe), so none more was owed (a barrier, not a wait for a second of quiet). The marker is stored."""
    acks = []
    for _ in range(count):
        assert sock.poll(10_000), f"{len(acks)} of {count} acks came"
        acks.append(sock.recv_multipart())
    sock.send_multipart([b"marker", b"", b"marker"])
    assert sock.poll(10_000) and sock.recv_multipart()[:2] == [b"marker", b"1"], "no ack more than stored"
    return acks


def refused_unread() -> int:
    """Messages the server read and refused because their producer reads none of its acks (pzq.logs
    counts each kind of bad input, process-wide: the server runs in this process)."""
    return logs._counts[("producer", "not-reading")]


def read_all(server, sent: int, refused_before: int, stored_before: int) -> int:
    """The stored count once the server has read all ``sent`` messages (stored or refused): a count,
    not a pause, so that a loaded machine cannot make it look settled early."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stored = server.stats()["messages"]
        if stored - stored_before + refused_unread() - refused_before >= sent:
            return stored
        time.sleep(0.05)
    raise AssertionError(f"the server did not read the {sent} messages within 60 s")


def test_a_producer_that_pipelines_20000_without_reading_gets_an_ack_for_every_stored_message(server, sockets):
    producer = sockets(zmq.DEALER, server.receive)
    producer.sndhwm = 0  # let it push everything at once, as a careless client would
    refused = refused_unread()
    for i in range(20_000):
        producer.send_multipart([b"%d" % i, b"", b"body %d" % i])
    stored = read_all(server, 20_000, refused, 0)
    acks = acks_then_marker(producer, stored)
    assert all(a[1] == b"1" for a in acks)
    assert len(acks) == stored, f"{stored} stored but {len(acks)} acked: acks were dropped"
    assert len({a[0] for a in acks}) == len(acks)
    # (the server's pipe holds ACKS_UNREAD acks; what the producer's own pipe and the kernel hold on top
    # depends on how far its I/O thread got while it was sending, so more is not promised)
    assert stored >= ACKS_UNREAD, "a pipelining producer's window of acks fits in its pipe"


def test_a_producer_that_never_reads_its_acks_is_stored_for_no_more_while_others_are_served(server, sockets):
    deaf = sockets(zmq.DEALER, server.receive)
    deaf.sndhwm = 0
    refused = refused_unread()
    for i in range(40_000):
        deaf.send_multipart([b"%d" % i, b"", b"x"])
    read_all(server, 40_000, refused, 0)
    with client.Producer(server.receive, timeout_s=5) as honest:
        assert all(r.ok for r in honest.produce_many([[b"honest %d" % i] for i in range(1000)]))
    before, refused = server.stats()["messages"], refused_unread()
    for i in range(5000):
        deaf.send_multipart([b"more %d" % i, b"", b"x"])
    read_all(server, 5000, refused, before)
    with client.Producer(server.receive, timeout_s=5) as honest:
        assert honest.produce([b"still served"]).ok
    assert server.stats()["messages"] == before + 1, "nothing more was stored for the deaf producer"
    acks = acks_then_marker(deaf, before - 1000)  # (every message stored for it is acked once it reads)
    assert all(a[1] == b"1" for a in acks)


def test_a_backlog_its_peer_never_reads_is_dropped_after_a_while(sockets):
    from pzq.config import Limits
    from pzq.endpoints.replies import Replies

    router = sockets(zmq.ROUTER, None)
    router.sndhwm = 1
    router.bind("inproc://stale-replies")
    peer = sockets(zmq.DEALER, "inproc://stale-replies")
    peer.send(b"hello")
    identity = router.recv_multipart()[0]
    replies = Replies(router, "test", Limits(reply_stale_s=0.2))
    for i in range(5000):  # more than its pipe holds (inproc: our SNDHWM plus its RCVHWM)
        replies.send([identity, b"%d" % i])
    assert replies.blocked(identity), "a peer that does not read gets a backlog"
    deadline = time.monotonic() + 5
    while replies.blocked(identity) and time.monotonic() < deadline:
        replies.flush()
        time.sleep(0.05)
    assert not replies.blocked(identity) and replies.dropped_total > 0
    assert peer.poll(100)  # what fitted in its pipe is still there for it


def test_a_backlog_is_tried_again_within_a_millisecond_while_its_peer_reads_and_at_10_ms_while_it_does_not(sockets):
    from pzq.endpoints.replies import MOVING_RETRY_S, RETRY_S, Replies

    router = sockets(zmq.ROUTER, None)
    router.sndhwm = 1
    router.bind("inproc://moving-replies")
    peer = sockets(zmq.DEALER, None)
    peer.rcvhwm = 1
    peer.connect("inproc://moving-replies")
    peer.send(b"hello")
    identity = router.recv_multipart()[0]
    replies = Replies(router, "test")
    for i in range(50):
        replies.send([identity, b"%d" % i])
    assert replies.blocked(identity)
    replies.flush()  # (it read nothing: nothing moved)
    now = time.monotonic()
    assert replies.wake_at(now) == now + RETRY_S
    got = [peer.recv_multipart() for _ in range(2) if peer.poll(1000)]
    replies.flush()  # (what it read made room, and the flush saw it: no tick of libzmq's to wait for)
    assert replies.wake_at(now) == now + MOVING_RETRY_S
    while replies.blocked(identity):  # (every reply comes, in order, as it reads)
        assert peer.poll(1000)
        got.append(peer.recv_multipart())
        replies.flush()
    while peer.poll(100):
        got.append(peer.recv_multipart())
    assert got == [[b"%d" % i] for i in range(50)]
    assert replies.wake_at(now) is None
