"""The eMQP codec (shared/specs/emqp.md) as pure functions: every command of the spec's frame table as a
ROUTER receives it from eventmq, malformed frame lists, the frames pzq sends, headers and INFORM queues."""

from __future__ import annotations

import pytest

from pzq.errors import ProtocolError
from pzq.protocols import emqp

PEER = b"2b8f3c1e-6a4d-4f0b-9c1a-7e5d3b2a1f00"
MSGID = "0e1f7f0a-3b9c-4d2e-8f6a-5c4b3a291807"
REQID = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
HEAD = [PEER, b"", b"eMQP/1.0"]
NEW = "5b0f6c1e-2a3d-4e5f-8a9b-0c1d2e3f4a5b"  # the id a caller passes for the command it sends
JOB = (
    '["run", {"callable": "add", "path": "jobs.math", "args": [1, 2], "kwargs": {}, '
    '"class_args": [], "class_kwargs": {}}]'
)


def frames(name: str, *args: str) -> list[bytes]:
    """A command as a ROUTER receives it from an eventmq DEALER."""
    return [*HEAD, name.encode(), MSGID.encode(), *(a.encode() for a in args)]


# (command, args after the msgid) exactly as eventmq's client, worker and scheduler send them.
EVENTMQ_SENDS = [
    ("REQUEST", ["q1", "reply-requested,retry-count:3,timeout:10", JOB]),
    ("REPLY", ['{"value": 3}', REQID]),
    ("REPLY", ['{"value": 3}']),
    ("INFORM", ['[[10, "default"], [5, "q1"]]', "worker"]),
    ("INFORM", ["", "scheduler"]),
    ("READY", []),
    ("HEARTBEAT", ["1712345678.123456"]),
    ("DISCONNECT", []),
    ("KBYE", []),
    ("KBAI", []),
    ("ACK", [REQID]),
    ("SCHEDULE", ["q1", "nohaste,run_count:5", "60", JOB, ""]),
    ("SCHEDULE", ["q1", "", "-1", JOB, "*/5 * * * *"]),
    ("UNSCHEDULE", ["q1", "", "60", JOB, ""]),
    ("PUBLISH", ["news", '{"hello": "wörld"}']),
    ("PUBLISH", ["news", "reply-requested", '{"hello": "wörld"}']),
]


@pytest.mark.parametrize("name, args", EVENTMQ_SENDS, ids=[f"{n}-{len(a)}" for n, a in EVENTMQ_SENDS])
def test_every_command_eventmq_sends_parses_to_its_name_msgid_and_text_args(name, args):
    assert emqp.parse(frames(name, *args)) == emqp.Command(PEER, name, MSGID, args)


def test_the_ten_frame_schedule_keeps_queue_headers_interval_payload_and_cron_in_order():
    message = frames("SCHEDULE", "q1", "", "-1", JOB, "0 * * * *")
    assert len(message) == 10
    assert emqp.parse(message).args == ["q1", "", "-1", JOB, "0 * * * *"]


def parse_error(message: list[bytes]) -> str:
    with pytest.raises(ProtocolError) as caught:
        emqp.parse(message)
    return caught.value.code


@pytest.mark.parametrize("message", [[], [PEER], [PEER, b""], HEAD, [*HEAD, b"READY"]])
def test_fewer_than_five_frames_is_short(message):
    assert parse_error(message) == "short"


def test_a_non_empty_delimiter_frame_is_rejected():
    assert parse_error([PEER, b"x", b"eMQP/1.0", b"READY", MSGID.encode()]) == "bad-version"


@pytest.mark.parametrize("version", [b"eMQP/1.1", b"emqp/1.0", b"MDPC01", b""])
def test_any_other_version_is_rejected(version):
    assert parse_error([PEER, b"", version, b"READY", MSGID.encode()]) == "bad-version"


@pytest.mark.parametrize("name", [b"FETCH", b"ready", b"", b"\xff\xfe"])
def test_an_unknown_command_is_rejected(name):
    assert parse_error([*HEAD, name, MSGID.encode()]) == "unknown-command"


WRONG_ARITY = [
    ("REQUEST", 2),
    ("REQUEST", 4),
    ("REPLY", 0),
    ("REPLY", 3),
    ("INFORM", 0),
    ("INFORM", 3),
    ("READY", 1),
    ("HEARTBEAT", 2),
    ("DISCONNECT", 1),
    ("KBYE", 1),
    ("KBAI", 1),
    ("ACK", 0),
    ("ACK", 2),
    ("SCHEDULE", 2),
    ("SCHEDULE", 6),
    ("UNSCHEDULE", 2),
    ("UNSCHEDULE", 6),
    ("PUBLISH", 1),
    ("PUBLISH", 4),
]


@pytest.mark.parametrize("name, count", WRONG_ARITY, ids=[f"{n}-{c}" for n, c in WRONG_ARITY])
def test_a_wrong_number_of_frames_after_the_msgid_is_bad_arity(name, count):
    assert parse_error(frames(name, *["x"] * count)) == "bad-arity"


