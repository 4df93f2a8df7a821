"""API PRODUCEs past a turn (issue 39) on a real server: one big message is written a part per turn and
answered once its key and record are durable (a resend is answered from its key), the client's next
requests are answered after it; several messages past a turn's bytes are refused before anything is
done, and pzq's client cuts its messages into PRODUCEs by bytes so that its users never see that."""

from __future__ import annotations

import dataclasses
import os

import msgpack
import pytest
import zmq

from pzq.clients.api import ApiClient, ApiError, produce_pieces
from pzq.config import DEFAULT_LIMITS
from pzq.protocols import api as wire

from conftest import recv

pytestmark = pytest.mark.timeout(60)
KIB = 1 << 10
SMALL_PARTS = dataclasses.replace(DEFAULT_LIMITS, body_chunk_bytes=64 * KIB, turn_write_bytes=128 * KIB)


def _snapshot(api: ApiClient, queue: str) -> list[bytes]:
    """Every stored body of ``queue``, page after page."""
    bodies, after = [], 0
    while after < 1 << 40:
        messages, after = api.snapshot(queue, after, 1 << 40)
        bodies += [m[4] for m in messages]
    return bodies


def test_a_big_produce_is_stored_in_parts_answered_once_durable_and_a_resend_of_it_is_a_duplicate(
    make_server, tmp_path
):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=SMALL_PARTS)
    body, other = os.urandom(1 << 20), os.urandom(1 << 20)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        assert api.produce([("big", body)], key="k") == {"count": 1, "duplicate": False}
        assert api.produce([("big", body)], key="k") == {"count": 1, "duplicate": True}
        assert _snapshot(api, "big") == [body], "stored once, to the byte"
        assert api.produce([("big", other)], key="k") == {"count": 1, "duplicate": False}, "other bytes: stored"
        assert _snapshot(api, "big") == [body, other]
    figures = srv.stats()["api"]
    assert figures["big_stored_total"] == 3 and figures["duplicates_dropped"] == 1 and figures["big_held_bytes"] == 0


def test_what_a_client_asks_after_a_big_produce_is_answered_after_it(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=SMALL_PARTS)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(srv.config.api_dsn)
    try:
        sock.send_multipart(wire.request(b"1", "PRODUCE", {"messages": [["q", os.urandom(1 << 20)]]}))
        sock.send_multipart(wire.request(b"2", "INFO", {"queue": "q"}))
        first, second = wire.parse_reply(recv(sock)), wire.parse_reply(recv(sock))
        assert first is not None and first[:2] == (b"1", True)
        assert second is not None and second[:2] == (b"2", True) and second[2]["depth"] == 1
    finally:
        sock.close(0)


def test_a_big_produce_the_store_has_no_room_for_is_refused_and_leaves_nothing(make_server, tmp_path):
    srv = make_server(
        api_dsn=f"ipc://{tmp_path}/api",
        limits=SMALL_PARTS,
        max_store_size=1 << 20,
        hard_sync=False,
        max_message_size=4 << 20,  # (a message past the store's room, not past the size limit)
    )
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        with pytest.raises(ApiError, match="queue-full"):
            api.produce([("q", os.urandom(2 << 20))], key="big")
        assert api.produce([("q", b"small")], key="big") == {"count": 1, "duplicate": False}, "its key was not kept"
        assert _snapshot(api, "q") == [b"small"]


def test_several_messages_past_a_turns_bytes_are_refused_before_anything_is_done_and_the_client_cuts_them(
    make_server, tmp_path
):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    messages = [("q", os.urandom(11 * KIB)) for _ in range(300)]  # (3.3 MiB)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(srv.config.api_dsn)
    try:
        sock.send_multipart(wire.request(b"1", "PRODUCE", {"messages": [list(m) for m in messages], "key": "k"}))
        reply = wire.parse_reply(recv(sock))
        assert reply is not None and not reply[1] and reply[2]["code"] == "too-large"
    finally:
        sock.close(0)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        assert api.info("q")["depth"] == 0
        assert api.produce(messages, key="k") == {"count": 300, "duplicate": False}
        assert api.produce(messages, key="k") == {"count": 300, "duplicate": True}, "a resend stores nothing"
        assert _snapshot(api, "q") == [body for _, body in messages], "in order"


def test_the_client_cuts_messages_into_produces_the_server_takes_always_the_same_way():
    messages = [("q", b"x" * 700 * KIB), ("q", b"y" * (5 << 20)), *[("é" * 200, b"z" * 10)] * 3000]
    pieces = produce_pieces(messages)
    assert [m for piece in pieces for m in piece] == messages and pieces == produce_pieces(messages)
    assert pieces[1] == [messages[1]], "a big message goes alone"
    for piece in pieces:
        size = len(msgpack.packb({"messages": [list(m) for m in piece], "key": "k" * wire.MAX_KEY}))
        assert len(piece) <= wire.MAX_PRODUCE and (len(piece) == 1 or size <= wire.MAX_PRODUCE_BYTES)
