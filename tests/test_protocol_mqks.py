"""The MQKS line codec by vectors: lines in, requests out; requests' answers as exact bytes."""

from __future__ import annotations

import pytest

from pzq.errors import ProtocolError
from pzq.protocols import mqks
from pzq.protocols import mqks_client as mc


def parse(line: str) -> mqks.Request:
    return mqks.parse_line(line.encode())


def test_publish_keeps_spaces_in_its_data():
    assert parse("m1 publish e1 hello  big world") == mqks.Request(
        "m1", "publish", False, {"event": "e1", "data": "hello  big world"}
    )


def test_confirm_is_only_a_flag_when_it_is_the_first_token_of_data():
    assert parse("m1 publish --confirm e1 d1").confirm is True
    assert parse("m1 publish --confirm e1 d1").args == {"event": "e1", "data": "d1"}
    assert parse("m1 publish e1 --confirm").args == {"event": "e1", "data": "--confirm"}
    assert parse("pg1 ping --confirm").confirm is True


def test_consume_reads_events_added_events_and_flags_in_the_seed_example():
    request = parse("c1 consume --confirm q1 e1 e2 --delete-queue-when-unused=5 --manual-ack")
    assert request.confirm and request.args == {
        "queue": "q1",
        "events": ["e1", "e2"],
        "add": [],
        "unused": 5.0,
        "manual_ack": True,
        "prefetch": None,
    }
    assert parse("c2 consume q1 --add e3 e4").args == {
        "queue": "q1",
        "events": None,
        "add": ["e3", "e4"],
        "unused": None,
        "manual_ack": False,
        "prefetch": None,
    }
    assert parse("c4 consume q1 --manual-ack --prefetch=1").args["prefetch"] == 1
    assert parse("c3 consume q1 --delete-queue-when-unused").args["unused"] == 0.0


def test_rebind_reads_replace_remove_remove_mask_and_add():
    assert parse("rb3 rebind q1 e1 --remove e3 --remove-mask e5.*.a1 e5.*.a2 --add e8").args == {
        "queue": "q1",
        "events": ["e1"],
        "remove": ["e3"],
        "remove_mask": ["e5.*.a1", "e5.*.a2"],
        "add": ["e8"],
    }


def test_options_are_words_that_begin_with_two_dashes_wherever_the_spaces_fall():
    with pytest.raises(ProtocolError, match="--x-y"):
        parse("c1 consume  q1 e1  e--2 --add  e3 --x-y  --manual-ack e4")
    args = parse("c1 consume  q1 e1  e--2 --add  e3 --manual-ack e4 --prefetch=3 ").args
    assert (args["queue"], args["events"], args["add"]) == ("q1", ["e1", "e--2"], ["e3", "e4"])
    assert (args["manual_ack"], args["prefetch"]) == (True, 3)
    args = parse("r1 rebind q1 --remove a b --remove-mask a.* --add c").args
    assert (args["events"], args["remove"], args["remove_mask"], args["add"]) == (None, ["a", "b"], ["a.*"], ["c"])
    assert parse("r1 rebind q\u00e9 \u00e9v\u00a0x").args["events"] == ["\u00e9v\u00a0x"]  # (NBSP: no space)


def test_ack_and_reject_take_a_message_id_or_all():
    assert parse("a1 ack c1 m1").args == {"consumer": "c1", "msg_id": "m1"}
    assert parse("rj1 reject c1 --all").args == {"consumer": "c1", "msg_id": None}


@pytest.mark.parametrize(
    "line, code",
    [
        ("x1", "no-action"),
        ("x1 blabla 123", "unknown-action"),
        ("x1 consume", "no-queue"),
        ("x1 consume q1 --bogus", "bad-option"),
        ("x1 consume q1 --delete-queue-when-unused=soon", "bad-option"),
        ("x1 consume q1 --prefetch=0", "bad-option"),
        ("x1 ack c1", "bad-arguments"),
        ("x1 delete_queue", "bad-arguments"),
        ("x1 consume q\t1 e1", "bad-id"),
        ("x1 publish e\x01 data", "bad-id"),
        ("x1 consume " + "q" * 256, "bad-id"),
        ("x1 consume --add e1", "no-queue"),
        ("x1 consume q1 -- add e1", "bad-option"),  # ("--" alone is no option's name)
        ("x1 rebind q1 --", "bad-option"),
        ("x1 rebind q1 e1 --remove e\u00a0\x7f", "bad-id"),
        ("x1 rebind q1 e1 --remove e\u00e9\x1f", "bad-id"),
    ],
)
def test_bad_lines_raise_a_protocol_error_with_a_code(line, code):
    with pytest.raises(ProtocolError) as info:
        parse(line)
    assert info.value.code == code


