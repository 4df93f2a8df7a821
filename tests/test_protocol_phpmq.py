"""The PHPMQ codec (shared/specs/phpmq.md) as pure functions: the spec's byte vectors in both
directions, round trips, fragmentation, garbage, and the per-connection dialect rule."""

from __future__ import annotations

import random

import pytest

from pzq.errors import ProtocolError
from pzq.protocols import phpmq
from pzq.protocols.phpmq import (
    ACK,
    CONSUME,
    CONTENT,
    COUNT,
    DEAD_LETTER,
    DISPATCH,
    MESSAGE_ID,
    QUEUE,
    REQUEUE,
    SEND,
    TTL,
    Decoder,
    Dialect,
    Message,
    encode,
    encode_dispatch,
    speaks_current,
)

LIMIT = 1 << 20
MID = "d7e7f68761d34838494b233148b5486c"
BMID = MID.encode("ascii")

# The conformance vectors of the spec, verbatim.
ACK_VECTOR = (
    b"H0100402P0100000000000000000000000000003FooP0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
)
CONSUME_VECTOR = b"H0100202P0100000000000000000000000000003FooP04000000000000000000000000000015"
DEAD_LETTER_VECTOR = (
    b"H0100602P0100000000000000000000000000003FooP0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
)
SEND_VECTOR = (
    b"H0100103P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
    b"P05000000000000000000000000000010"
)
DISPATCH_VECTOR = (
    b"H0100304P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
    b"P0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
    b"P05000000000000000000000000000010"
)
REQUEUE_VECTOR = (
    b"H0100503P0100000000000000000000000000003FooP0300000000000000000000000000032"
    b"d7e7f68761d34838494b233148b5486cP05000000000000000000000000000043600"
)
LEGACY_SEND_VECTOR = b"H0100102P0100000000000000000000000000003FooP0200000000000000000000000000011Hello World"
LEGACY_DISPATCH_VECTOR = (
    b"H0100303P0100000000000000000000000000003FooP0200000000000000000000000000011"
    b"Hello WorldP0300000000000000000000000000032d7e7f68761d34838494b233148b5486c"
)

# What a client may send: (vector, the message it decodes to).
CLIENT_VECTORS = [
    (SEND_VECTOR, Message(SEND, {QUEUE: b"Foo", CONTENT: b"Hello World", TTL: b"0"}, 3)),
    (LEGACY_SEND_VECTOR, Message(SEND, {QUEUE: b"Foo", CONTENT: b"Hello World"}, 2)),
    (CONSUME_VECTOR, Message(CONSUME, {QUEUE: b"Foo", COUNT: b"5"}, 2)),
    (ACK_VECTOR, Message(ACK, {QUEUE: b"Foo", MESSAGE_ID: BMID}, 2)),
    (REQUEUE_VECTOR, Message(REQUEUE, {QUEUE: b"Foo", MESSAGE_ID: BMID, TTL: b"3600"}, 3)),
    (DEAD_LETTER_VECTOR, Message(DEAD_LETTER, {QUEUE: b"Foo", MESSAGE_ID: BMID}, 2)),
]
CLIENT_IDS = ["send", "legacy-send", "consume", "ack", "requeue", "dead-letter"]
STREAM = b"".join(vector for vector, _ in CLIENT_VECTORS)
STREAM_MESSAGES = [message for _, message in CLIENT_VECTORS]


def packet_header(packet_type: int, length: int) -> bytes:
    return b"P%02d%029d" % (packet_type, length)


def packet(packet_type: int, content: bytes) -> bytes:
    return packet_header(packet_type, len(content)) + content


def raises_code(data: bytes, max_content: int = LIMIT) -> str:
    with pytest.raises(ProtocolError) as caught:
        Decoder(max_content).feed(data)
    return caught.value.code


# ---------------------------------------------------------------- encoding: the vectors exactly


