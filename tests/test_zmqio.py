"""The thin receive/send wrappers on real sockets, byte for byte: frames in order, Again when nothing
waits, the peer's address as libzmq reports it, oversized messages drained, big frames left in
libzmq's buffer."""

from __future__ import annotations

import gc

import pytest
import zmq

from pzq import zmqio
from pzq.zmqio import (
    NOBLOCK,
    POLLIN,
    POLLOUT,
    Again,
    events,
    recv_frames,
    recv_frames_fd,
    recv_frames_from,
    recv_frames_user,
    send_frames,
)

from conftest import free_tcp_endpoint

EVERY_BYTE = bytes(range(256))


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


def test_every_byte_value_empty_frames_and_a_mebibyte_frame_cross_unchanged(pair):
    server, client = pair
    sent = [EVERY_BYTE, b"", b"\x00", EVERY_BYTE * 4096, b""]
    send_frames(client, sent)
    assert server.poll(2000)
    frames = recv_frames(server, NOBLOCK)
    assert frames[1:] == sent and all(type(f) is bytes for f in frames)


def test_any_buffer_is_sent_as_its_bytes(pair):
    server, client = pair
    send_frames(client, [bytearray(b"ab"), memoryview(EVERY_BYTE)[10:20], b"c"])
    assert server.poll(2000)
    assert recv_frames(server, NOBLOCK)[1:] == [b"ab", EVERY_BYTE[10:20], b"c"]


def test_a_message_of_no_frames_is_refused_before_anything_is_sent(pair):
    server, client = pair
    with pytest.raises(IndexError):
        send_frames(client, [])
    send_frames(client, [b"first"])
    assert server.poll(2000) and recv_frames(server, NOBLOCK)[1:] == [b"first"]


def test_receiving_when_nothing_waits_raises_again_and_events_say_so(pair):
    server, client = pair
    with pytest.raises(Again):
        recv_frames(server, NOBLOCK)
    assert not events(server) & POLLIN and events(client) & POLLOUT


def test_a_closed_socket_raises_zmq_error_not_a_crash(sockets):
    sock = sockets(zmq.DEALER, None)
    sock.close()
    with pytest.raises(zmq.ZMQError):
        recv_frames(sock, NOBLOCK)
    with pytest.raises(zmq.ZMQError):
        send_frames(sock, [b"x"], NOBLOCK)


def test_a_tcp_peer_is_reported_with_its_address_and_connection(sockets):
    endpoint, _ = free_tcp_endpoint()
    server = sockets(zmq.ROUTER, None)
    server.bind(endpoint)
    client = sockets(zmq.DEALER, endpoint)
    send_frames(client, [b"hello"])
    send_frames(client, [b"again"])
    send_frames(client, [b"third"])
    send_frames(client, [b"small", b"z" * 2000])
    assert server.poll(2000)
    frames, address = recv_frames_from(server, NOBLOCK)
    assert frames[1:] == [b"hello"] and address == "127.0.0.1"
    assert server.poll(2000)
    frames, key, fd = recv_frames_fd(server, NOBLOCK)
    assert frames[1:] == [b"again"] and key is None and fd >= 0
    assert server.poll(2000)
    with pytest.raises(zmq.ZMQError):  # (no User-Id without CURVE: pyzmq's Frame.get raises)
        recv_frames_user(server, NOBLOCK)
    zmqio.keep_big_frames(server, 1000)  # (the properties of a last frame kept in libzmq's buffer)
    assert server.poll(2000)
    frames, address = recv_frames_from(server, NOBLOCK)
    assert frames[1] == b"small" and bytes(frames[2]) == b"z" * 2000 and address == "127.0.0.1"


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


def test_on_a_socket_that_answers_them_a_message_past_the_frame_cap_is_received_as_its_head_once_drained(pair):
    server, client = pair
    handed: list[int] = []

    def head(frames: list) -> list:
        handed.append(len(frames))
        return [frames[0], b"cut:" + frames[1]]

    zmqio.answer_cut(server, head)
    send_frames(client, [b"ok", *[b"x"] * (zmqio.MAX_FRAMES - 2)])  # (1,024 with the routing frame: whole)
    send_frames(client, [b"id", *[b""] * (zmqio.DRAIN_PER_CALL + zmqio.MAX_FRAMES)])  # (two calls' drain)
    send_frames(client, [b"after"])
    assert server.poll(2000)
    assert len(recv_frames(server, NOBLOCK)) == zmqio.MAX_FRAMES
    cut = _next(server)
    assert cut[1] == b"cut:id" and handed == [zmqio.MAX_FRAMES], "the frames up to the cap, and none kept past it"
    assert _next(server)[1:] == [b"after"] and not zmqio.draining()


@pytest.mark.parametrize("answered", [False, True], ids=["dropped", "answered"])
def test_a_message_whose_frames_past_the_cap_are_exactly_a_drains_share_leaves_the_next_one_whole(pair, answered):
    server, client = pair
    if answered:
        zmqio.answer_cut(server, lambda frames: frames[:2])
    # (the cap's frames, then DRAIN_PER_CALL more: the drain's first call reads the message's last frame)
    send_frames(client, [b"id", *[b""] * (zmqio.MAX_FRAMES + zmqio.DRAIN_PER_CALL - 2)])
    send_frames(client, [b"after"])
    assert server.poll(2000)
    if answered:
        assert _next(server)[1] == b"id"
    assert _next(server)[1:] == [b"after"] and not zmqio.draining()


def test_big_frames_stay_in_libzmqs_buffer_on_that_socket_only_and_are_forgotten_with_it(sockets, tmp_path):
    endpoint = f"ipc://{tmp_path}/big"
    server = zmq.Context.instance().socket(zmq.ROUTER)  # (not the fixture's: it would keep it alive)
    server.linger = 0
    server.bind(endpoint)
    client = sockets(zmq.DEALER, endpoint)
    zmqio.keep_big_frames(server, 1000)
    send_frames(client, [b"x" * 999, EVERY_BYTE * 4])
    send_frames(client, [b"y" * 1000, b"tail"])  # (a big frame before the last one)
    assert server.poll(2000)
    frames = recv_frames(server, NOBLOCK)
    assert type(frames[1]) is bytes and type(frames[2]) is not bytes and bytes(frames[2]) == EVERY_BYTE * 4
    assert server.poll(2000)
    kept = recv_frames(server, NOBLOCK)
    assert type(kept[1]) is not bytes and bytes(kept[1]) == b"y" * 1000 and kept[2:] == [b"tail"]
    send_frames(server, [frames[0], frames[2]])  # (a kept frame sent on as it is)
    assert client.poll(2000) and recv_frames(client) == [EVERY_BYTE * 4]  # (another socket: copied out)
    key = id(server)
    server.close()
    del server, frames, kept
    gc.collect()
    assert key not in zmqio._big_frames