def test_a_line_that_is_not_utf8_is_an_error_answered_to_its_request_id():
    with pytest.raises(ProtocolError):
        mqks.parse_line(b"x1 publish e1 \xff")
    assert mqks.request_id_of(b"x1 publish e1 \xff") == "x1"
    assert mqks.request_id_of(b"\tx publish") == "-"


def test_a_crlf_line_end_is_accepted():
    assert parse("pg1 ping hi\r").args == {"data": "hi"}


@pytest.mark.parametrize(
    "mask, event, removed",
    [
        ("*.updated", "user.updated", True),
        ("document.*", "document.created", True),
        ("user.*.connected", "user.57e82b3931d9d614f0247ac7.connected", True),
        ("*.*.deleted", "category.subcategory.deleted", True),
        ("*.*.deleted", "post.deleted", False),
        ("user.*.connected", "user.1.2.connected", False),
        ("*", "nodots", False),  # masks only apply to events with dots
        ("e5.*.a1", "e5.id1.a1", True),
        ("e5.*.a1", "e5.id1.a2", False),
    ],
)
def test_masks_match_runs_without_dots(mask, event, removed):
    assert mqks.matches(mask, event) is removed


def test_a_hostile_mask_is_matched_in_no_time():
    import time

    started = time.perf_counter()
    assert not mqks.matches("*a" * 120 + "*", "a" * 200 + ".b")
    assert not mqks.matches("*a" * 14 + ".b", "a" * 30 + "c.b")
    assert time.perf_counter() - started < 0.5


def test_responses_are_exact_lines():
    assert mqks.ok("pg1", "service1") == b"pg1 ok service1\n"
    assert mqks.ok("c1") == b"c1 ok \n"
    assert mqks.error("x1", "0123456789abcdef01234567") == b"x1 error 0123456789abcdef01234567\n"
    assert mqks.delivery("c1", "m1", "e1", 0, "d1") == b"c1 ok m1 event=e1 d1\n"
    assert mqks.delivery("c1", "m1", "e1", 1, "d1") == b"c1 ok m1 event=e1,retry=1 d1\n"
    assert (
        mqks.update("c1", "q1", ["e1", "e2"], 5.0, True)
        == b"c1 ok --update q1 e1 e2 --delete-queue-when-unused=5.0 --manual-ack\n"
    )
    assert mqks.update("c1", "q1", [], None, False) == b"c1 ok --update q1\n"


def test_bodies_from_other_protocols_cannot_break_the_line():
    assert mqks.body_text([b"a\nb", b"\r\xff"]) == "a\\nb\\r\ufffd"


def test_the_line_buffer_joins_fragments_splits_joined_lines_and_refuses_endless_ones():
    buffer = mqks.LineBuffer(limit=16)
    assert buffer.feed(b"pg1 pi") == []
    assert buffer.feed(b"ng a\npg2 ping b\n\npg3") == [b"pg1 ping a", b"pg2 ping b"]
    assert buffer.feed(b" ping c\n") == [b"pg3 ping c"]
    with pytest.raises(ProtocolError):
        buffer.feed(b"x" * 17)


