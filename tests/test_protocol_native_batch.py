"""PZQ-BATCH/1's frames, byte for byte (docs/native-batch.md), and its decoder against hostile bodies."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pzq.errors import ProtocolError
from pzq.protocols import native_batch as wire

CAPS = wire.Caps(max_messages=1000, max_bytes=2 << 20, max_message_size=16 << 20, max_frames=4096)


def test_a_batch_of_two_messages_is_these_bytes():
    frames = wire.batch(b"b1", [[b"a"], [b"b", b"c"]])
    assert frames == [b"b1", b"PZQ-BATCH/1", b"", bytes.fromhex("92 91 c401 61 92 c401 62 c401 63")]


def test_the_server_reads_those_bytes_back_as_the_two_messages():
    event = wire.parse_batch([b"peer", *wire.batch(b"b1", [[b"a"], [b"b", b"c"]])], CAPS)
    assert isinstance(event, wire.Batch)
    assert (event.routing, event.batch_id, event.bodies) == (b"peer", b"b1", [[b"a"], [b"b", b"c"]])


def test_acks_are_these_frames():
    assert wire.batch_ack(b"r", b"b1", 2) == [b"r", b"b1", b"1", b"", b"2"]
    assert wire.batch_error(b"r", b"b1", "queue full", 1) == [b"r", b"b1", b"0", b"", b"queue full", b"1"]
    assert wire.parse_batch_ack([b"b1", b"1", b"", b"2"]) == wire.BatchAck(b"b1", True, 2)
    assert wire.parse_batch_ack([b"b1", b"0", b"", b"queue full", b"1"]) == wire.BatchAck(b"b1", False, 1, "queue full")


def test_a_legacy_ack_is_not_a_batch_ack():
    assert wire.parse_batch_ack([b"m1", b"1", b""]) is None
    assert wire.parse_batch_ack([b"m1", b"0", b"", b"Trying to save empty message"]) is None


def test_the_probe_and_its_answer_are_these_bytes():
    assert wire.probe(b"p1") == [b"p1", b"PZQ-BATCH/1", b""]
    answer = wire.probe_answer(b"r", b"p1", CAPS)
    caps = bytes.fromhex(
        "84 ac" + b"max_messages".hex() + "cd03e8 a9" + b"max_bytes".hex() + "ce00200000 b0"
        + b"max_message_size".hex() + "ce01000000 aa" + b"max_frames".hex() + "cd1000"
    )  # fmt: skip
    assert answer == [b"r", b"p1", b"1", b"", b"PZQ-BATCH/1", caps]
    assert wire.parse_probe_answer(answer[1:]) == CAPS


def test_an_old_servers_answer_to_the_probe_means_no_batches():
    assert wire.parse_probe_answer([b"p1", b"0", b"", b"Trying to save empty message"]) is None
    assert wire.parse_probe_answer([b"p1", b"1", b"", b"PZQ-BATCH/1", b"\xc1"]) is None


def test_a_probe_is_read_as_a_probe():
    assert wire.parse_batch([b"r", b"p1", wire.MARK, b""], CAPS) == wire.Probe(b"r", b"p1")


def refusal(data: bytes, caps: wire.Caps = CAPS) -> str:
    with pytest.raises(ProtocolError) as raised:
        wire.decode_bodies(data, caps)
    return raised.value.code


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "batch-malformed"),
        (b"\xc1", "batch-malformed"),  # never used in msgpack
        (msgpack.packb({"a": 1}), "batch-malformed"),
        (msgpack.packb([]), "batch-empty"),
        (msgpack.packb([[]]), "batch-message-empty"),
        (msgpack.packb([[b"a"], []]), "batch-message-empty"),
        (msgpack.packb([["text"]]), "batch-malformed"),  # a str frame: frames are bin
        (msgpack.packb([[None]]), "batch-malformed"),
        (msgpack.packb([[1]]), "batch-malformed"),
        (msgpack.packb([b"a"]), "batch-malformed"),  # a message that is not an array
        (msgpack.packb([[[b"a"]]]), "batch-malformed"),  # nested
        (msgpack.packb([[b"a"]]) + b"\x00", "batch-malformed"),  # trailing bytes
        (msgpack.packb([[b"a"]])[:-1], "batch-malformed"),  # cut short
    ],
)
def test_malformed_bodies_are_refused_with_a_code(data, code):
    assert refusal(data) == code


def test_a_deeply_nested_frame_is_refused_from_its_first_headers():
    bomb = b"\x91" * 100_000 + b"\xc0"
    assert refusal(bomb) == "batch-malformed"


def test_a_header_announcing_billions_of_messages_is_refused_before_any_is_read():
    assert refusal(b"\xdd\xff\xff\xff\xff") == "batch-too-many"
    # (and it draws on the turn's records no more than its 5 bytes could hold: one message)
    assert wire.announced([b"r", b"b1", wire.MARK, b"", b"\xdd\xff\xff\xff\xff"], 1000) == 1


def test_a_tiny_frame_announcing_a_thousand_messages_draws_one_record_and_a_real_batch_all_of_its_own():
    # A flood of 4-byte frames announcing 1,000 messages each took a whole turn's records apiece: honest
    # producers' throughput fell twelvefold on the development machine (/tmp/hostile/a12_fake_count.py)
    assert wire.announced([b"r", b"b1", wire.MARK, b"", b"\xdc\x03\xe8\xc1"], 1000) == 1
    real = wire.batch(b"b2", [[b""]] * 1000)
    assert wire.announced([b"r", *real], 1000) == 1000
    assert wire.announced([b"r", *wire.batch(b"b3", [[b"x"]] * 10)], 1000) == 10


def test_a_message_announcing_a_million_frames_is_refused_before_they_are_read():
    assert refusal(b"\x91\xdd\x00\x0f\x42\x40" + b"\xc4\x00" * 10) == "batch-frames"


def test_past_each_cap_the_batch_is_refused():
    small = wire.Caps(max_messages=2, max_bytes=64, max_message_size=4, max_frames=3)
    assert refusal(msgpack.packb([[b"a"]] * 3), small) == "batch-too-many"
    assert refusal(msgpack.packb([[b"x" * 70]]), small) == "batch-too-large"
    assert refusal(msgpack.packb([[b"abc", b"de"]]), small) == "batch-message-too-large"
    assert refusal(msgpack.packb([[b"a", b"b"], [b"c", b"d"]]), small) == "batch-frames"
    assert wire.decode_bodies(msgpack.packb([[b"ab", b"cd"], [b""]]), small) == [[b"ab", b"cd"], [b""]]


def test_a_bad_batch_id_is_refused_and_echoed_at_most_its_first_kilobyte():
    for bad in (b"", "é".encode(), b"with space", b"x" * 201):
        event = wire.parse_batch([b"r", bad, wire.MARK, b"", msgpack.packb([[b"a"]])], CAPS)
        assert isinstance(event, wire.BatchRejected) and event.error.code == "batch-bad-id"
    event = wire.parse_batch([b"r", b"\xff" * 5000, wire.MARK, b""], CAPS)
    assert isinstance(event, wire.BatchRejected) and event.batch_id == b"\xff" * 1024


def test_extra_frames_after_the_bodies_are_refused():
    event = wire.parse_batch([b"r", b"b1", wire.MARK, b"", msgpack.packb([[b"a"]]), b"more"], CAPS)
    assert isinstance(event, wire.BatchRejected) and event.error.code == "batch-frames"
    event = wire.parse_batch([b"r", b"b1", wire.MARK, b"x", msgpack.packb([[b"a"]])], CAPS)
    assert isinstance(event, wire.BatchRejected) and event.error.code == "batch-frames"


def test_what_a_client_encodes_fits_its_size_estimate():
    body = [b"x" * 300, b"", b"y" * 70_000]
    assert len(wire.encode_bodies([body])) <= wire.encoded_size(body) + 5


# Structures that are sometimes what a batch should be and often not, packed by msgpack.
_leaf = st.one_of(
    st.binary(max_size=8), st.text(max_size=4), st.integers(-(2**63), 2**64 - 1), st.none(), st.booleans()
)
_shapes = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4), max_leaves=20)
SMALL = wire.Caps(max_messages=5, max_bytes=256, max_message_size=16, max_frames=8)


# Each a few hundred examples here; test_fuzz_decoders.py (the slow tier's fuzzers) runs the same
# properties at its own count (3,000 each: 2,000 and 1,000 here took 20 s of the fast tier on a busy CI).
BODIES_FRAMES = st.one_of(st.binary(max_size=64), _shapes.map(lambda v: msgpack.packb(v, use_bin_type=True)))
AFTER_MARKER = st.lists(st.binary(max_size=12), max_size=7)


def decoder_answers(data: bytes) -> None:
    """What the bodies frame ``data`` decodes to is messages within the caps, or a batch protocol error."""
    try:
        out = wire.decode_bodies(data, SMALL)
    except ProtocolError as exc:
        assert exc.code.startswith("batch-") and exc.detail
        return
    assert 1 <= len(out) <= SMALL.max_messages
    assert all(body and all(type(part) is bytes for part in body) for body in out)


def server_answers(rest: list[bytes]) -> None:
    """Whatever frames follow the marker, the server has an answer to them."""
    event = wire.parse_batch([b"peer", b"id", wire.MARK, *rest], SMALL)
    assert isinstance(event, (wire.Batch, wire.Probe, wire.BatchRejected))
    assert wire.announced([b"peer", b"id", wire.MARK, *rest], 5) in range(1, 6)


@settings(max_examples=300, deadline=None)
@given(BODIES_FRAMES)
def test_whatever_bytes_the_bodies_frame_holds_the_decoder_answers_messages_or_a_protocol_error(data):
    decoder_answers(data)


@settings(max_examples=150, deadline=None)
@given(AFTER_MARKER)
def test_whatever_frames_arrive_after_the_marker_the_server_answers_them(rest):
    server_answers(rest)


def test_a_batch_draws_what_it_announces_on_the_turns_records_and_any_other_message_one():
    five = msgpack.packb([b"a"] * 5)
    assert wire.records_of([b"peer", b"b-1", wire.MARK, b"", five], 1000) == 5
    assert wire.records_of([b"peer", b"b-1", wire.MARK, b"", five], 3) == 3
    assert wire.records_of([b"peer", b"id", b"", b"body", b"more"], 1000) == 1  # a legacy message of 5 frames


def test_a_refused_batch_is_answered_with_its_id_echoed_and_cut():
    answer = wire.refuse_batch([b"peer", b"x" * 2000, wire.MARK], "busy")
    assert answer[0] == b"peer" and answer[1] == b"x" * wire.MAX_ECHO and b"busy" in answer
