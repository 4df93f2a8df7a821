"""The API codec by frame vectors: what a client sends, what the server answers."""

from __future__ import annotations

import msgpack
import pytest

from pzq.errors import ProtocolError
from pzq.protocols import api

ROUTING = b"\x00\x80\x00\x00\x01"


def test_a_request_is_routing_delimiter_id_command_and_msgpack_arguments():
    frames = [ROUTING, b"", b"7", b"LEASE", msgpack.packb({"queue": "q", "group": "g", "after": 0, "max": 10})]
    request = api.parse_request(frames)
    assert request == api.Request((ROUTING,), b"7", "LEASE", {"queue": "q", "group": "g", "after": 0, "max": 10})


def test_the_client_side_frames_parse_on_the_server_side():
    request = api.parse_request([ROUTING, *api.request(b"1", "INFO", {"queue": "q"})])
    assert request.command == "INFO" and request.args == {"queue": "q"}


def test_ok_and_error_replies_carry_the_request_id_back():
    request = api.Request((ROUTING,), b"42", "INFO", {"queue": "q"})
    reply = api.ok(request, {"depth": 3})
    assert reply == [ROUTING, b"", b"42", b"OK", b"\x81\xa5depth\x03"]
    assert api.parse_reply(reply[1:]) == (b"42", True, {"depth": 3})
    error = api.error(request, "bad-range", "no")
    assert api.parse_reply(error[1:]) == (b"42", False, {"code": "bad-range", "detail": "no"})
    assert api.parse_reply(api.as_error(reply, "store-failed", "x")[1:])[1] is False


@pytest.mark.parametrize(
    "frames",
    [
        [ROUTING, b"1", b"INFO"],  # no delimiter
        [b"", b"1", b"INFO", b"\x80"],  # no routing
        [ROUTING, b""],  # no request id
    ],
)
def test_a_request_that_cannot_be_answered_is_none(frames):
    assert api.parse_request(frames) is None


@pytest.mark.parametrize(
    "frames, code",
    [
        ([ROUTING, b"", b"1", b"INFO"], "bad-frames"),
        ([ROUTING, b"", b"1", b"DROP", b"\x80"], "unknown-command"),
        ([ROUTING, b"", b"1", b"INFO", b"\xc1"], "bad-arguments"),  # 0xc1 is never valid msgpack
        ([ROUTING, b"", b"1", b"INFO", msgpack.packb([1, 2])], "bad-arguments"),
        ([ROUTING, b"", b"1", b"INFO", msgpack.packb({})], "bad-arguments"),
        ([ROUTING, b"", b"1", b"INFO", msgpack.packb({"queue": 5})], "bad-arguments"),
        (
            [ROUTING, b"", b"1", b"LEASE", msgpack.packb({"queue": "q", "group": "g", "after": True, "max": 1})],
            "bad-arguments",
        ),
        (
            [ROUTING, b"", b"1", b"LEASE", msgpack.packb({"queue": "q", "group": "g", "after": "0", "max": 1})],
            "bad-arguments",
        ),
        (
            [
                ROUTING,
                b"",
                b"1",
                b"SNAPSHOT",
                msgpack.packb({"queue": "q", "after": 2**64 - 1, "before": 1, "limit": 1}),
            ],
            "bad-arguments",
        ),
        (
            [ROUTING, b"", b"1", b"FETCH", msgpack.packb({"queue": "q", "group": "g", "lo": -1, "hi": 1})],
            "bad-arguments",
        ),
        ([ROUTING, b"", b"1", b"OFFSETS", msgpack.packb({"queue": "q", "group": "g" * 256})], "bad-arguments"),
        ([ROUTING, b"", b"1", b"INFO", msgpack.packb({"queue": ""})], "bad-arguments"),
        ([ROUTING, b"", b"1", b"PRODUCE", msgpack.packb({"messages": [], "key": "k" * 257})], "bad-arguments"),
    ],
)
def test_a_wrong_request_is_rejected_with_a_code_and_still_answered(frames, code):
    rejected = api.parse_request(frames)
    assert isinstance(rejected, api.Rejected)
    assert rejected.error.code == code
    assert rejected.request.request_id == b"1"


def test_produce_messages_must_be_queue_and_binary_body_pairs():
    assert api.produce_messages({"messages": [["q", b"x"]]}) == [("q", b"x")]
    for bad in ([["q", "text"]], [[b"q", b"x"]], [["q"]], ["q"], [["", b"x"]], [["q" * 256, b"x"]]):
        with pytest.raises(ProtocolError):
            api.produce_messages({"messages": bad})


def test_unknown_argument_names_are_dropped():
    request = api.parse_request([ROUTING, *api.request(b"1", "INFO", {"queue": "q", "evil": "x"})])
    assert request.args == {"queue": "q"}


@pytest.mark.parametrize(
    "frames",
    [[b"x"], [b"", b"1", b"MAYBE", b"\x80"], [b"", b"1", b"OK", b"\xc1"], [b"", b"1", b"OK", msgpack.packb([1])]],
)
def test_a_client_ignores_what_is_not_a_reply(frames):
    assert api.parse_reply(frames) is None


def test_a_produce_of_more_than_max_produce_messages_is_refused_before_any_work():
    with pytest.raises(ProtocolError, match="too-many"):
        api.produce_messages({"messages": [["q", b"x"]] * (api.MAX_PRODUCE + 1)})
    assert len(api.produce_messages({"messages": [["q", b"x"]] * api.MAX_PRODUCE})) == api.MAX_PRODUCE