def test_remove_masked_keeps_the_mask_rules_and_globs_only_within_its_budget():
    events = ["user.1.connected", "user.2.connected", "user.2.left", "doc.created", "plain", "a.b.c"]
    assert mqks.remove_masked(events, ["user.*.connected"]) == ["user.2.left", "doc.created", "plain", "a.b.c"]
    assert mqks.remove_masked(events, ["*.*"]) == [e for e in events if e != "doc.created"]
    assert mqks.remove_masked(events, ["us*r.2.*"]) == [e for e in events if not e.startswith("user.2.")]
    assert mqks.remove_masked(events, []) == events
    for mask in ("user.*.connected", "*.*", "us*r.2.*", "*", "plain", "a.*.c", "*.b.*"):
        assert mqks.remove_masked(events, [mask]) == [e for e in events if not mqks.matches(mask, e)], mask
    many = [f"e{i}.x{i}.a{i % 7}" for i in range(10_000)]
    masks = [f"e{i}.*.a{i % 7}" for i in range(100)]
    assert len(mqks.remove_masked(many, masks)) == 10_000 - 100  # literal segments: no glob at all
    # Indexed at their third segment (30,000 segments split, 10,000 entries), then each of the 10,000
    # candidates split again (3) and globbed twice: 90,000 units of work, and their characters read by
    # the globs (one unit per 16, each mask's candidates apart).
    per_unit = mqks.GLOB_CHARS_PER_UNIT
    globbed = sum(sum(len(e) for e in many if e.endswith(f".a{i}")) // per_unit for i in range(7))
    assert len(mqks.remove_masked(many, [f"e*.x*.a{i}" for i in range(7)], budget=90_000 + globbed)) == 0
    with pytest.raises(ProtocolError, match="too-complex"):  # every candidate globbed: over the budget
        mqks.remove_masked(many, [f"e*.x*.a{i}" for i in range(7)], budget=90_000 + globbed - 1)


class Counted(str):
    """An event that counts the times it is split (the work remove_masked does per event)."""

    splits = 0

    def split(self, *args, **kwargs):
        Counted.splits += 1
        return super().split(*args, **kwargs)


def test_remove_masked_refuses_work_over_its_budget_before_splitting_any_event():
    deep = "".join(".a" for _ in range(120))  # 121 segments, as long as an id may be
    events = [Counted(f"{i}{deep}") for i in range(10_000)]
    Counted.splits = 0
    with pytest.raises(ProtocolError, match="too-complex"):  # indexed at their second segment: 1.2 M
        mqks.remove_masked(events, [f"*{deep[:-2]}.{i}" for i in range(100)], budget=200_000)
    assert Counted.splits == 0
    # A first literal segment: the 10 events sorted (10 // 4), the one candidate split (121) and checked (120)
    assert mqks.remove_masked(events[:10], ["3" + deep], budget=2 + 121 + 120) == events[:3] + events[4:10]
    assert Counted.splits == 1


def test_remove_masked_splits_only_events_with_as_many_segments_as_a_mask():
    events = [Counted(f"e{i}.x") for i in range(100)] + [Counted(f"e{i}.x.y") for i in range(3)]
    Counted.splits = 0
    assert mqks.remove_masked(events, ["*.x.y"]) == events[:100]
    assert Counted.splits == 2 * 3  # each of the three indexed, then checked; none of the hundred


def test_a_glob_that_would_backtrack_is_matched_by_finding_its_pieces():
    assert not mqks.matches("*" + "a" * 120 + "b.x", "a" * 250 + ".x")
    assert mqks.matches("*a*b*.x", "zzazzbzz.x") and not mqks.matches("ab*ba.x", "aba.x")
    assert mqks.matches("**.x", ".x") and mqks.matches("**.x", "q.x")  # (a star may match nothing)


# -- the client's side ---------------------------------------------------------------------------------


def test_a_client_writes_request_lines_that_the_server_reads_back():
    assert (
        mc.request_line("p1", "publish", "e1 hello  world", confirm=True) == b"p1 publish --confirm e1 hello  world\n"
    )
    assert mc.request_line("pg1", "ping") == b"pg1 ping\n"
    assert mc.request_line("a1", "ack", "c1 --all") == b"a1 ack c1 --all\n"
    assert mqks.parse_line(mc.request_line("p1", "publish", "e1 a b", confirm=True).rstrip(b"\n")) == mqks.Request(
        "p1", "publish", True, {"event": "e1", "data": "a b"}
    )
    assert parse(mc.request_line("c1", "consume", "q1 e1 --manual-ack").decode().rstrip("\n")).args["manual_ack"]


def test_a_client_reads_deliveries_as_the_server_writes_them():
    line = mqks.delivery("c1", "m1", "e1", 0, "hello  big world").decode().rstrip("\n")
    assert mc.parse_delivery(line) == mc.Delivery("c1", "m1", "e1", 0, "hello  big world")
    line = mqks.delivery("c1", "m2", "user.1.left", 3, "").decode().rstrip("\n")
    assert mc.parse_delivery(line) == mc.Delivery("c1", "m2", "user.1.left", 3, "")
    assert mc.parse_delivery("c1 ok m3 event=e1 a\\nb") == mc.Delivery("c1", "m3", "e1", 0, "a\\nb")


@pytest.mark.parametrize(
    "line",
    ["c1 ok ", "c1 ok --update q1 e1 --manual-ack", "c1 ok --update q1", "c1 error 0123abcd", "c1 ok m1 e1 data", ""],
)
def test_answers_and_notices_are_not_deliveries(line):
    assert mc.parse_delivery(line) is None


def test_a_client_reads_the_answer_to_its_request_and_only_that():
    assert mc.parse_answer(mqks.ok("r1", "pong").decode().rstrip("\n"), "r1") == mc.Answer("r1", True, "pong")
    assert mc.parse_answer(mqks.ok("r1").decode().rstrip("\n"), "r1") == mc.Answer("r1", True, "")
    assert mc.parse_answer("r1 ok", "r1") == mc.Answer("r1", True, "")
    eid = "0123456789abcdef01234567"
    assert mc.parse_answer(mqks.error("r1", eid).decode().rstrip("\n"), "r1") == mc.Answer("r1", False, eid)
    for other in ("r10 ok x", "r1 okay", "r1 ok --update q1 e1", "c1 ok m1 event=e1 x", "r2 error " + eid, ""):
        assert mc.parse_answer(other, "r1") is None, other