def test_a_send_with_a_ttl_encodes_to_the_send_vector():
    assert encode(SEND, [(QUEUE, b"Foo"), (CONTENT, b"Hello World"), (TTL, b"0")]) == SEND_VECTOR


def test_a_legacy_send_encodes_to_the_legacy_send_vector():
    assert encode(SEND, [(QUEUE, b"Foo"), (CONTENT, b"Hello World")]) == LEGACY_SEND_VECTOR


def test_a_consume_request_encodes_to_the_consume_vector():
    assert encode(CONSUME, [(QUEUE, b"Foo"), (COUNT, b"5")]) == CONSUME_VECTOR


def test_an_ack_encodes_to_the_ack_vector():
    assert encode(ACK, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID)]) == ACK_VECTOR


def test_a_requeue_encodes_to_the_requeue_vector():
    assert encode(REQUEUE, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID), (TTL, b"3600")]) == REQUEUE_VECTOR


def test_a_dead_letter_encodes_to_the_dead_letter_vector():
    assert encode(DEAD_LETTER, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID)]) == DEAD_LETTER_VECTOR


def test_a_current_dialect_dispatch_encodes_to_the_dispatch_vector():
    assert encode_dispatch("Foo", b"Hello World", MID, 0, Dialect.CURRENT) == DISPATCH_VECTOR


def test_a_current_dialect_dispatch_without_a_ttl_says_zero():
    assert encode_dispatch("Foo", b"Hello World", MID, None, Dialect.CURRENT) == DISPATCH_VECTOR


def test_a_current_dialect_dispatch_carries_the_remaining_ttl_in_decimal():
    assert encode_dispatch("Foo", b"Hello World", MID, 3300, Dialect.CURRENT) == (
        DISPATCH_VECTOR[:-33] + b"P05000000000000000000000000000043300"
    )


def test_a_legacy_dialect_dispatch_encodes_to_the_legacy_dispatch_vector():
    assert encode_dispatch("Foo", b"Hello World", MID, 0, Dialect.LEGACY) == LEGACY_DISPATCH_VECTOR


def test_a_legacy_dialect_dispatch_leaves_out_the_ttl_whatever_it_is():
    assert encode_dispatch("Foo", b"Hello World", MID, 3300, Dialect.LEGACY) == LEGACY_DISPATCH_VECTOR
    assert encode_dispatch("Foo", b"Hello World", MID, None, Dialect.LEGACY) == LEGACY_DISPATCH_VECTOR


def test_an_encoded_dispatch_is_the_generic_encoding_of_its_packets():
    assert (
        encode(DISPATCH, [(QUEUE, b"Foo"), (CONTENT, b"Hello World"), (MESSAGE_ID, BMID), (TTL, b"0")])
        == DISPATCH_VECTOR
    )
    assert encode(DISPATCH, [(QUEUE, b"Foo"), (CONTENT, b"Hello World"), (MESSAGE_ID, BMID)]) == LEGACY_DISPATCH_VECTOR


def test_a_dispatch_keeps_a_non_ascii_queue_name_as_utf8_bytes():
    wire = encode_dispatch("Fö", b"x", MID, None, Dialect.LEGACY)
    assert wire[8 : 8 + 32 + 3] == packet_header(QUEUE, 3) + "Fö".encode()


@pytest.mark.parametrize(
    "msg_type, count, header",
    [
        (1, 3, b"H0100103"),
        (2, 2, b"H0100202"),
        (3, 4, b"H0100304"),
        (4, 2, b"H0100402"),
        (5, 3, b"H0100503"),
        (6, 2, b"H0100602"),
    ],
)
def test_message_headers_match_the_spec_vectors(msg_type, count, header):
    wire = encode(msg_type, [(QUEUE, b"")] * count)
    assert wire[:8] == header
    assert len(wire) == 8 + 32 * count


