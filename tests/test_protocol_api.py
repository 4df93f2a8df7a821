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


def _info_with(value: bytes) -> list[bytes]:
    """An INFO request whose map holds "queue": "q" and "x": ``value`` (raw msgpack bytes)."""
    return [
        ROUTING,
        b"",
        b"1",
        b"INFO",
        b"\x82" + msgpack.packb("queue") + msgpack.packb("q") + msgpack.packb("x") + value,
    ]


def test_a_produce_announcing_more_than_max_produce_messages_is_refused_from_its_header_alone():
    # The frame ends after the list's header: a refusal that needed any item would see truncated msgpack.
    header = b"\x81" + msgpack.packb("messages") + b"\xdd" + (1 << 20).to_bytes(4, "big")
    rejected = api.parse_request([ROUTING, b"", b"1", b"PRODUCE", header])
    assert isinstance(rejected, api.Rejected) and rejected.error.code == "too-many"
    assert "1048576" in rejected.error.detail


def test_a_list_where_a_value_belongs_is_refused_from_its_header_alone():
    # 15 Mi nils announced, none sent: the decoder refuses at the header instead of building the list.
    rejected = api.parse_request(_info_with(b"\xdd" + (15 << 20).to_bytes(4, "big")))
    assert isinstance(rejected, api.Rejected) and rejected.error.code == "bad-arguments"
    assert "max_array_len" in rejected.error.detail


def test_a_map_where_a_value_belongs_is_refused_from_its_header_alone():
    rejected = api.parse_request(_info_with(b"\xdf" + (1 << 24).to_bytes(4, "big")))
    assert isinstance(rejected, api.Rejected) and "max_map_len" in rejected.error.detail


def test_a_map_of_more_than_max_arguments_entries_is_refused_from_its_header_alone():
    rejected = api.parse_request([ROUTING, b"", b"1", b"INFO", b"\xdf\xff\xff\xff\xff"])
    assert isinstance(rejected, api.Rejected) and rejected.error.code == "bad-arguments"
    assert f"at most {api.MAX_ARGUMENTS}" in rejected.error.detail


def test_a_message_that_is_not_a_pair_is_refused_before_the_next_is_read():
    frame = b"\x81" + msgpack.packb("messages") + b"\x92" + b"\x93\xa1q\xc4\x01x\xc0"  # a triple, then nothing
    rejected = api.parse_request([ROUTING, b"", b"1", b"PRODUCE", frame])
    assert isinstance(rejected, api.Rejected) and "each message must be" in rejected.error.detail


def test_a_repeated_argument_name_is_refused():
    # Else 16 "messages" of 5,000 each would decode 80,000 messages past MAX_PRODUCE.
    one = msgpack.packb("messages") + msgpack.packb([["q", b"x"]])
    rejected = api.parse_request([ROUTING, b"", b"1", b"PRODUCE", b"\x82" + one + one])
    assert isinstance(rejected, api.Rejected) and "distinct" in rejected.error.detail


def test_bytes_after_the_arguments_map_are_refused():
    rejected = api.parse_request([ROUTING, b"", b"1", b"INFO", msgpack.packb({"queue": "q"}) + b"\xc0"])
    assert isinstance(rejected, api.Rejected) and "after the arguments" in rejected.error.detail


def test_a_produce_of_max_produce_messages_with_a_key_still_parses():
    messages = [["q", b"x" * 10]] * api.MAX_PRODUCE
    request = api.parse_request([ROUTING, *api.request(b"1", "PRODUCE", {"messages": messages, "key": "k1"})])
    assert isinstance(request, api.Request) and request.args == {"messages": messages, "key": "k1"}


def _produce(args: dict | bytes, **limits: int):
    body = args if isinstance(args, bytes) else msgpack.packb(args, use_bin_type=True)
    return api.parse_request([b"peer", b"", b"1", b"PRODUCE", body], **limits)


def test_a_big_body_in_a_produce_reads_back_to_the_byte_with_what_follows_it():
    big = bytes(range(256)) * 300  # (a bin 32: taken from the frame in one copy)
    parsed = _produce({"messages": [["q", big]], "key": "after the body"})
    assert isinstance(parsed, api.Request)
    assert parsed.args == {"messages": [["q", big]], "key": "after the body"}


@pytest.mark.parametrize("cut", [1, 3, 100])
def test_a_big_body_cut_short_or_past_the_limit_is_refused(cut):
    frame = msgpack.packb({"messages": [["q", b"x" * 70_000]]}, use_bin_type=True)
    parsed = _produce(frame[:-cut])
    assert isinstance(parsed, api.Rejected) and parsed.error.code == "bad-arguments"
    parsed = _produce(frame, max_size=69_999)
    assert isinstance(parsed, api.Rejected) and parsed.error.code == "bad-arguments"


def test_several_messages_past_the_produce_bytes_are_refused_from_the_header_and_one_alone_is_not():
    body = b"x" * 1000
    parsed = _produce({"messages": [["q", body], ["q", body]]}, max_produce_bytes=1500)
    assert isinstance(parsed, api.Rejected) and parsed.error.code == "too-large"
    assert isinstance(_produce({"messages": [["q", body * 2]]}, max_produce_bytes=1500), api.Request)
    assert isinstance(_produce({"messages": [["q", body], ["q", body]]}, max_produce_bytes=2100), api.Request)
