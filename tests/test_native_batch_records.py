"""A batch's messages are stored as the bodies frame encodes them (Store.put_encoded), not re-encoded:
the records must read back as the same messages, whatever msgpack headers the producer chose."""

from __future__ import annotations

from test_native_batch_gateway import T0, answers, make

from pzq.clock import Now
from pzq.gateways.native import RECEIVE
from pzq.protocols import native_batch as wire
from pzq.store import Store
from pzq.store.layout import KEY


def records(store: Store, qid: int) -> list[bytes]:
    with store.env.reading() as txn:
        return [bytes(v) for k, v in txn.cursor(db=store._messages_db) if KEY.unpack(k)[0] == qid]


def test_a_batchs_records_are_byte_for_byte_what_the_legacy_path_stores(tmp_path):
    bodies = [[b"a"], [b"x" * 300, b""], [b"y" * 70_000], [b"m%d" % i for i in range(20)]]
    legacy, batched = Store(tmp_path / "legacy", max_size=64 << 20), Store(tmp_path / "batched", max_size=64 << 20)
    try:
        assert legacy.put_many("q", bodies, now_us=T0) == 4
        gateway = make(batched)
        sends = gateway.received_many(RECEIVE, [[b"p", *wire.batch(b"b1", bodies)]], now=Now(0.0, T0))
        assert answers(sends) == [(b"b1", True, 4, "")]
        assert records(batched, batched._queues["q"].qid) == records(legacy, legacy._queues["q"].qid)
        assert batched._queues["q"].bytes == legacy._queues["q"].bytes  # (counted toward the limit alike)
    finally:
        legacy.close()
        batched.close()


def test_wide_msgpack_headers_are_stored_as_sent_and_read_back_as_the_same_messages(store):
    # A batch of 2 in an array32, a message in an array16 of a bin16 and a bin32 (short frames in wide
    # headers: valid msgpack that no encoder we ship writes), then one in the usual shape
    data = (
        b"\xdd\x00\x00\x00\x03"
        + b"\xdc\x00\x02"
        + b"\xc5\x00\x02hi"
        + b"\xc6\x00\x00\x00\x03you"
        + b"\x91\xc4\x01z"
        + b"\x91\xc5\x01\x00"
        + b"w" * 256
    )
    gateway = make(store)
    sends = gateway.received_many(RECEIVE, [[b"p", b"b1", wire.MARK, b"", data]], now=Now(0.0, T0))
    assert answers(sends) == [(b"b1", True, 3, "")]
    assert [m.frames for m in store.scan("q")] == [[b"hi", b"you"], [b"z"], [b"w" * 256]]
    first = store.scan("q")[0].seq
    # (a lease reads them as one run of plain messages: no TTL, no meta, from their first bytes alone)
    assert store.lease_headers("q", 0, 10) == [(first, 3, 0, 0, 0)]
    assert all(m.enqueued_us == T0 and m.deliveries == 0 for m in store.scan("q"))


def test_a_bodies_frame_left_in_libzmqs_buffer_is_stored_the_same(store):
    # (frames of 64 KiB and more reach the gateway as memoryviews: see endpoints/native.py BIG_FRAME)
    bodies = [[b"x" * 40_000], [b"y" * 30_000, b"z"]]
    frames = [b"p", *wire.batch(b"b1", bodies)]
    frames[-1] = memoryview(frames[-1])
    sends = make(store).received_many(RECEIVE, [frames], now=Now(0.0, T0))
    assert answers(sends) == [(b"b1", True, 2, "")]
    assert [m.frames for m in store.scan("q")] == bodies
