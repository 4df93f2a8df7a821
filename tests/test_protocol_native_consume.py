"""Frame vectors of PZQ-BATCH/1, the batched native consumers (docs/native-batch.md), as pure functions:
the bytes the page shows are the bytes the code makes and reads."""

from __future__ import annotations

import msgpack
import pytest

from pzq.errors import ProtocolError
from pzq.protocols import native_consume as wire

KEY = b"0000000000000001|00000000000000010000000000000001"  # 49 bytes, as pzq makes them
KEY_BIN = b"\xc4\x31" + KEY  # msgpack bin 8 of 49 bytes


def test_hello_is_answered_with_the_version_and_a_map_of_limits_byte_for_byte():
    assert wire.hello() == [b"HELLO"]
    assert wire.hello_reply(1000, 100, 1000, 5_000_000, 60_000_000) == [
        b"HELLO",
        b"PZQ-BATCH/1",
        b"\x85\xaamax_credit\xcd\x03\xe8\xa9max_batch\x64\xa8max_keys\xcd\x03\xe8"
        b"\xaeack_timeout_us\xce\x00\x4c\x4b\x40\xa7idle_us\xce\x03\x93\x87\x00",
    ]
    reply = wire.parse_reply(wire.hello_reply(1000, 100, 1000, 5_000_000, 60_000_000))
    assert reply == wire.Limits(1000, 100, 1000, 5_000_000, 60_000_000)


def test_credit_is_a_count_in_ascii_digits():
    assert wire.credit(25) == [b"CREDIT", b"25"]
    assert wire.parse_command([b"CREDIT", b"25"], 10) == wire.Command(b"CREDIT", count=25)
    assert wire.parse_command([b"CREDIT", b"0"], 10) == wire.Command(b"CREDIT", count=0)


@pytest.mark.parametrize("count", [b"-5", b"+5", b"5.0", b"", b" 5", b"\xd9\x95", b"1" * 19, b"\xef\xbc\x95"])
def test_a_credit_that_is_not_plain_ascii_digits_is_refused(count):
    with pytest.raises(ProtocolError) as err:
        wire.parse_command([b"CREDIT", count], 10)
    assert err.value.code == "bad-credit"


def test_a_deliver_carries_the_ack_timeout_the_send_time_and_keys_and_bodies_in_one_order_byte_for_byte():
    frames = wire.deliver(5_000_000, 1_700_000_000_000_000, [KEY], [[b"hi", b"there"]])
    assert frames == [
        b"DELIVER",
        b"5000000",
        b"1700000000000000",
        b"\x91" + KEY_BIN,
        b"\x91\x92\xc4\x02hi\xc4\x05there",
    ]
    assert wire.parse_reply(frames) == wire.Delivered(5_000_000, 1_700_000_000_000_000, [KEY], [[b"hi", b"there"]])


def test_ack_and_nack_carry_one_msgpack_array_of_keys_and_str_keys_read_as_bin():
    assert wire.ack([KEY]) == [b"ACK", b"\x91" + KEY_BIN]
    assert wire.nack([KEY, KEY]) == [b"NACK", b"\x92" + KEY_BIN + KEY_BIN]
    as_str = b"\x91\xd9\x31" + KEY  # a client that packs keys as str
    assert wire.parse_command([b"ACK", as_str], 10) == wire.Command(b"ACK", keys=(KEY,))


def test_settled_says_how_many_and_which_keys_were_refused_byte_for_byte():
    assert wire.settled(2, [b"bad"]) == [b"SETTLED", b"2", b"\x91\xc4\x03bad"]
    assert wire.settled(3, []) == [b"SETTLED", b"3", b"\x90"]
    assert wire.parse_reply([b"SETTLED", b"2", b"\x91\xc4\x03bad"]) == wire.Settled(2, [b"bad"])


def test_bye_and_err_byte_for_byte():
    assert wire.bye() == [b"BYE"]
    assert wire.parse_command([b"BYE"], 10) == wire.Command(b"BYE")
    assert wire.bye_reply(7) == [b"BYE", b"7"]
    assert wire.parse_reply([b"BYE", b"7"]) == 7
    assert wire.error("bad-credit", "CREDIT count must be ASCII digits") == [
        b"ERR",
        b"bad-credit: CREDIT count must be ASCII digits",
    ]
    err = wire.parse_reply([b"ERR", b"hello-first: unknown consumer"])
    assert isinstance(err, ProtocolError) and (err.code, err.detail) == ("hello-first", "unknown consumer")


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([], "bad-frames"),
        ([b"HELLO", b"x"], "bad-frames"),
        ([b"CREDIT"], "bad-frames"),
        ([b"ACK"], "bad-frames"),
        ([b"ACK", b"x", b"y"], "bad-frames"),
        ([b"FETCH"], "unknown-command"),
        ([b"ACK", b"\x81\xa1k\x01"], "bad-keys"),  # a map, not an array
        ([b"ACK", b"\x91\x01"], "bad-keys"),  # an int key
        ([b"ACK", b"\x91\xc4\x00"], "bad-keys"),  # an empty key
        ([b"ACK", b"\x91\xc4\x41" + b"k" * 65], "bad-keys"),  # a key past 64 bytes
        ([b"ACK", b"\x91\xc4\x03bad\x00"], "bad-keys"),  # bytes after the array
        ([b"ACK", b"\x91\x91\xc4\x01k"], "bad-keys"),  # a nested array
        ([b"ACK", b"\x92\xc4\x01k"], "bad-keys"),  # shorter than it says
        ([b"ACK", b""], "bad-keys"),
    ],
)
def test_malformed_commands_are_refused_with_a_code(frames, code):
    with pytest.raises(ProtocolError) as err:
        wire.parse_command(frames, 10)
    assert err.value.code == code