@pytest.mark.parametrize(
    "packet_type, length, header",
    [
        (1, 3, b"P0100000000000000000000000000003"),
        (2, 11, b"P0200000000000000000000000000011"),
        (3, 32, b"P0300000000000000000000000000032"),
        (5, 4, b"P0500000000000000000000000000004"),
    ],
)
def test_packet_headers_match_the_spec_vectors(packet_type, length, header):
    content = bytes(range(length))
    wire = encode(SEND, [(packet_type, content)])
    assert wire[8:40] == header
    assert len(header) == 32
    assert wire[40:] == content


def test_an_encoding_keeps_the_packets_in_the_order_given():
    assert encode(SEND, [(TTL, b"7"), (CONTENT, b"c"), (QUEUE, b"q")]) == (
        b"H0100103" + packet(TTL, b"7") + packet(CONTENT, b"c") + packet(QUEUE, b"q")
    )


# ---------------------------------------------------------------- decoding: the vectors exactly


@pytest.mark.parametrize("vector, message", CLIENT_VECTORS, ids=CLIENT_IDS)
def test_each_client_vector_decodes_to_exactly_one_message(vector, message):
    decoder = Decoder(LIMIT)
    assert decoder.feed(vector) == [message]
    assert decoder.buffered == 0


@pytest.mark.parametrize("vector, message", CLIENT_VECTORS, ids=CLIENT_IDS)
def test_each_client_vector_has_the_right_type_packets_and_count(vector, message):
    [decoded] = Decoder(LIMIT).feed(vector)
    assert decoded.type == message.type
    assert decoded.packets == message.packets
    assert decoded.packet_count == message.packet_count
    assert decoded.queue == "Foo"


def test_the_numbers_of_the_vectors_read_as_integers():
    [send] = Decoder(LIMIT).feed(SEND_VECTOR)
    [consume] = Decoder(LIMIT).feed(CONSUME_VECTOR)
    [requeue] = Decoder(LIMIT).feed(REQUEUE_VECTOR)
    [legacy_send] = Decoder(LIMIT).feed(LEGACY_SEND_VECTOR)
    assert send.number(TTL) == 0
    assert consume.number(COUNT) == 5
    assert requeue.number(TTL) == 3600
    assert legacy_send.number(TTL) == 0
    assert legacy_send.number(TTL, default=-1) == -1


@pytest.mark.parametrize("vector", [DISPATCH_VECTOR, LEGACY_DISPATCH_VECTOR], ids=["current", "legacy"])
def test_a_dispatch_from_a_client_is_a_protocol_error(vector):
    assert raises_code(vector) == "bad-type"


def test_a_dispatch_from_a_client_is_refused_from_its_header_alone():
    with pytest.raises(ProtocolError) as caught:
        Decoder(LIMIT).feed(b"H0100303")
    assert caught.value.code == "bad-type"


def test_packets_in_any_order_decode_to_the_same_message():
    wire = b"H0100103" + packet(TTL, b"0") + packet(CONTENT, b"Hello World") + packet(QUEUE, b"Foo")
    assert Decoder(LIMIT).feed(wire) == [CLIENT_VECTORS[0][1]]


# ---------------------------------------------------------------- round trips


def _random_contents() -> list[bytes]:
    rng = random.Random(20180101)
    contents = [
        b"",
        b"\x00",
        b"\xff",
        b"\x00" * 100,
        b"\xff" * 100,
        bytes(range(256)),
        b"H0100103P0100000000000000000000000000003Foo",  # looks like a message: it is content
        b"P" * 32,
        "Grüße ☃".encode(),
    ]
    contents += [rng.randbytes(rng.randrange(1, 2000)) for _ in range(20)]
    contents.append(rng.randbytes(LIMIT))  # as big as the decoder allows
    return contents


CONTENTS = _random_contents()


@pytest.mark.parametrize("index", range(len(CONTENTS)))
def test_a_send_of_any_binary_content_survives_a_round_trip(index):
    content = CONTENTS[index]
    wire = encode(SEND, [(QUEUE, b"q"), (CONTENT, content), (TTL, b"60")])
    assert len(wire) == 8 + 3 * 32 + 1 + len(content) + 2
    assert Decoder(LIMIT).feed(wire) == [Message(SEND, {QUEUE: b"q", CONTENT: content, TTL: b"60"}, 3)]