def test_a_heartbeat_without_timestamp_is_accepted():
    assert emqp.parse(frames("HEARTBEAT")).args == []


def test_a_non_utf8_msgid_is_rejected():
    assert parse_error([*HEAD, b"READY", b"\xff" + MSGID.encode()]) == "not-utf8"


@pytest.mark.parametrize("bad", [b"\xff", b"caf\xe9", b"\xed\xa0\x80", b"\xc3"])
def test_a_non_utf8_argument_is_rejected(bad):
    assert parse_error([*HEAD, b"REQUEST", MSGID.encode(), b"q1", b"", bad]) == "not-utf8"


def test_the_peer_identity_may_be_binary():
    assert emqp.parse([b"\x00\xff\x80", b"", b"eMQP/1.0", b"READY", MSGID.encode()]).peer == b"\x00\xff\x80"


def assert_sendable(message: list[bytes]) -> None:
    for frame in message:
        assert type(frame) is bytes
        frame.decode("utf-8")


def test_command_builds_the_header_the_given_msgid_and_utf8_args():
    first, second = emqp.command("PUBLISH", NEW, "news", b"raw"), emqp.command("PUBLISH", NEW, "news", "wörld")
    assert first == [b"", b"eMQP/1.0", b"PUBLISH", NEW.encode(), b"news", b"raw"]
    assert second[4:] == [b"news", "wörld".encode()]
    assert_sendable(first)
    assert_sendable(second)


def test_ack_carries_its_own_msgid_then_the_acked_msgid():
    message = emqp.ack(NEW, REQID)
    assert message == [b"", b"eMQP/1.0", b"ACK", NEW.encode(), REQID.encode()]
    assert_sendable(message)


def test_heartbeat_carries_the_given_time_as_text():
    message = emqp.heartbeat(NEW, 1712345678.25)
    assert message[:4] == [b"", b"eMQP/1.0", b"HEARTBEAT", NEW.encode()]
    assert float(message[4].decode()) == 1712345678.25
    assert_sendable(message)


def test_request_keeps_the_clients_msgid_and_frames():
    message = emqp.request(MSGID, "q1", "reply-requested", JOB)
    assert message == [b"", b"eMQP/1.0", b"REQUEST", MSGID.encode(), b"q1", b"reply-requested", JOB.encode()]
    assert_sendable(message)


def test_reply_puts_a_new_msgid_then_the_body_then_the_request_msgid():
    message = emqp.reply(NEW, '{"value": "ünïcode"}', REQID)
    assert message[:4] == [b"", b"eMQP/1.0", b"REPLY", NEW.encode()]
    assert message[4:] == ['{"value": "ünïcode"}'.encode(), REQID.encode()]
    assert_sendable(message)


def test_what_pzq_sends_parses_back_once_a_router_identity_is_prepended():
    command = emqp.parse([PEER, *emqp.reply(NEW, '{"value": 3}', REQID)])
    assert (command.name, command.args) == ("REPLY", ['{"value": 3}', REQID])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", {}),
        ("reply-requested,retry-count:3,timeout:10", {"reply-requested": "", "retry-count": "3", "timeout": "10"}),
        (" guarantee , ,nohaste,, run_count:2 ", {"guarantee": "", "nohaste": "", "run_count": "2"}),
        (",", {}),
    ],
)
def test_parse_headers_reads_comma_joined_names_and_values(text, expected):
    assert emqp.parse_headers(text) == expected


def test_header_int_is_zero_when_missing_or_empty():
    assert emqp.header_int({}, "timeout") == 0
    assert emqp.header_int({"timeout": ""}, "timeout") == 0


@pytest.mark.parametrize("value, expected", [("0", 0), ("3", 3), ("007", 7), ("999999999", 999999999)])
def test_header_int_reads_digits(value, expected):
    assert emqp.header_int({"retry-count": value}, "retry-count") == expected


@pytest.mark.parametrize("value", ["-1", "+5", " 5", "1.5", "abc", "3x", "1234567890", "9" * 400])
def test_header_int_rejects_non_digits_and_absurdly_long_numbers(value):
    with pytest.raises(ProtocolError) as caught:
        emqp.header_int({"timeout": value}, "timeout")
    assert caught.value.code == "bad-header"


def test_header_int_rejects_a_superscript_digit_with_a_protocol_error():
    with pytest.raises(ProtocolError):
        emqp.header_int({"timeout": "²"}, "timeout")


@pytest.mark.parametrize(
    "headers, expected",
    [
        ("", "reply-requested"),
        ("guarantee", "guarantee,reply-requested"),
        ("reply-requested", "reply-requested"),
        ("retry-count:3,reply-requested,timeout:10", "retry-count:3,reply-requested,timeout:10"),
    ],
)
def test_with_header_adds_a_header_once(headers, expected):
    assert emqp.with_header(headers, "reply-requested") == expected
    assert emqp.with_header(expected, "reply-requested") == expected