def test_a_command_cut_past_the_frame_cap_is_refused_bad_frames_and_a_peer_cannot_forge_the_cut():
    routing, command = wire.cut([b"peer", b"ACK", *[b"k"] * 1022])
    assert routing == b"peer"
    with pytest.raises(ProtocolError) as err:
        wire.parse_command([command], 10)
    assert err.value.code == "bad-frames" and "more than 1024 frames" in err.value.detail
    with pytest.raises(ProtocolError) as err:
        wire.parse_command([bytes(bytearray(wire.CUT))], 10)  # (the same bytes from a peer: a command it does not know)
    assert err.value.code == "unknown-command"


def test_a_keys_array_announcing_billions_is_refused_from_its_header_before_anything_is_built():
    bomb = b"\xdd\xff\xff\xff\xff"  # array 32 announcing 4,294,967,295 keys, in 5 bytes
    with pytest.raises(ProtocolError) as err:
        wire.parse_command([b"NACK", bomb], 1000)
    assert err.value.code == "too-many-keys"
    with pytest.raises(ProtocolError) as err:
        wire.parse_command([b"ACK", msgpack.packb([KEY] * 11)], 10)
    assert err.value.code == "too-many-keys"


def test_a_reply_that_is_not_pzq_batch_reads_as_none():
    wrong = [b"DELIVER", b"1", b"2", b"\x91\xc4\x01k", b"\x90"]  # (one key, no body)
    for frames in ([b"HELLO", b"PZQ-BATCH/2", b"\x80"], wrong, [b"x"], []):
        assert wire.parse_reply(frames) is None


def test_the_err_texts_of_the_documented_vectors():
    for frames, text in (
        ([b"CREDIT", b"-5"], "bad-credit: CREDIT count must be ASCII digits, not b'-5'"),
        ([b"ACK", b"\xdd\xff\xff\xff\xff"], "too-many-keys: at most 1000 keys at once, not 4294967295"),
    ):
        with pytest.raises(ProtocolError) as err:
            wire.parse_command(frames, 1000)
        assert wire.error(err.value.code, err.value.detail) == [b"ERR", text.encode()]


def test_the_documented_nack_of_a_key_twice_reads_as_both_keys():
    frames = [b"NACK", b"\x92" + KEY_BIN + KEY_BIN]
    assert wire.parse_command(frames, 10) == wire.Command(b"NACK", keys=(KEY, KEY))
    assert wire.settled(0, [KEY, KEY]) == [b"SETTLED", b"0", b"\x92" + KEY_BIN + KEY_BIN]


def test_keys_that_are_not_a_flat_array_of_short_bins_are_refused_whatever_they_hide():
    deep = b"\x91" * 5000 + b"\xc4\x01k"  # (arrays nested 5,000 deep, one key at the bottom)
    long_key = msgpack.packb([b"k" * (wire.MAX_KEY + 1)])
    for data in (
        deep,
        long_key,
        msgpack.packb([KEY, [KEY]]),
        msgpack.packb([KEY, 5]),
        msgpack.packb([KEY, b""]),
        msgpack.packb([KEY, {b"a": 1}]),
        msgpack.packb([KEY]) + b"\x00",
        b"\x92\xc4\x01k",  # (two announced, one there)
    ):
        with pytest.raises(ProtocolError) as err:
            wire.parse_command([b"ACK", data], 1000)
        assert err.value.code == "bad-keys", data[:20]
    assert wire.parse_command([b"ACK", msgpack.packb([KEY, "str-key"])], 1000).keys == (KEY, b"str-key")


def test_an_ack_or_nack_costs_a_record_per_50_bytes_of_its_keys_and_any_other_command_one():
    assert wire.records_of([b"peer", wire.ACK, b"k" * 5_000]) == 100  # (a 49-byte key and its header: ~a key)
    assert wire.records_of([b"peer", wire.NACK, b"k" * 149]) == 2
    assert wire.records_of([b"peer", wire.NACK, b"\x90"]) == 1  # (at least one, even for no key)
    assert wire.records_of([b"peer", wire.CREDIT, b"1000"]) == 1
    assert wire.records_of([b"peer", wire.ACK]) == 1  # (malformed: parse_command refuses it, a record)
    assert wire.records_of([b"peer", wire.ACK, b"k" * 5_000, b"more"]) == 1