def test_every_message_type_survives_a_round_trip_with_binary_packets():
    rng = random.Random(7)
    queue = b"q\x00\xff" + rng.randbytes(50)
    mid = rng.randbytes(32)
    messages = [
        Message(SEND, {QUEUE: queue, CONTENT: rng.randbytes(300)}, 2),
        Message(SEND, {QUEUE: queue, CONTENT: b"", TTL: b"1"}, 3),
        Message(CONSUME, {QUEUE: queue, COUNT: b"100"}, 2),
        Message(ACK, {QUEUE: queue, MESSAGE_ID: mid}, 2),
        Message(REQUEUE, {QUEUE: queue, MESSAGE_ID: mid}, 2),
        Message(REQUEUE, {QUEUE: queue, MESSAGE_ID: mid, TTL: b"86400"}, 3),
        Message(DEAD_LETTER, {QUEUE: queue, MESSAGE_ID: b""}, 2),
    ]
    wire = b"".join(encode(m.type, list(m.packets.items())) for m in messages)
    assert Decoder(LIMIT).feed(wire) == messages


def test_a_non_utf8_queue_name_round_trips_through_the_queue_property():
    [message] = Decoder(LIMIT).feed(encode(ACK, [(QUEUE, b"q\xff"), (MESSAGE_ID, BMID)]))
    assert message.queue == "q\udcff"
    assert message.queue.encode("utf-8", "surrogateescape") == b"q\xff"


def test_a_content_of_exactly_max_content_bytes_is_accepted():
    wire = encode(SEND, [(QUEUE, b"q"), (CONTENT, b"x" * 100)])
    assert Decoder(100).feed(wire) == [Message(SEND, {QUEUE: b"q", CONTENT: b"x" * 100}, 2)]


# ---------------------------------------------------------------- fragmentation


def test_the_whole_stream_fed_at_once_decodes_every_client_vector_in_order():
    decoder = Decoder(LIMIT)
    assert decoder.feed(STREAM) == STREAM_MESSAGES
    assert decoder.buffered == 0


def test_a_stream_fed_one_byte_at_a_time_decodes_the_same_messages():
    decoder = Decoder(LIMIT)
    out = []
    for i in range(len(STREAM)):
        out += decoder.feed(STREAM[i : i + 1])
    assert out == STREAM_MESSAGES
    assert decoder.buffered == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 42, 1234, 99999])
def test_a_stream_fed_in_random_chunks_decodes_the_same_messages(seed):
    rng = random.Random(seed)
    decoder = Decoder(LIMIT)
    out, pos = [], 0
    while pos < len(STREAM):
        size = rng.randint(0, 80)  # empty chunks included
        out += decoder.feed(STREAM[pos : pos + size])
        pos += size
    assert out == STREAM_MESSAGES
    assert decoder.buffered == 0


def test_a_message_split_at_every_possible_point_decodes_the_same():
    for vector, message in CLIENT_VECTORS:
        for cut in range(len(vector) + 1):
            decoder = Decoder(LIMIT)
            assert decoder.feed(vector[:cut]) + decoder.feed(vector[cut:]) == [message]


def test_a_big_message_written_in_1024_byte_slices_decodes_once_complete():
    content = random.Random(5).randbytes(100_000)
    wire = encode(SEND, [(QUEUE, b"big"), (CONTENT, content)]) + ACK_VECTOR
    decoder = Decoder(LIMIT)
    out = []
    for pos in range(0, len(wire), 1024):
        got = decoder.feed(wire[pos : pos + 1024])
        if pos + 1024 < len(wire) - len(ACK_VECTOR):
            assert got == []
        out += got
    assert out == [Message(SEND, {QUEUE: b"big", CONTENT: content}, 2), CLIENT_VECTORS[3][1]]


