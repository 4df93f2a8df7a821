"""The thin receive/send wrappers on real sockets, both implementations (pure Python and, when built,
the compiled pzq._zmqfast) byte for byte: frames in order, Again when nothing waits, the peer's address
as libzmq reports it, oversized messages drained, big frames left in libzmq's buffer."""

from __future__ import annotations

import gc
import glob
import os
import subprocess
import sys

import pytest
import zmq

from pzq import zmqio
from pzq.zmqio import NOBLOCK, POLLIN, POLLOUT, Again, events

from conftest import free_tcp_endpoint

IMPLEMENTATIONS = [
    pytest.param(zmqio.PURE, id="pure"),
    pytest.param(
        zmqio.COMPILED,
        id="compiled",
        marks=pytest.mark.skipif(zmqio.COMPILED is None, reason="pzq._zmqfast not built or PZQ_PURE_PYTHON=1"),
    ),
]
EVERY_BYTE = bytes(range(256))


@pytest.fixture(params=IMPLEMENTATIONS)
def io(request):
    return request.param


@pytest.fixture
def pair(sockets, tmp_path):
    endpoint = f"ipc://{tmp_path}/pair"
    server = sockets(zmq.ROUTER, None)
    server.bind(endpoint)
    return server, sockets(zmq.DEALER, endpoint)


def test_a_multipart_message_arrives_whole_and_in_order_with_the_routing_frame_first(pair, io):
    server, client = pair
    io.send_frames(client, [b"", b"one", b"", b"three"])
    assert server.poll(2000)
    frames = io.recv_frames(server, NOBLOCK)
    assert len(frames) == 5 and frames[1:] == [b"", b"one", b"", b"three"]
    io.send_frames(server, [frames[0], b"reply"])
    assert client.poll(2000) and io.recv_frames(client) == [b"reply"]


def test_every_byte_value_empty_frames_and_a_mebibyte_frame_cross_unchanged(pair, io):
    server, client = pair
    sent = [EVERY_BYTE, b"", b"\x00", EVERY_BYTE * 4096, b""]
    io.send_frames(client, sent)
    assert server.poll(2000)
    frames = io.recv_frames(server, NOBLOCK)
    assert frames[1:] == sent and all(type(f) is bytes for f in frames)


def test_any_buffer_is_sent_as_its_bytes(pair, io):
    server, client = pair
    io.send_frames(client, [bytearray(b"ab"), memoryview(EVERY_BYTE)[10:20], b"c"])
    assert server.poll(2000)
    assert io.recv_frames(server, NOBLOCK)[1:] == [b"ab", EVERY_BYTE[10:20], b"c"]


def test_a_message_of_no_frames_is_refused_before_anything_is_sent(pair, io):
    server, client = pair
    with pytest.raises(IndexError):
        io.send_frames(client, [])
    with pytest.raises(IndexError):
        io.send_many(client, [[b"first"], []])
    assert server.poll(2000) and io.recv_frames(server, NOBLOCK)[1:] == [b"first"]


def test_receiving_when_nothing_waits_raises_again_and_events_say_so(pair, io):
    server, client = pair
    with pytest.raises(Again):
        io.recv_frames(server, NOBLOCK)
    with pytest.raises(Again):
        io.recv_many(server, 10)
    assert not events(server) & POLLIN and events(client) & POLLOUT


def test_a_closed_socket_raises_zmq_error_not_a_crash(sockets, io):
    sock = sockets(zmq.DEALER, None)
    sock.close()
    with pytest.raises(zmq.ZMQError):
        io.recv_frames(sock, NOBLOCK)
    with pytest.raises(zmq.ZMQError):
        io.send_frames(sock, [b"x"], NOBLOCK)


def test_a_tcp_peer_is_reported_with_its_address_and_connection(sockets, io):
    endpoint, _ = free_tcp_endpoint()
    server = sockets(zmq.ROUTER, None)
    server.bind(endpoint)
    client = sockets(zmq.DEALER, endpoint)
    io.send_frames(client, [b"hello"])
    io.send_frames(client, [b"again"])
    io.send_frames(client, [b"third"])
    io.send_frames(client, [b"small", b"z" * 2000])
    assert server.poll(2000)
    frames, address = io.recv_frames_from(server, NOBLOCK)
    assert frames[1:] == [b"hello"] and address == "127.0.0.1"
    assert server.poll(2000)
    frames, key, fd = io.recv_frames_fd(server, NOBLOCK)
    assert frames[1:] == [b"again"] and key is None and fd >= 0
    assert server.poll(2000)
    with pytest.raises(zmq.ZMQError):  # (no User-Id without CURVE: pyzmq's Frame.get raises, so do both)
        io.recv_frames_user(server, NOBLOCK)
    zmqio.keep_big_frames(server, 1000)  # (the properties of a last frame kept in libzmq's buffer)
    assert server.poll(2000)
    frames, address = io.recv_frames_from(server, NOBLOCK)
    assert frames[1] == b"small" and bytes(frames[2]) == b"z" * 2000 and address == "127.0.0.1"


