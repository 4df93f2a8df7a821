"""Frame vectors of the native PZQ protocol (docs/protocols.md, "The native protocol"), as pure functions."""

from __future__ import annotations

import pytest

from pzq.protocols import native
from pzq.protocols.native import ConsumerAck, Delivered, Produce, ProduceAck, Rejected

LIMIT = 1024
MID = "0000000000000001000000000000002a"
CUT_TEXT = native.TOO_MANY_FRAMES.format(limit=1024, sent=1023).encode()


def test_a_produce_with_no_headers_yields_its_body():
    assert native.parse_produce([b"peer", b"id-1", b"", b"hello"], LIMIT) == Produce(b"peer", b"id-1", [b"hello"])


def test_header_frames_before_the_delimiter_are_not_part_of_the_body():
    frames = [b"peer", b"id-1", b"h1", b"h2", b"", b"body"]
    assert native.parse_produce(frames, LIMIT) == Produce(b"peer", b"id-1", [b"body"])


def test_a_multi_frame_binary_body_keeps_every_part_including_empty_ones():
    body = [b"\x00\xff", b"", b"part|3", b""]
    assert native.parse_produce([b"peer", b"\x01id", b"", *body], LIMIT) == Produce(b"peer", b"\x01id", body)


def test_an_empty_message_id_is_still_answered():
    assert native.parse_produce([b"peer", b"", b"", b"x"], LIMIT) == Produce(b"peer", b"", [b"x"])


def test_a_produce_without_a_delimiter_is_rejected_with_the_original_text():
    result = native.parse_produce([b"peer", b"id", b"body"], LIMIT)
    assert isinstance(result, Rejected)
    assert (result.routing, result.message_id, result.error.code) == (b"peer", b"id", "no-delimiter")
    assert result.error.detail == "Malformed message, no delimiter found or missing message parts"


def test_a_produce_with_a_delimiter_but_no_body_is_rejected_as_empty():
    result = native.parse_produce([b"peer", b"id", b"header", b""], LIMIT)
    assert (result.routing, result.message_id, result.error.code) == (b"peer", b"id", "empty")
    assert result.error.detail == "Trying to save empty message"


def test_a_message_of_only_an_id_is_rejected_so_the_producer_gets_an_answer():
    result = native.parse_produce([b"peer", b"id"], LIMIT)
    assert (result.routing, result.message_id, result.error.code) == (b"peer", b"id", "only-id")
    assert result.error.detail == native.ONLY_ID


def test_a_lone_routing_frame_has_nobody_to_answer():
    assert native.parse_produce([b"peer"], LIMIT) is None
    assert native.parse_produce([], LIMIT) is None


def test_a_body_over_the_size_limit_is_rejected_and_one_at_the_limit_is_accepted():
    at_limit = [b"x" * 1000, b"y" * 24]
    assert native.parse_produce([b"peer", b"id", b"", *at_limit], LIMIT) == Produce(b"peer", b"id", at_limit)
    result = native.parse_produce([b"peer", b"id", b"", b"x" * 1000, b"y" * 25], LIMIT)
    assert result.error.code == "too-large"
    assert result.error.detail == "Message too large: 1025 bytes, the limit is 1024"


def test_a_stored_produce_is_acked_with_one_and_an_empty_frame():
    assert native.produce_ack(b"peer", b"id-1") == [b"peer", b"id-1", b"1", b""]


def test_a_refused_produce_is_acked_with_zero_and_the_error_text():
    assert native.produce_ack(b"peer", b"id-1", "queue full") == [b"peer", b"id-1", b"0", b"", b"queue full"]
    assert native.produce_ack(b"p", b"i", "caf\u00e9") == [b"p", b"i", b"0", b"", "caf\u00e9".encode()]


def test_a_message_key_is_the_enqueue_time_and_the_message_id():
    key = native.message_key(1_700_000_000_000_123, MID)
    assert key == b"1700000000000123|" + MID.encode()
    assert native.message_key(42, MID) == b"0000000000000042|" + MID.encode()
    assert native.key_message_id(key) == MID


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b"no-separator" + MID.encode(),
        b"1|" + MID[:31].encode(),
        b"1|" + MID.encode() + b"0",
        b"1|" + b"\xff" * 32,
        MID.encode() + b"|",
    ],
)
def test_a_key_that_pzq_did_not_make_gives_no_message_id(key):
    assert native.key_message_id(key) is None