@pytest.mark.parametrize("vector, message", CLIENT_VECTORS, ids=CLIENT_IDS)
def test_partial_input_yields_nothing_until_the_last_byte(vector, message):
    decoder = Decoder(LIMIT)
    for i in range(len(vector) - 1):
        assert decoder.feed(vector[i : i + 1]) == []
    assert decoder.feed(vector[-1:]) == [message]
    assert decoder.buffered == 0


def test_an_empty_feed_yields_nothing_and_holds_nothing():
    decoder = Decoder(LIMIT)
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0


def test_a_partial_header_is_held_in_the_buffer():
    decoder = Decoder(LIMIT)
    for n in range(1, 8):
        assert decoder.feed(ACK_VECTOR[n - 1 : n]) == []
        assert decoder.buffered == n


def test_a_message_missing_its_last_bytes_is_held_whole_in_the_buffer():
    decoder = Decoder(LIMIT)
    assert decoder.feed(ACK_VECTOR[:-5]) == []
    assert decoder.buffered == len(ACK_VECTOR) - 5


def test_bytes_after_a_whole_message_stay_buffered_for_the_next_one():
    decoder = Decoder(LIMIT)
    assert decoder.feed(ACK_VECTOR + CONSUME_VECTOR[:5]) == [CLIENT_VECTORS[3][1]]
    assert decoder.buffered == 5
    assert decoder.feed(CONSUME_VECTOR[5:]) == [CLIENT_VECTORS[2][1]]
    assert decoder.buffered == 0


def test_buffered_counts_every_byte_of_an_incomplete_message():
    decoder = Decoder(LIMIT)
    for n in range(1, len(ACK_VECTOR)):
        assert decoder.feed(ACK_VECTOR[n - 1 : n]) == []
        assert decoder.buffered == n


def test_decoded_messages_do_not_share_their_packets():
    decoder = Decoder(LIMIT)
    first, second = decoder.feed(ACK_VECTOR + DEAD_LETTER_VECTOR)
    assert first.packets is not second.packets
    assert first == CLIENT_VECTORS[3][1]
    assert second == CLIENT_VECTORS[5][1]


# ---------------------------------------------------------------- garbage


def test_a_bad_first_byte_raises_at_once_without_waiting_for_a_header():
    decoder = Decoder(LIMIT)
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"X")
    assert caught.value.code == "bad-header"


def test_a_garbage_header_raises_a_bad_header():
    assert raises_code(b"XXXXXXXX") == "bad-header"


def test_a_text_protocol_line_raises_at_its_first_byte():
    assert raises_code(b"GET / HTTP/1.1\r\n") == "bad-header"
    assert raises_code(b"G") == "bad-header"


def test_a_wrong_version_raises_as_soon_as_its_digits_are_seen():
    decoder = Decoder(LIMIT)
    assert decoder.feed(b"H") == []
    assert decoder.feed(b"0") == []
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"2")
    assert caught.value.code == "bad-header"


@pytest.mark.parametrize("header", [b"H0200202", b"H0000202", b"H1100202", b"h0100202"])
def test_a_wrong_version_or_marker_raises_a_bad_header(header):
    assert raises_code(header + CONSUME_VECTOR[8:]) == "bad-header"


@pytest.mark.parametrize(
    "header",
    [
        b"H01abc02",
        b"H0100a02",
        b"H01 0202",
        b"H01-0102",
        b"H01+0202",
        b"H010020x",
        b"H01002 2",
        b"H01002-2",
        b"H01002\x0002",
    ],
)
def test_a_non_digit_type_or_count_raises_a_bad_header(header):
    assert raises_code(header) == "bad-header"


@pytest.mark.parametrize("header", [b"H0100002", b"H0100702", b"H0199902", b"H0101002"])
def test_an_unknown_message_type_raises_a_bad_type(header):
    assert raises_code(header) == "bad-type"