DEFAULT = ["default", "urgent"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[[10, "default"], [5, "q1"]]', [(10, "default"), (5, "q1")]),
        (
            '[[1, "low"], [30, "high"], [5, "mid"], [30, "high2"]]',
            [(30, "high"), (30, "high2"), (5, "mid"), (1, "low")],
        ),
        ("q1,q2", [(10, "q1"), (10, "q2")]),
        (" q1 , ,q2 ", [(10, "q1"), (10, "q2")]),
        ("", [(10, "default"), (10, "urgent")]),
        ("  ", [(10, "default"), (10, "urgent")]),
        (f'[[1, "{"é" * 127}a"]]', [(1, "é" * 127 + "a")]),
    ],
)
def test_parse_queues_reads_json_pairs_csv_names_or_the_defaults_heaviest_first(text, expected):
    assert emqp.parse_queues(text, DEFAULT) == expected


@pytest.mark.parametrize(
    "text",
    [
        "[[10, 'q1']]",
        '[[10, "q1"]',
        "[]",
        '[["10", "q1"]]',
        "[[10]]",
        '[[10, "q1", 1]]',
        '[10, "q1"]',
        '[[true, "q1"]]',
        '[[1.5, "q1"]]',
        '[[10, ""]]',
        "[[10, null]]",
        '[["q1", 10]]',
        f'[[10, "{"a" * 256}"]]',
        f'[[10, "{"é" * 128}"]]',
        "a" * 256,
        ",",
        " , ",
    ],
)
def test_parse_queues_rejects_anything_but_usable_queue_names(text):
    with pytest.raises(ProtocolError) as caught:
        emqp.parse_queues(text, DEFAULT)
    assert caught.value.code == "bad-queues"


def test_deeply_nested_inform_queues_are_refused_not_a_crash():
    with pytest.raises(ProtocolError) as err:
        emqp.parse_queues("[" * 100_000, ["default"])
    assert err.value.code == "bad-queues"


def test_a_deeply_nested_schedule_payload_still_gets_an_id():
    assert len(emqp.schedule_id("[" * 100_000)) == 40


def test_an_inform_naming_more_than_max_queues_is_refused():
    import json

    with pytest.raises(ProtocolError, match="at most"):
        emqp.parse_queues(json.dumps([[1, f"q{i}"] for i in range(emqp.MAX_QUEUES + 1)]), ["default"])
    assert len(emqp.parse_queues(",".join(f"q{i}" for i in range(emqp.MAX_QUEUES)), ["default"])) == emqp.MAX_QUEUES


def test_a_msgid_over_max_msgid_is_refused():
    with pytest.raises(ProtocolError, match="bad-msgid"):
        emqp.parse([b"peer", b"", emqp.VERSION, b"READY", b"m" * (emqp.MAX_MSGID + 1)])


@pytest.mark.parametrize(
    "name, args",
    [
        ("REQUEST", ["q1", "{headers}", JOB]),
        ("SCHEDULE", ["q1", "{headers}", "60", JOB, ""]),
        ("UNSCHEDULE", ["q1", "{headers}", "60", JOB, ""]),
        ("PUBLISH", ["topic", "{headers}", "data"]),
    ],
)
def test_a_headers_frame_over_its_length_is_refused_before_it_is_decoded(name, args):
    # Bytes that are not UTF-8: refused as "bad-headers", not "not-utf8", so nothing decoded the frame.
    over = b"\xff" * 101
    message = [*HEAD, name.encode(), MSGID.encode(), *(over if a == "{headers}" else a.encode() for a in args)]
    with pytest.raises(ProtocolError) as refused:
        emqp.parse(message, max_header_bytes=100)
    assert refused.value.code == "bad-headers" and "101 bytes; at most 100" in refused.value.detail


def test_a_headers_frame_of_more_than_its_items_is_refused_before_it_is_split():
    with pytest.raises(ProtocolError) as refused:
        emqp.parse([*HEAD, b"REQUEST", MSGID.encode(), b"q1", b"," * 4 + b"\xff", JOB.encode()], max_header_items=4)
    assert refused.value.code == "bad-headers"


def test_a_headers_frame_at_its_limits_parses():
    headers = ",".join(["guarantee"] * 4)
    command = emqp.parse(frames("REQUEST", "q1", headers, JOB), max_header_bytes=len(headers), max_header_items=4)
    assert command.args == ["q1", headers, JOB]


def test_the_default_header_limits_leave_room_for_what_eventmq_sends():
    assert emqp.parse(frames("REQUEST", "q1", "reply-requested,retry-count:3,timeout:10,guarantee", JOB))
    with pytest.raises(ProtocolError, match="bad-headers"):
        emqp.parse(frames("REQUEST", "q1", "a" * (emqp.MAX_HEADER_BYTES + 1), JOB))


def test_with_header_uses_headers_already_parsed():
    assert emqp.with_header("a:1", "reply-requested", {"a": "1"}) == "a:1,reply-requested"
    assert emqp.with_header("a:1", "reply-requested", {"reply-requested": ""}) == "a:1"  # believed as given
