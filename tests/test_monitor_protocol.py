"""The monitor socket's requests and replies (pure functions)."""

from __future__ import annotations

import json

import pytest

from pzq.protocols import monitor
from pzq.protocols.monitor import Request

STATS = {
    "messages": 3,
    "messages_inflight": 1,
    "db_size": 40960,
    "inflight_db_size": 240,
    "syncs": 7,
    "expired_messages": 2,
    "queues": {
        "default": {"depth": 3, "inflight": 1, "dead_letters": 0, "bytes": 300},
        "jobs": {"depth": 0, "inflight": 0, "dead_letters": 4, "bytes": 0},
    },
    "uptime_seconds": 12.34,
    "produce_rate": 0.0,
}


def test_a_req_client_request_keeps_its_envelope_up_to_the_empty_frame():
    assert monitor.parse_request([b"peer", b"", b"MONITOR"]) == Request([b"peer", b""], "MONITOR", [])


def test_a_bare_dealer_request_is_answered_with_a_delimiter_as_the_original_did():
    assert monitor.parse_request([b"peer", b"MONITOR"]) == Request([b"peer", b""], "MONITOR", [])


def test_a_request_is_split_into_a_command_and_its_arguments():
    request = monitor.parse_request([b"peer", b"", b"  REQUEUE  jobs   all "])
    assert (request.command, request.args) == ("REQUEUE", ["jobs", "all"])


@pytest.mark.parametrize(
    "frames",
    [
        [b"peer", b"", b""],
        [b"peer", b"", b"   "],
        [b"peer", b""],
        [b"peer", b"", b"\xff\xfeMONITOR"],
        [b"peer", b"", b"MONITOR", b"extra"],
        [b"peer", b"", b"MONITOR " + b"x" * 4096],
    ],
)
def test_an_empty_garbled_or_multi_frame_request_has_no_command(frames):
    request = monitor.parse_request(frames)
    assert (request.envelope, request.command, request.args) == ([b"peer", b""], "", [])


def test_the_reply_goes_back_through_the_same_envelope():
    req = monitor.parse_request([b"peer", b"", b"MONITOR"])
    assert monitor.reply(req, "messages: 0\n") == [b"peer", b"", b"messages: 0\n"]
    bare = monitor.parse_request([b"peer", b"STATS"])
    assert monitor.reply(bare, "{}") == [b"peer", b"", b"{}"]


def test_an_unknown_request_is_answered_with_one_error_line():
    text = monitor.unknown_request(monitor.parse_request([b"peer", b"", b"HELLO"]))
    assert text.startswith("error: unknown request")
    assert text.endswith("\n") and text.count("\n") == 1


def test_the_text_reply_starts_with_the_six_pzq_lines_in_order():
    lines = monitor.render_text(STATS).splitlines()
    assert lines[:6] == [
        "messages: 3",
        "messages_inflight: 1",
        "db_size: 40960",
        "inflight_db_size: 240",
        "syncs: 7",
        "expired_messages: 2",
    ]


def test_the_text_reply_adds_the_wiki_spellings_of_two_fields_after_the_six_with_the_same_values():
    lines = monitor.render_text(STATS).splitlines()
    assert lines[6:8] == ["messages_in_flight: 1", "in_flightdb_size: 240"]
    assert monitor.monitor_opening(STATS).splitlines() == lines[:8]


def test_create_delete_and_routes_requests_are_parsed_from_their_bytes():
    for raw, command, args in (
        (b"CREATE orders", "CREATE", ["orders"]),
        (b"DELETE orders", "DELETE", ["orders"]),
        (b"ROUTES user.1.connected", "ROUTES", ["user.1.connected"]),
    ):
        request = monitor.parse_request([b"peer", b"", raw])
        assert (request.envelope, request.command, request.args, request.body) == ([b"peer", b""], command, args, None)
    too_long = monitor.parse_request([b"peer", b"", b"CREATE " + b"q" * 100_000])
    assert too_long.command == "" and "at most 4096 bytes" in too_long.problem


def test_the_text_reply_flattens_queues_and_lists_the_other_figures_after():
    text = monitor.render_text(STATS)
    assert text.endswith("\n")
    assert text.splitlines()[8:] == [
        "queue.default.depth: 3",
        "queue.default.inflight: 1",
        "queue.default.dead_letters: 0",
        "queue.default.bytes: 300",
        "queue.jobs.depth: 0",
        "queue.jobs.inflight: 0",
        "queue.jobs.dead_letters: 4",
        "queue.jobs.bytes: 0",
        "uptime_seconds: 12.3",
        "produce_rate: 0.0",
    ]


def test_every_text_line_splits_into_a_name_and_a_value_like_the_php_client_does():
    for line in monitor.render_text(STATS).rstrip("\n").split("\n"):
        name, value = line.split(": ")
        assert name and value


def test_the_six_pzq_lines_come_first_whatever_order_the_figures_arrive_in():
    shuffled = {"queues": {}, **{k: STATS[k] for k in reversed(monitor.PZQ_FIELDS)}}
    assert monitor.render_text(shuffled) == monitor.render_text({k: STATS[k] for k in monitor.PZQ_FIELDS})


def test_the_json_reply_is_valid_json_with_the_same_figures():
    assert json.loads(monitor.render_json(STATS)) == STATS
    assert json.loads(monitor.render_json([{"id": "x", "body": ["caf\u00e9"]}])) == [{"id": "x", "body": ["caf\u00e9"]}]