@pytest.mark.parametrize(
    "header",
    [
        b"H0100403",
        b"H0100401",
        b"H0100400",
        b"H0100101",
        b"H0100104",
        b"H0100203",
        b"H0100201",
        b"H0100504",
        b"H0100501",
        b"H0100603",
        b"H0100699",
    ],
)
def test_a_packet_count_the_type_cannot_have_raises_a_bad_count(header):
    assert raises_code(header) == "bad-count"


def test_an_ack_with_three_packets_raises_a_bad_count():
    wire = b"H0100403" + packet(QUEUE, b"Foo") + packet(MESSAGE_ID, BMID) + packet(TTL, b"1")
    assert raises_code(wire) == "bad-count"


@pytest.mark.parametrize(
    "bad",
    [
        b"Q0100000000000000000000000000003",
        b"p0100000000000000000000000000003",
        b"P0x00000000000000000000000000003",
        b"P010000000000000000000000000000x",
        b"P01-0000000000000000000000000003",
        b"P01 0000000000000000000000000003",
        b"P01000000000000000000000000003\r\n",
    ],
)
def test_a_bad_packet_header_raises_a_bad_packet(bad):
    assert len(bad) == 32
    assert raises_code(b"H0100202" + bad + b"Foo") == "bad-packet"


def test_a_garbage_packet_header_is_refused_once_its_32_bytes_are_there():
    decoder = Decoder(LIMIT)
    assert decoder.feed(b"H0100202") == []
    with pytest.raises(ProtocolError):
        decoder.feed(b"X" * 32)


def test_a_bad_packet_header_raises_the_same_code_whatever_the_chunking():
    decoder = Decoder(LIMIT)
    assert decoder.feed(b"H0100202") == []
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"X")
    assert caught.value.code == "bad-packet"


@pytest.mark.parametrize("packet_type", [0, 6, 7, 42, 99])
def test_an_unknown_packet_type_raises_a_bad_packet(packet_type):
    assert raises_code(b"H0100202" + packet(packet_type, b"x")) == "bad-packet"


def test_a_duplicate_packet_type_raises_a_duplicate_packet():
    assert raises_code(b"H0100202" + packet(QUEUE, b"Foo") + packet(QUEUE, b"Bar")) == "duplicate-packet"
    assert (
        raises_code(b"H0100103" + packet(QUEUE, b"Foo") + packet(CONTENT, b"a") + packet(CONTENT, b"b"))
        == "duplicate-packet"
    )


def test_a_content_length_over_max_content_raises_from_the_packet_header_alone():
    decoder = Decoder(100)
    assert decoder.feed(b"H0100102" + packet(QUEUE, b"q")) == []
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(packet_header(CONTENT, 101))  # not one byte of the content has arrived
    assert caught.value.code == "too-large"


def test_an_absurd_content_length_raises_too_large():
    assert raises_code(b"H0100102P02" + b"9" * 29, max_content=LIMIT) == "too-large"


@pytest.mark.parametrize(
    "msg_type, packets",
    [
        (SEND, [(QUEUE, b"Foo"), (TTL, b"0")]),
        (SEND, [(CONTENT, b"x"), (TTL, b"0")]),
        (SEND, [(QUEUE, b"Foo"), (CONTENT, b"x"), (COUNT, b"1")]),
        (CONSUME, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID)]),
        (CONSUME, [(QUEUE, b"Foo"), (TTL, b"5")]),
        (ACK, [(QUEUE, b"Foo"), (CONTENT, BMID)]),
        (ACK, [(MESSAGE_ID, BMID), (COUNT, b"1")]),
        (REQUEUE, [(QUEUE, b"Foo"), (TTL, b"5")]),
        (REQUEUE, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID), (CONTENT, b"x")]),
        (DEAD_LETTER, [(MESSAGE_ID, BMID), (TTL, b"0")]),
    ],
)
def test_missing_required_or_foreign_packets_raise_bad_packets(msg_type, packets):
    assert raises_code(encode(msg_type, packets)) == "bad-packets"