def test_a_delivery_is_key_sent_time_timeout_delimiter_then_the_body():
    frames = native.delivery(
        b"0000000000000042|" + MID.encode(), 1_700_000_000_000_000, 5_000_000, [b"a", b"", b"\x00"]
    )
    assert frames == [b"0000000000000042|" + MID.encode(), b"1700000000000000", b"5000000", b"", b"a", b"", b"\x00"]
    assert frames[4:] == [b"a", b"", b"\x00"]  # body at index 5 once the consumer's ROUTER adds the peer id


def test_a_consumer_answer_of_one_acks_and_anything_else_nacks():
    assert native.parse_consumer_ack([b"key", b"1"]) == ConsumerAck(b"key", True)
    assert native.parse_consumer_ack([b"key", b"0"]) == ConsumerAck(b"key", False)
    assert native.parse_consumer_ack([b"key", b"yes"]) == ConsumerAck(b"key", False)
    assert native.parse_consumer_ack([b"key", b""]) == ConsumerAck(b"key", False)
    assert native.parse_consumer_ack([b"key", b"1", b"extra"]) == ConsumerAck(b"key", True)


def test_a_consumer_answer_too_short_to_carry_an_ack_is_ignored():
    assert native.parse_consumer_ack([b"key"]) is None
    assert native.parse_consumer_ack([]) is None


def test_a_message_id_over_max_id_is_refused_with_its_first_bytes_echoed():
    event = native.parse_produce([b"peer", b"i" * (native.MAX_ID + 1), b"", b"body"], 1024)
    assert isinstance(event, Rejected) and event.error.code == "id-too-long"
    assert event.message_id == b"i" * native.MAX_ID


def test_a_message_cut_past_the_frame_cap_is_refused_too_many_frames_with_its_id_echoed():
    cut = native.Cut([b"peer", b"i" * (native.MAX_ID + 5), b"header", b""])
    event = native.parse_produce(cut, LIMIT)
    assert isinstance(event, Rejected) and event.error.code == "too-many-frames" and not event.batch
    assert native.refusal(event) == [b"peer", b"i" * native.MAX_ID, b"0", b"", CUT_TEXT]


def test_a_batch_cut_past_the_frame_cap_is_refused_in_a_batchs_frames_with_nothing_stored():
    event = native.parse_produce(native.Cut([b"peer", b"b1", b"PZQ-BATCH/1", b"", b"x"]), LIMIT)
    assert isinstance(event, Rejected) and event.batch
    assert native.refusal(event) == [b"peer", b"b1", b"0", b"", CUT_TEXT, b"0"]


def test_the_frame_cap_the_refusal_names_is_the_one_the_server_reads_with():
    from pzq import zmqio
    from pzq.protocols import native_consume

    assert native.MAX_FRAMES == zmqio.MAX_FRAMES == 1024
    assert b"at most 1024 in one message" in CUT_TEXT and b"(1023 as the producer sends them)" in CUT_TEXT
    assert b"1024" in native_consume.CUT


# -- the client's side ---------------------------------------------------------------------------------


def test_a_producer_sends_its_id_a_delimiter_and_the_body():
    assert native.produce(b"7", [b"a", b"", b"\x00"]) == [b"7", b"", b"a", b"", b"\x00"]
    routed = [b"peer", *native.produce(b"7", [b"body"])]  # what the server's ROUTER reads
    assert native.parse_produce(routed, LIMIT) == Produce(b"peer", b"7", [b"body"])


def test_a_producer_reads_both_acks_as_the_server_writes_them():
    assert native.parse_produce_ack([b"7", b"1", b""]) == ProduceAck(b"7", True, "")
    assert native.parse_produce_ack([b"7", b"0", b"", b"queue full"]) == ProduceAck(b"7", False, "queue full")
    assert native.parse_produce_ack([b"7", b"0", b"", b"\xff"]) == ProduceAck(b"7", False, "\ufffd")
    for error in (None, "Trying to save empty message"):
        frames = native.produce_ack(b"peer", b"id-9", error)[1:]  # the DEALER gets no routing frame
        assert native.parse_produce_ack(frames) == ProduceAck(b"id-9", error is None, error or "")


@pytest.mark.parametrize(
    "frames",
    [[], [b"7"], [b"7", b"1"], [b"7", b"2", b""], [b"7", b"1", b"x"], [b"7", b"", b"1"]],
)
def test_anything_else_is_not_an_ack(frames):
    assert native.parse_produce_ack(frames) is None


