"""Property-based fuzzing of every decoder: whatever bytes arrive, a decoder answers with its result or
its protocol's own error (ProtocolError), never with another exception. The gateways that hold state
(MQKS, API) get the same treatment on a real store."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_protocol_native_batch import AFTER_MARKER, BODIES_FRAMES, decoder_answers, server_answers

from pzq.broker import Broker
from pzq.clock import Now
from pzq.errors import ProtocolError, StoreFull
from pzq.gateways.api import ApiGateway
from pzq.gateways.mqks import MqksGateway
from pzq.leases import Leases
from pzq.protocols import api, emqp, monitor, mqks, mqks_masks, native, phpmq
from pzq.store import Store
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys

# Inputs tried per decoder: 1,000 in every run of the suite (3,000 took about 90 s of CI's two cores,
# the suite's third-dearest module); a deeper run asks for more, and hypothesis keeps what failed in
# .hypothesis/ to try first next time: `PZQ_FUZZ_EXAMPLES=20000 scripts/test tests/test_fuzz_decoders.py`.
EXAMPLES = int(os.environ.get("PZQ_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

frames = st.lists(st.binary(max_size=64), max_size=8)
# Bytes that look like the protocol now and then, so that fuzzing gets past the first check.
mqks_words = st.sampled_from(
    [
        "publish",
        "consume",
        "rebind",
        "ack",
        "reject",
        "delete_consumer",
        "delete_queue",
        "ping",
        "_eval",
        "--confirm",
        "--add",
        "--remove",
        "--remove-mask",
        "--manual-ack",
        "--delete-queue-when-unused=1",
        "--prefetch=2",
        "--all",
        "q1",
        "e1",
        "e.*.x",
        "c1",
        "m1",
        "*",
        "\t",
        "\r",
        "",
    ]
)
mqks_lines = st.lists(st.one_of(mqks_words, st.text(max_size=12)), max_size=8).map(" ".join)
api_commands = st.sampled_from([b"OFFSETS", b"LEASE", b"FETCH", b"ACK_UPTO", b"INFO", b"SNAPSHOT", b"PRODUCE", b"X"])
api_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.booleans(),
    st.none(),
    st.lists(st.lists(st.one_of(st.text(max_size=4), st.binary(max_size=4)), max_size=3), max_size=3),
)
api_args = st.dictionaries(
    st.sampled_from(["queue", "group", "after", "max", "lo", "hi", "upto", "before", "limit", "messages", "key"]),
    api_values,
    max_size=6,
)


@FUZZ
@given(frames, st.integers(min_value=0, max_value=100))
def test_native_produce_frames_never_raise(parts, limit):
    event = native.parse_produce(parts, limit)
    assert event is None or isinstance(event, (native.Produce, native.Rejected))


@FUZZ
@given(frames)
def test_native_consumer_answers_and_message_keys_never_raise(parts):
    native.parse_consumer_ack(parts)
    for part in parts:
        native.key_message_id(part)


@FUZZ
@given(frames)
def test_monitor_requests_never_raise(parts):
    monitor.parse_request(parts)


@FUZZ
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_phpmq_decoder_raises_only_protocol_errors(chunks):
    decoder = phpmq.Decoder(max_content=1024)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
    except ProtocolError:
        pass


@FUZZ
@given(st.lists(st.sampled_from([b"003", b"001", b"000", b"0000001", b"0000002", b"9", b"q", b"\x00"]), max_size=12))
def test_phpmq_decoder_raises_only_protocol_errors_on_near_valid_bytes(pieces):
    try:
        phpmq.Decoder(max_content=64).feed(b"".join(pieces))
    except ProtocolError:
        pass


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from(
                [b"", b"eMQP/1.0", b"REQUEST", b"INFORM", b"READY", b"REPLY", b"HEARTBEAT", b"SCHEDULE", b"KBYE"]
            ),
        ),
        max_size=9,
    )
)
def test_emqp_frames_raise_only_protocol_errors(parts):
    try:
        emqp.parse(parts)
    except ProtocolError:
        pass
    for part in parts:
        text = part.decode("utf-8", "replace")
        emqp.parse_headers(text)
        try:
            emqp.parse_queues(text, ["default"])
        except ProtocolError:
            pass


@FUZZ
@given(st.one_of(st.binary(max_size=120), mqks_lines.map(str.encode)))
def test_mqks_lines_raise_only_protocol_errors(line):
    try:
        mqks.parse_line(line)
    except ProtocolError:
        pass
    mqks.request_id_of(line)


@FUZZ
@given(st.lists(st.binary(max_size=50), max_size=10))
def test_the_mqks_line_buffer_raises_only_protocol_errors(chunks):
    buffer = mqks.LineBuffer(limit=64)
    try:
        for chunk in chunks:
            buffer.feed(chunk)
    except ProtocolError:
        pass


@FUZZ
@given(st.text(max_size=20), st.text(max_size=40))
def test_mqks_masks_never_raise(mask, event):
    mqks.matches(mask, event)


@FUZZ
@given(st.text(alphabet="ab*", max_size=12), st.text(alphabet="ab", max_size=12))
def test_the_mqks_glob_agrees_with_a_regular_expression(pattern, text):
    import re

    expected = re.fullmatch(".*".join(re.escape(piece) for piece in pattern.split("*")), text, re.S) is not None
    assert mqks_masks._glob(pattern, text) is expected


mask_segments = st.sampled_from(["a", "b", "*", "a*", "*b", ""])


@FUZZ
@given(
    st.lists(st.lists(st.sampled_from(["a", "b", "ab", ""]), min_size=1, max_size=4).map(".".join), max_size=12),
    st.lists(st.lists(mask_segments, min_size=1, max_size=4).map(".".join), max_size=4),
)
def test_remove_masked_removes_exactly_what_the_masks_match(events, masks):
    kept = mqks.remove_masked(events, masks)
    assert kept == [e for e in events if not any(mqks.matches(m, e) for m in masks)]


@FUZZ
@given(
    st.one_of(
        frames,
        st.tuples(api_commands, api_args).map(
            lambda c: [b"peer", b"", b"1", c[0], msgpack.packb(c[1], use_bin_type=True)] if _packable(c[1]) else [b"x"]
        ),
    )
)
def test_api_requests_never_raise(parts):
    api.parse_request(parts)
    api.parse_reply(parts)


def _packable(value) -> bool:
    try:
        msgpack.packb(value, use_bin_type=True)
        return True
    except (OverflowError, TypeError, ValueError):
        return False


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("fuzz") / "db", max_size=64 << 20)
    broker = Broker(store, ack_timeout_s=5.0)
    leases = Leases(broker, timeout_s=60)
    yield (
        MqksGateway(broker, Bindings(store), max_line=256, window=10, drop_queue=broker.drop_queue),
        ApiGateway(broker, leases, DedupKeys(store), max_message_size=1024, dedup_window_s=60),
        store,
    )
    store.close()


@FUZZ
@given(lines=st.lists(mqks_lines, max_size=6), conn=st.sampled_from([b"a", b"b"]))
def test_the_mqks_gateway_answers_any_lines_without_raising(gateways, lines, conn):
    gateway, _, store = gateways
    if conn not in gateway.sessions:
        gateway.connected(conn)
    try:
        gateway.received(conn, "\n".join(lines).encode() + b"\n", now=Now(0.0, 1))
    except ProtocolError:
        gateway.disconnected(conn)
    gateway.dispatch(now=Now(0.0, 1))
    if conn == b"b":
        gateway.disconnected(conn)
    store.commit()


@FUZZ
@given(command=api_commands, args=api_args)
def test_the_api_gateway_answers_any_request_without_raising(gateways, command, args):
    _, gateway, store = gateways
    if not _packable(args):
        return
    try:
        reply = gateway.handle([b"peer", b"", b"1", command, msgpack.packb(args, use_bin_type=True)], now=Now(0.0, 1))
    except StoreFull:
        return
    assert reply is not None and reply[3] in (b"OK", b"ERR")
    store.commit()


@FUZZ
@given(BODIES_FRAMES)
def test_the_native_batch_bodies_decoder_answers_messages_or_a_protocol_error(data):
    decoder_answers(data)  # (tests/test_protocol_native_batch.py runs it with fewer examples)


@FUZZ
@given(AFTER_MARKER)
def test_whatever_frames_follow_a_native_batch_marker_the_server_answers_them(rest):
    server_answers(rest)