@pytest.mark.parametrize(
    "msg_type, packets",
    [
        (SEND, [(QUEUE, b""), (CONTENT, b"x")]),
        (SEND, [(QUEUE, b""), (CONTENT, b"x"), (TTL, b"0")]),
        (CONSUME, [(QUEUE, b""), (COUNT, b"1")]),
        (ACK, [(QUEUE, b""), (MESSAGE_ID, BMID)]),
        (REQUEUE, [(QUEUE, b""), (MESSAGE_ID, BMID), (TTL, b"1")]),
        (DEAD_LETTER, [(QUEUE, b""), (MESSAGE_ID, BMID)]),
    ],
)
def test_an_empty_queue_name_raises_bad_queue(msg_type, packets):
    assert raises_code(encode(msg_type, packets)) == "bad-queue"


def test_garbage_after_good_messages_raises_without_losing_their_order():
    decoder = Decoder(LIMIT)
    assert decoder.feed(ACK_VECTOR) == [CLIENT_VECTORS[3][1]]
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(b"Z")
    assert caught.value.code == "bad-header"


def test_a_protocol_error_carries_its_code_and_detail():
    with pytest.raises(ProtocolError) as caught:
        Decoder(LIMIT).feed(b"H0100702")
    error = caught.value
    assert error.code == "bad-type"
    assert str(error) == f"bad-type: {error.detail}"
    assert "007" in error.detail


# ---------------------------------------------------------------- Message.number


def _with(raw: bytes) -> Message:
    return Message(CONSUME, {QUEUE: b"q", COUNT: raw}, 2)


@pytest.mark.parametrize(
    "raw, value", [(b"0", 0), (b"5", 5), (b"0005", 5), (b"3600", 3600), (b"9" * 18, 999_999_999_999_999_999)]
)
def test_a_decimal_packet_reads_as_its_number(raw, value):
    assert _with(raw).number(COUNT) == value


@pytest.mark.parametrize(
    "raw", [b"abc", b"-1", b"+1", b"1.5", b" 5", b"5 ", b"5\n", b"0x10", b"1e3", b"\xd9\xa3", "٣".encode(), b"\x00"]
)
def test_a_non_decimal_packet_raises_bad_number(raw):
    with pytest.raises(ProtocolError) as caught:
        _with(raw).number(COUNT)
    assert caught.value.code == "bad-number"


@pytest.mark.parametrize("raw", [b"1" * 19, b"0" * 19, b"9" * 1000])
def test_an_absurdly_long_number_raises_bad_number(raw):
    with pytest.raises(ProtocolError) as caught:
        _with(raw).number(COUNT)
    assert caught.value.code == "bad-number"


def test_a_missing_or_empty_number_packet_gives_the_default():
    assert _with(b"").number(COUNT) == 0
    assert _with(b"").number(COUNT, default=7) == 7
    assert _with(b"1").number(TTL) == 0
    assert _with(b"1").number(TTL, default=9) == 9


def test_a_bad_number_in_a_decoded_message_raises_only_when_read():
    [message] = Decoder(LIMIT).feed(encode(CONSUME, [(QUEUE, b"Foo"), (COUNT, b"five")]))
    assert message.packets[COUNT] == b"five"
    with pytest.raises(ProtocolError) as caught:
        message.number(COUNT)
    assert caught.value.code == "bad-number"


# ---------------------------------------------------------------- the dialect rule


@pytest.mark.parametrize(
    "vector, current",
    [
        (SEND_VECTOR, True),
        (REQUEUE_VECTOR, True),
        (DEAD_LETTER_VECTOR, True),
        (LEGACY_SEND_VECTOR, False),
        (CONSUME_VECTOR, False),
        (ACK_VECTOR, False),
    ],
    ids=["3-packet-send", "requeue", "dead-letter", "2-packet-send", "consume", "ack"],
)
def test_speaks_current_follows_the_vectors(vector, current):
    [message] = Decoder(LIMIT).feed(vector)
    assert speaks_current(message) is current


