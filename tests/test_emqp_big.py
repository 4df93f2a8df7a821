"""eMQP REQUESTs past a turn (issue 39), with raw pyzmq peers: a big payload is written a part per turn,
ACKed once all of it is stored, reaches its worker to the byte with its headers, and the client's
REQUESTs after it are ACKed and queued after it; past its share of what may wait behind a big one, a
client's next REQUEST is refused "busy" and goes through once sent again."""

from __future__ import annotations

import dataclasses

import pytest

from pzq.config import DEFAULT_LIMITS

from test_emqp import V, emqp, mid, next_command, request  # noqa: F401 - (emqp: a fixture, found by its name)

KIB = 1 << 10
SMALL_PARTS = dataclasses.replace(
    DEFAULT_LIMITS, body_chunk_bytes=64 * KIB, turn_write_bytes=128 * KIB, pipe_in_bytes=4 << 20
)


@pytest.fixture
def start(request):
    """test_emqp's ``emqp``: start(**config) -> (server, client(), worker(queues))."""
    return request.getfixturevalue("emqp")


def _text(size: int, tag: bytes) -> bytes:
    return tag + b"0123456789abcdef" * (size // 16)  # (eMQP peers read every frame as text)


def test_a_big_request_is_acked_once_stored_in_parts_and_the_requests_after_it_keep_their_order(start):
    srv, client_of, worker = start(limits=SMALL_PARTS)
    c = client_of()
    payload = _text((1 << 20) - 1024, b"big:")  # (under the default --max-message-size, 1M)
    big = request(c, headers=b"reply-requested", payload=payload)
    small = request(c, payload=b'"small"')
    assert next_command(c, b"ACK", 10_000)[4] == big
    assert next_command(c, b"ACK")[4] == small, "a REQUEST sent after a big one is acked after it"
    assert srv.stats()["emqp"]["big_stored_total"] == 1
    w = worker(ready=2)
    job = next_command(w, b"REQUEST")
    assert job[5] == b"reply-requested" and job[6] == payload, "the worker gets the payload to the byte"
    assert next_command(w, b"REQUEST")[6] == b'"small"'
    w.send_multipart([b"", V, b"REPLY", mid(), b'{"value": 1}', job[3]])
    assert next_command(c, b"REPLY")[-1] == big, "its meta (the client and msgid) came through its parts"


def test_a_client_past_its_share_of_requests_waiting_behind_a_big_one_is_refused_busy_and_may_resend(start):
    srv, client_of, _ = start(limits=SMALL_PARTS)  # (pipe_in_bytes 4 MiB: a quarter behind a client's big one)
    c = client_of()
    first = request(c, payload=_text(900 * KIB, b"1:"))
    second = request(c, payload=_text(900 * KIB, b"2:"))  # (waits behind the first)
    third_payload = _text(200 * KIB, b"3:")
    third = request(c, payload=third_payload)  # (past the quarter: refused at once)
    refused = next_command(c, b"REPLY", 10_000)
    assert refused[-1] == third and b"busy" in refused[-2]
    assert [next_command(c, b"ACK", 10_000)[4] for _ in range(2)] == [first, second]
    again = request(c, payload=third_payload)
    assert next_command(c, b"ACK", 10_000)[4] == again
    assert srv.stats()["queues"]["jobs"]["depth"] == 3


def test_a_big_payload_is_checked_as_utf8_a_part_at_a_time_and_one_that_is_not_is_dropped(start):
    srv, client_of, worker = start(limits=SMALL_PARTS)
    c = client_of()
    text = ("é€𝄞 " * (300 * KIB // 10)).encode()  # (characters cut across parts: still whole in the end)
    good = request(c, payload=text)
    bad = request(c, payload=text[:-2])  # (its last character cut short: the space, and a byte of 𝄞)
    after = request(c, payload=b'"after"')
    assert next_command(c, b"ACK", 10_000)[4] == good
    assert next_command(c, b"ACK", 10_000)[4] == after, "the bad one is dropped unanswered, as parse drops one"
    assert srv.stats()["queues"]["jobs"]["depth"] == 2 and bad
    w = worker(ready=2)
    assert [next_command(w, b"REQUEST")[6] for _ in range(2)] == [text, b'"after"']
