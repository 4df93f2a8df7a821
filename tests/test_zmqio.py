"""The thin receive/send wrappers on real sockets: frames in order, Again when nothing waits, and the
peer's address as libzmq reports it."""

from __future__ import annotations

import gc

import pytest
import zmq

from pzq import zmqio
from pzq.zmqio import NOBLOCK, POLLIN, POLLOUT, Again, events, recv_frames, recv_frames_from, send_frames

from conftest import free_tcp_endpoint


@pytest.fixture
def pair(sockets, tmp_path):
    endpoint = f"ipc://{tmp_path}/pair"
    server = sockets(zmq.ROUTER, None)
    server.bind(endpoint)
    return server, sockets(zmq.DEALER, endpoint)


def test_a_multipart_message_arrives_whole_and_in_order_with_the_routing_frame_first(pair):
    server, client = pair
    send_frames(client, [b"", b"one", b"", b"three"])
    assert server.poll(2000)
    frames = recv_frames(server, NOBLOCK)
    assert len(frames) == 5 and frames[1:] == [b"", b"one", b"", b"three"]
    send_frames(server, [frames[0], b"reply"])
    assert client.poll(2000) and recv_frames(client) == [b"reply"]


def test_receiving_when_nothing_waits_raises_again_and_events_say_so(pair):
    server, client = pair
    with pytest.raises(Again):
        recv_frames(server, NOBLOCK)
    assert not events(server) & POLLIN and events(client) & POLLOUT


def test_a_tcp_peer_is_reported_with_its_address(sockets):
    endpoint, _ = free_tcp_endpoint()
    server = sockets(zmq.ROUTER, None)
    server.bind(endpoint)
    client = sockets(zmq.DEALER, endpoint)
    send_frames(client, [b"hello"])
    assert server.poll(2000)
    frames, address = recv_frames_from(server, NOBLOCK)
    assert frames[1:] == [b"hello"] and address == "127.0.0.1"


def _next(server: zmq.Socket) -> list:
    """The next whole message, through as many Again as an oversized one before it takes to drain."""
    for _ in range(100):
        try:
            return recv_frames(server, NOBLOCK)
        except Again:
            assert server.poll(2000) or zmqio.draining()
    raise AssertionError("no message after 100 tries")


def test_a_message_of_too_many_frames_is_dropped_and_the_next_one_arrives_whole(pair):
    server, client = pair
    send_frames(client, [b""] * (zmqio.MAX_FRAMES + 5))
    send_frames(client, [b"after"])
    assert server.poll(2000)
    with pytest.raises(Again):
        recv_frames(server, NOBLOCK)
    assert _next(server)[1:] == [b"after"] and not zmqio.draining()


def test_big_frames_stay_in_libzmqs_buffer_on_that_socket_only_and_are_forgotten_with_it(sockets, tmp_path):
    endpoint = f"ipc://{tmp_path}/big"
    server = zmq.Context.instance().socket(zmq.ROUTER)  # (not the fixture's: it would keep it alive)
    server.linger = 0
    server.bind(endpoint)
    client = sockets(zmq.DEALER, endpoint)
    zmqio.keep_big_frames(server, 1000)
    send_frames(client, [b"x" * 999, b"y" * 1000])
    assert server.poll(2000)
    frames = recv_frames(server, NOBLOCK)
    assert type(frames[1]) is bytes and type(frames[2]) is not bytes and bytes(frames[2]) == b"y" * 1000
    send_frames(server, [frames[0], b"z" * 5000])
    assert client.poll(2000) and recv_frames(client) == [b"z" * 5000]  # (another socket: copied out)
    key = id(server)
    server.close()
    del server, frames
    gc.collect()
    assert key not in zmqio._big_frames