def test_a_requeue_without_a_ttl_packet_is_accepted_as_never_expiring():
    [message] = Decoder(LIMIT).feed(encode(REQUEUE, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID)]))
    assert message == Message(REQUEUE, {QUEUE: b"Foo", MESSAGE_ID: BMID}, 2)
    assert message.number(TTL) == 0


def test_any_requeue_or_dead_letter_speaks_current_whatever_its_packet_count():
    requeue = Decoder(LIMIT).feed(encode(REQUEUE, [(QUEUE, b"Foo"), (MESSAGE_ID, BMID)]))[0]
    assert requeue.packet_count == 2
    assert speaks_current(requeue) is True
    assert speaks_current(Message(DEAD_LETTER, {QUEUE: b"Foo", MESSAGE_ID: BMID}, 2)) is True


def test_a_send_speaks_current_by_its_packet_count_not_its_ttl_value():
    assert speaks_current(Message(SEND, {QUEUE: b"q", CONTENT: b"c", TTL: b"0"}, 3)) is True
    assert speaks_current(Message(SEND, {QUEUE: b"q", CONTENT: b"c"}, 2)) is False


def test_the_dialect_names_match_the_setting_values():
    assert Dialect("legacy") is Dialect.LEGACY
    assert Dialect("current") is Dialect.CURRENT
    assert phpmq.HEADER_SIZE == 8
    assert phpmq.PACKET_HEADER_SIZE == 32


def test_whole_messages_before_garbage_in_one_read_are_returned_then_the_garbage_raises():
    decoder = phpmq.Decoder(1 << 20)
    good = phpmq.encode(phpmq.SEND, [(phpmq.QUEUE, b"q"), (phpmq.CONTENT, b"before the garbage")])
    [message] = decoder.feed(good + b"GARBAGE!")
    assert message.packets[phpmq.CONTENT] == b"before the garbage"
    assert decoder.broken is not None and decoder.broken.fatal
    with pytest.raises(ProtocolError):
        decoder.feed(b"")


@pytest.mark.parametrize("seed", range(6))
def test_a_big_packet_split_anyhow_decodes_to_its_bytes_counted_as_held_until_whole(seed):
    rng = random.Random(seed)
    body = rng.randbytes(phpmq.BIG_PACKET * 3 + rng.randrange(1000))  # (gathered in a buffer of its own)
    stream = encode(SEND, [(QUEUE, b"q"), (CONTENT, body), (TTL, b"9")]) + ACK_VECTOR
    decoder, got, fed = Decoder(len(body)), [], 0
    while fed < len(stream):
        size = rng.choice([1, 7, 31, 32, 33, 8192, 100_000])
        got += decoder.feed(stream[fed : fed + size])
        fed = min(fed + size, len(stream))
        if not got:
            assert decoder.buffered == fed, "every byte of the incomplete message is counted"
    assert [m.type for m in got] == [SEND, ACK] and decoder.buffered == 0
    assert bytes(got[0].packets[CONTENT]) == body and got[0].number(TTL) == 9


def test_a_big_packet_is_handed_on_without_a_copy_of_the_stream():
    body = b"\x07" * (phpmq.BIG_PACKET + 1)
    decoder = Decoder(len(body))
    [message] = decoder.feed(encode(SEND, [(QUEUE, b"q"), (CONTENT, body)]))
    content = message.packets[CONTENT]
    assert isinstance(content, bytearray) and content == body  # (its own buffer: the store writes from it)
    assert isinstance(message.packets[QUEUE], bytes)


def test_a_duplicate_big_packet_is_refused_from_its_header_before_it_is_gathered():
    header = encode(SEND, [(QUEUE, b"q"), (QUEUE, b"x" * phpmq.BIG_PACKET)])[: 8 + 32 + 1 + 32]
    with pytest.raises(ProtocolError) as info:
        Decoder(1 << 20).feed(header)
    assert info.value.code == "duplicate-packet"
