"""The thin receive/send wrappers on real sockets: frames in order, Again when nothing waits, and the
peer's address as libzmq reports it."""

from __future__ import annotations

import pytest
import zmq

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