def test_a_consumer_reads_a_delivery_as_the_server_writes_it():
    key = b"0000000000000042|" + MID.encode()
    frames = native.delivery(key, 1_700_000_000_000_000, 5_000_000, [b"a", b"", b"\x00"])
    assert native.parse_delivery(frames) == Delivered(key, 1_700_000_000_000_000, 5_000_000, [b"a", b"", b"\x00"])
    assert native.parse_delivery([b"k", b"1", b"2", b""]) == Delivered(b"k", 1, 2, [])


@pytest.mark.parametrize(
    "frames",
    [
        [b"k", b"1", b"2"],
        [b"k", b"1", b"2", b"body"],
        [b"k", b"-1", b"2", b"", b"x"],
        [b"k", b"1", b"2.5", b"", b"x"],
        [b"k", b"", b"2", b"", b"x"],
    ],
)
def test_anything_else_is_not_a_delivery(frames):
    assert native.parse_delivery(frames) is None


def test_a_consumer_answers_one_or_zero_and_the_server_reads_it_so():
    assert native.consumer_ack(b"key") == [b"key", b"1"]
    assert native.consumer_ack(b"key", ok=False) == [b"key", b"0"]
    assert native.parse_consumer_ack(native.consumer_ack(b"key")) == ConsumerAck(b"key", True)
    assert native.parse_consumer_ack(native.consumer_ack(b"key", ok=False)) == ConsumerAck(b"key", False)


def test_a_key_names_the_queue_and_sequence_of_its_message_id():
    assert native.key_ref(b"1700000000000123|" + MID.encode()) == (1, 42)
    assert native.key_ref(native.message_key(7, "ffffffffffffffff" + "00000000000000ff")) == (2**64 - 1, 255)
    # (a key pzq did not make, but whose tail is a message id: the id names the message)
    assert native.key_ref(b"12|" + MID.encode()) == (1, 42)


@pytest.mark.parametrize(
    "key",
    [
        b"",
        b"no bar at all",
        b"1700000000000123|" + MID.upper().encode(),  # (pzq writes lowercase hex)
        b"1700000000000123|" + b"g" * 32,
        b"1700000000000123|" + MID.encode()[:-1],
        b"1700000000000123-" + MID.encode(),
        b"1700000000000123|" + b"\xff" * 32,
    ],
)
def test_a_key_that_names_no_message_reads_as_none(key):
    assert native.key_ref(key) is None


def test_an_answer_is_matched_by_its_first_frame_and_an_empty_one_by_nothing():
    assert native.answered_id([b"id-7", b"1", b""]) == b"id-7"
    assert native.answered_id([b"batch-1", b"0", b"", b"busy", b"0"]) == b"batch-1"
    assert native.answered_id([]) is None


def test_a_routed_delivery_gives_the_servers_peer_id_and_the_delivery():
    frames = [b"\x00peer", b"0000000000000042|" + MID.encode(), b"123", b"30000000", b"", b"a", b"b"]
    peer, delivered = native.parse_routed_delivery(frames)
    assert peer == b"\x00peer"
    assert delivered == Delivered(frames[1], 123, 30_000_000, [b"a", b"b"])
    assert native.parse_routed_delivery([]) is None
    assert native.parse_routed_delivery([b"\x00peer", b"key", b"x", b"1", b""]) is None  # (sent µs not digits)


def test_a_stored_answer_is_told_from_a_refusal_by_its_status_frame():
    assert native.stored_ack(native.produce_ack(b"peer", b"id-1")) == (b"peer", b"id-1")
    assert native.stored_ack(native.produce_ack(b"peer", b"id-1", native.BUSY)) is None
    assert native.stored_ack([b"peer", b"id-1"]) is None


def test_the_usual_shape_of_a_produced_message_is_read_to_its_body_and_every_other_shape_to_none():
    assert native.plain_body([b"peer", b"id-1", b"", b"a", b"b"], 2) == [b"a", b"b"]
    assert native.plain_body([b"peer", b"id-1", b"", b"ab", b"c"], 2) is None  # past the size: parse_produce
    assert native.plain_body([b"peer", b"id-1", b"x", b"a"], 10) is None  # no delimiter
    assert native.plain_body([b"peer", b"i" * (native.MAX_ID + 1), b"", b"a"], 10) is None  # id too long
    assert native.plain_body([b"peer", b"id-1", b""], 10) is None  # no body


def test_a_consumers_answer_is_read_as_its_key_and_whether_it_is_an_ack():
    assert native.consumer_answer([b"key", b"1"]) == (b"key", True)
    assert native.consumer_answer([b"key", b"0", b"extra"]) == (b"key", False)
    assert native.consumer_answer([b"key"]) is None