def test_many_messages_are_read_in_order_up_to_a_count_and_a_size(sockets, io):
    server = sockets(zmq.ROUTER, None)
    server.bind("inproc://many")
    client = sockets(zmq.DEALER, "inproc://many")  # (inproc: what is sent waits in the pipe at once)
    assert io.send_many(client, [[b"%d" % i, EVERY_BYTE] for i in range(10)]) == 10
    first = io.recv_many(server, 3)
    assert [m[1:] for m in first] == [[b"%d" % i, EVERY_BYTE] for i in range(3)]
    sized = io.recv_many(server, 100, 600)  # (the third message's frames pass 600 bytes: it ends the run)
    assert [m[1] for m in sized] == [b"3", b"4", b"5"]
    rest = io.recv_many(server, 100)
    assert [m[1] for m in rest] == [b"%d" % i for i in range(6, 10)]


def test_sending_many_to_a_full_pipe_stops_and_says_how_many_left(sockets, tmp_path, io):
    endpoint = f"ipc://{tmp_path}/full"
    server = sockets(zmq.ROUTER, None)
    server.bind(endpoint)
    client = sockets(zmq.DEALER, None)
    client.setsockopt(zmq.SNDHWM, 5)
    client.connect(endpoint)  # (a peer that reads nothing: the pipe fills)
    sent = 0
    for _ in range(1000):
        took = io.send_many(client, [[b"x" * 1000, b"%d" % i] for i in range(50)], NOBLOCK)
        sent += took
        if took < 50:
            break
    else:
        raise AssertionError("the pipe never filled")
    got = []
    while server.poll(500):
        got += [m[2] for m in io.recv_many(server, 100)]
    assert got == [b"%d" % (i % 50) for i in range(sent)]


@pytest.mark.parametrize("many", [False, True])
def test_a_message_of_too_many_frames_is_dropped_and_the_next_one_arrives_whole(pair, io, many):
    server, client = pair
    io.send_frames(client, [b""] * (zmqio.MAX_FRAMES + 5))
    io.send_frames(client, [b"after"])
    assert server.poll(2000)
    with pytest.raises(Again):
        io.recv_many(server, 10) if many else io.recv_frames(server, NOBLOCK)
    assert _next(server, io)[1:] == [b"after"] and not zmqio.draining()


def test_a_run_ends_before_an_oversized_message_which_the_next_call_drains(pair, io):
    server, client = pair
    io.send_frames(client, [b"before"])
    io.send_frames(client, [b""] * (zmqio.MAX_FRAMES + 5))
    io.send_frames(client, [b"after"])
    assert server.poll(2000)
    assert [m[1:] for m in io.recv_many(server, 10)] == [[b"before"]]
    assert _next(server, io)[1:] == [b"after"] and not zmqio.draining()


def _next(server: zmq.Socket, io) -> list:
    """The next whole message, through as many Again as an oversized one before it takes to drain."""
    for _ in range(100):
        try:
            return io.recv_frames(server, NOBLOCK)
        except Again:
            assert server.poll(2000) or zmqio.draining()
    raise AssertionError("no message after 100 tries")


def test_big_frames_stay_in_libzmqs_buffer_on_that_socket_only_and_are_forgotten_with_it(sockets, tmp_path, io):
    endpoint = f"ipc://{tmp_path}/big"
    server = zmq.Context.instance().socket(zmq.ROUTER)  # (not the fixture's: it would keep it alive)
    server.linger = 0
    server.bind(endpoint)
    client = sockets(zmq.DEALER, endpoint)
    zmqio.keep_big_frames(server, 1000)
    io.send_frames(client, [b"x" * 999, EVERY_BYTE * 4])
    io.send_frames(client, [b"y" * 1000, b"tail"])  # (a big frame before the last one)
    assert server.poll(2000)
    frames = io.recv_frames(server, NOBLOCK)
    assert type(frames[1]) is bytes and type(frames[2]) is not bytes and bytes(frames[2]) == EVERY_BYTE * 4
    assert server.poll(2000)
    (kept,) = io.recv_many(server, 10)
    assert type(kept[1]) is not bytes and bytes(kept[1]) == b"y" * 1000 and kept[2:] == [b"tail"]
    io.send_frames(server, [frames[0], frames[2]])  # (a kept frame sent on as it is)
    assert client.poll(2000) and io.recv_frames(client) == [EVERY_BYTE * 4]  # (another socket: copied out)
    key = id(server)
    server.close()
    del server, frames, kept
    gc.collect()
    assert key not in zmqio._big_frames


def test_a_built_compiled_module_is_the_one_that_runs_unless_the_pure_one_is_forced():
    built = glob.glob(os.path.join(os.path.dirname(zmqio.__file__), "_zmqfast*.so"))
    if os.environ.get("PZQ_PURE_PYTHON") == "1" or not built:
        assert zmqio.IMPLEMENTATION == "pure" and zmqio.COMPILED is None
    else:  # (a build that no longer loads would otherwise fall back unseen)
        assert zmqio.IMPLEMENTATION == "compiled" and zmqio.recv_frames is zmqio.COMPILED.recv_frames
    forced = subprocess.run(
        [sys.executable, "-c", "from pzq import zmqio; print(zmqio.IMPLEMENTATION, zmqio.COMPILED)"],
        env={**os.environ, "PZQ_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert forced.stdout.split() == ["pure", "None"]
