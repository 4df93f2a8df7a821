"""The store contract, on a real LMDB environment in tmp_path."""

from __future__ import annotations

import msgpack
import pytest

from pzq.errors import StoreError, StoreFull
from pzq.store import DeadLetter, Message, Store, message_id, parse_message_id
from pzq.store.groups import LeaseRecords
from pzq.store.runs import native_record
from pzq.store.schedules import Schedules


@pytest.fixture
def reopen():
    """reopen(store) -> the same directory opened again after a clean close; closed after the test."""
    opened: list[Store] = []

    def _reopen(old: Store) -> Store:
        old.close()
        new = Store(old.path, max_size=old.max_size)
        opened.append(new)
        return new

    yield _reopen
    for s in opened:
        s.close()


def bodies(store: Store, queue: str) -> list[list[bytes]]:
    return [m.frames for m in store.scan(queue, limit=1000)]


def test_messages_are_scanned_in_the_order_they_were_put(store):
    for body in (b"a", b"b", b"c"):
        store.put("q", [body], now_us=1)
        store.put("other", [body.upper()], now_us=1)
    assert bodies(store, "q") == [[b"a"], [b"b"], [b"c"]]
    assert bodies(store, "other") == [[b"A"], [b"B"], [b"C"]]
    assert [m.frames for m in store.scan("q", from_seq=2, limit=1)] == [[b"b"]]
    assert store.scan("missing") == []


def test_each_queue_numbers_its_messages_upward_and_never_reuses_a_seq(store, reopen):
    assert [store.put("q", [b"x"], now_us=1).seq for _ in range(3)] == [1, 2, 3]
    assert store.put("other", [b"y"], now_us=1).seq == 1
    for seq in (1, 2, 3):
        assert store.delete("q", seq) is True
    store = reopen(store)
    assert store.put("q", [b"z"], now_us=1).seq == 4


def test_queue_ids_are_never_reused_after_a_reopen(store, reopen):
    assert store.queue("first").qid == 1
    assert store.queue("second").qid == 2
    store = reopen(store)
    assert store.queue("first", create=False).qid == 1
    assert store.queue("third").qid == 3
    assert store.queue_by_id(2).name == "second"


def test_a_queue_name_must_be_1_to_255_bytes(store):
    with pytest.raises(StoreError):
        store.queue("")
    with pytest.raises(StoreError):
        store.queue("x" * 256)
    assert store.queue("x" * 255).qid == 1


def test_a_stored_message_reads_back_exactly_and_deletes_once(store):
    put = store.put("q", [b"head", b"", b"\x00\xff"], now_us=123, expires_us=456)
    assert store.get("q", put.seq) == Message("q", 1, 1, [b"head", b"", b"\x00\xff"], 123, 456, 0)
    assert store.delete("q", put.seq) is True
    assert store.get("q", put.seq) is None
    assert store.delete("q", put.seq) is False
    assert store.delete("missing", 1) is False
    assert store.queue("q").count == 0
    assert store.queue("q").bytes == 0


def test_count_and_bytes_are_right_straight_after_a_reopen(store, reopen):
    for body in (b"one", b"two", b"three"):
        store.put("q", [body], now_us=1)
    store.delete("q", 2)
    before = store.queue("q").bytes
    assert before > 0
    store = reopen(store)
    info = store.queue("q", create=False)
    assert (info.count, info.bytes, info.next_seq) == (2, before, 4)
    assert store.stored_bytes == before


def test_delivery_counts_are_durable_across_a_reopen(store, reopen):
    store.put("q", [b"a"], now_us=1)
    assert store.mark_delivered("q", 1) == 1
    assert store.mark_delivered("q", 1) == 2
    store = reopen(store)
    assert store.get("q", 1).deliveries == 2
    assert store.scan("q")[0].deliveries == 2
    assert store.unmark_delivered("q", 1) == 1
    assert store.unmark_delivered("q", 1) == 0
    assert store.unmark_delivered("q", 1) == 0
    assert store.get("q", 1).deliveries == 0


def test_a_dead_letter_leaves_the_queue_and_is_kept_with_its_reason(store, reopen):
    store.put("q", [b"a"], now_us=10, expires_us=20)
    store.put("q", [b"b"], now_us=11)
    store.mark_delivered("q", 1)
    message = store.get("q", 1)
    assert store.dead_letters.add(message, "max-deliveries", now_us=99) is True
    assert store.dead_letters.add(message, "max-deliveries", now_us=99) is False
    assert bodies(store, "q") == [[b"b"]]
    store = reopen(store)
    info = store.queue("q", create=False)
    assert (info.count, info.dead_count) == (1, 1)
    assert info.dead_bytes > 0
    assert store.dead_letters.read("q") == [DeadLetter(Message("q", 1, 1, [b"a"], 10, 20, 1), "max-deliveries", 99)]


def test_requeue_dead_by_seq_moves_only_that_letter_to_the_end_with_no_deliveries(store):
    for body in (b"a", b"b", b"c"):
        store.put("q", [body], now_us=1)
    for seq in (1, 3):
        store.mark_delivered("q", seq)
        store.dead_letters.add(store.get("q", seq), "expired", now_us=5)
    assert store.dead_letters.requeue("q", 2) == []
    moved = store.dead_letters.requeue("q", 3)
    assert [(m.seq, m.frames, m.deliveries) for m in moved] == [(4, [b"c"], 0)]
    assert store.get("q", 4).deliveries == 0
    assert bodies(store, "q") == [[b"b"], [b"c"]]
    assert [d.message.seq for d in store.dead_letters.read("q")] == [1]
    assert store.queue("q").dead_count == 1


def test_requeue_dead_without_a_seq_moves_every_letter_back_oldest_first(store):
    for body in (b"a", b"b"):
        message = store.put("q", [body], now_us=1)
        store.dead_letters.add(message, "client", now_us=2)
    moved = store.dead_letters.requeue("q")
    assert [(m.seq, m.frames) for m in moved] == [(3, [b"a"]), (4, [b"b"])]
    assert store.dead_letters.read("q") == []
    info = store.queue("q")
    assert (info.count, info.dead_count, info.dead_bytes) == (2, 0, 0)
    assert store.dead_letters.requeue("missing") == []


def test_requeue_at_end_moves_a_message_behind_the_others_keeping_its_deliveries(store):
    store.put("q", [b"a"], now_us=7)
    store.put("q", [b"b"], now_us=8)
    store.mark_delivered("q", 1)
    moved = store.requeue_at_end(store.get("q", 1), expires_us=900)
    assert (moved.seq, moved.deliveries, moved.enqueued_us, moved.expires_us) == (3, 1, 7, 900)
    assert store.get("q", 3) == Message("q", 1, 3, [b"a"], 7, 900, 1)
    assert bodies(store, "q") == [[b"b"], [b"a"]]
    assert store.queue("q").count == 2
    with pytest.raises(StoreError):
        store.requeue_at_end(Message("q", 1, 1, [b"a"], 7))


def test_a_put_past_the_size_limit_raises_store_full_and_changes_nothing(tmp_path, reopen):
    store = Store(tmp_path / "small", max_size=1000)
    puts = 0
    with pytest.raises(StoreFull):
        while True:
            store.put("q", [b"x" * 100], now_us=1)
            puts += 1
    assert puts >= 5
    store.commit()
    syncs, size = store.syncs, store.queue("q").bytes
    with pytest.raises(StoreFull):
        store.put("q", [b"y" * 100], now_us=2)
    assert (store.queue("q").count, store.queue("q").bytes) == (puts, size)
    assert store.commit() is False
    assert store.syncs == syncs
    store = reopen(store)
    assert bodies(store, "q") == [[b"x" * 100]] * puts
    assert store.queue("q", create=False).bytes == size
    store.delete("q", 1)
    assert store.put("q", [b"y" * 100], now_us=3).seq == puts + 1


def test_side_records_count_toward_the_store_limit_and_new_ones_are_refused_past_it(tmp_path, reopen):
    store = Store(tmp_path / "small", max_size=64 << 10)
    added = 0
    with pytest.raises(StoreFull):
        while True:
            Schedules(store).put_raw(b"k%d" % added, b"v" * 1000)
            added += 1
    assert 30 <= added < 64
    with pytest.raises(StoreFull):  # the records left no room for messages either
        store.put("q", [b"x" * 1000], now_us=1)
    Schedules(store).put_raw(b"k0", b"w" * 2000)  # a replacement is always written
    LeaseRecords(store).put_raw(b"lease", b"1")  # so are records that let consumers drain
    store.commit()
    store = reopen(store)
    assert store.stored_bytes > 60 << 10  # counted again after a restart (LMDB's page statistics)
    with pytest.raises(StoreFull):
        Schedules(store).put_raw(b"new", b"v")
    for i in range(added):
        Schedules(store).delete_raw(b"k%d" % i)
    store.put("q", [b"x" * 1000], now_us=1)


def test_a_put_refused_as_full_does_not_create_a_new_queue(tmp_path):
    store = Store(tmp_path / "small", max_size=1000)
    store.put("q", [b"x" * 600], now_us=1)
    store.commit()
    with pytest.raises(StoreFull):
        store.put("fresh", [b"y" * 600], now_us=1)
    try:
        assert store.queue("fresh", create=False) is None
        assert store.commit() is False
    finally:
        store.close()


def test_abort_drops_uncommitted_writes_and_restores_the_counters(store):
    store.put("q", [b"kept"], now_us=1)
    store.commit()
    info = store.queue("q")
    committed = (info.count, info.bytes, info.next_seq)
    store.put("q", [b"dropped"], now_us=2)
    store.mark_delivered("q", 1)
    store.delete("q", 1)
    store.queue("new")
    store.abort()
    info = store.queue("q", create=False)
    assert (info.count, info.bytes, info.next_seq) == committed
    assert store.get("q", 1) == Message("q", 1, 1, [b"kept"], 1, 0, 0)
    assert store.queue("new", create=False) is None
    assert store.put("q", [b"next"], now_us=3).seq == 2


def test_commit_reports_and_counts_only_commits_that_wrote_something(store):
    assert store.commit() is False
    store.put("q", [b"a"], now_us=1)
    assert store.commit() is True
    assert store.syncs == 1
    assert store.commit() is False
    store.scan("q")
    store.get("q", 1)
    store.delete("q", 99)
    assert store.commit() is False
    store.mark_delivered("q", 1)
    assert store.commit() is True
    assert store.syncs == 2


def test_a_message_id_is_32_hex_digits_that_parse_back_to_queue_and_seq(store):
    assert message_id(1, 2) == "00000000000000010000000000000002"
    assert message_id(2**64 - 1, 255) == "f" * 16 + "00000000000000ff"
    assert store.put("q", [b"a"], now_us=1).id == message_id(1, 1)
    for qid, seq in ((1, 2), (2**64 - 1, 2**64 - 1), (0, 0)):
        assert parse_message_id(message_id(qid, seq)) == (qid, seq)
        assert parse_message_id(message_id(qid, seq).encode()) == (qid, seq)


@pytest.mark.parametrize("bad", ["", "0" * 31, "0" * 33, "g" * 32, "0" * 16 + "z" * 16, b"\xff" * 32])
def test_a_malformed_message_id_does_not_parse(bad):
    assert parse_message_id(bad) is None


@pytest.mark.parametrize(
    "bad",
    [
        "0000000000000001-000000000000001",
        "0000000000000001+000000000000001",
        "0000000000000001 000000000000001",
        "00000000000000010x00000000000001",
        "00000000000000010000_00000000001",
    ],
)
def test_a_message_id_with_non_hex_characters_does_not_parse(bad):
    assert parse_message_id(bad) is None


def test_a_write_that_finds_its_key_already_stored_is_a_store_error_and_rolls_back(store):
    import msgpack

    from pzq.store.layout import KEY as _KEY

    store.put("q", [b"first"], now_us=1)
    store.commit()
    info = store.queue("q")
    # What a second writer on the same file would have done: stored the next seq behind our back.
    txn = store.env.write()  # (committed below without the store's knowledge, as another process would)
    txn.put(_KEY.pack(info.qid, info.next_seq), msgpack.packb([5, 0, [b"someone else's"]]), db=store._messages_db)
    store.env.commit()
    store.put("other", [b"in the same turn"], now_us=2)
    with pytest.raises(StoreError, match="already stored"):
        store.put("q", [b"second"], now_us=3)
    assert store.queue("other", create=False) is None, "the whole turn was rolled back"
    assert store.queue("q").count == 1
    assert [m.frames for m in store.scan("q")] == [[b"first"], [b"someone else's"]]  # not overwritten


def test_a_new_queue_past_max_queues_is_refused_as_full_and_existing_ones_still_work(tmp_path):
    store = Store(tmp_path / "db", max_size=16 << 20, max_queues=3)  # "default" is not made here
    try:
        for name in ("a", "b", "c"):
            store.put(name, [b"x"], now_us=1)
        with pytest.raises(StoreFull, match="--max-queues"):
            store.put("d", [b"x"], now_us=1)
        store.put("a", [b"more"], now_us=1)
        assert store.queue("d", create=False) is None and store.queue("a").count == 2
    finally:
        store.close()


def test_an_unreadable_message_record_is_set_aside_and_the_queue_goes_on(tmp_path):
    from pzq.store.layout import KEY as _KEY

    store = Store(tmp_path / "db", max_size=16 << 20)
    try:
        for i in range(5):
            store.put("q", [b"m%d" % i], now_us=1)
        store.commit()
        qid = store.queue("q").qid
        txn = store.env.write()  # what a damaged page or a bug leaves behind
        txn.put(_KEY.pack(qid, 2), b"\xc1 not msgpack", db=store._messages_db)
        txn.put(_KEY.pack(qid, 3), msgpack.packb({"not": "a record"}), db=store._messages_db)
        store.env.commit()
        assert [m.frames for m in store.scan("q", 0, 2)] == [[b"m0"], [b"m3"]]
        assert store.get("q", 2) is None and store.damaged_total == 2
        store.commit()
        assert (store.queue("q").count, [k for k, _ in store.previews.damaged()]) == (
            3,
            [_KEY.pack(qid, 2), _KEY.pack(qid, 3)],
        )
    finally:
        store.close()
    reopened = Store(tmp_path / "db", max_size=16 << 20)
    try:
        assert [m.frames for m in reopened.scan("q")] == [[b"m0"], [b"m3"], [b"m4"]]
    finally:
        reopened.close()


def test_put_many_stores_in_order_what_fits_and_refuses_the_rest(tmp_path):
    store = Store(tmp_path / "small", max_size=64 << 10)
    try:
        stored = store.put_many("q", [[b"m%05d" % i + b"x" * 1000] for i in range(100)], now_us=7)
        assert 30 < stored < 100, "the store limit cut the batch"
        assert [m.frames[0][:6] for m in store.scan("q", 0, 200)] == [b"m%05d" % i for i in range(stored)]
        assert store.queue("q").count == stored and store.put_many("q", [[b"y" * 1000]], now_us=8) == 0
        store.commit()
        assert store.put_many("other", [], now_us=9) == 0 and store.queue("other", create=False) is None
    finally:
        store.close()


def test_put_many_after_another_writer_took_the_next_seq_fails_the_turn(tmp_path):
    from pzq.store.layout import KEY as _KEY

    store = Store(tmp_path / "db", max_size=16 << 20)
    try:
        store.put("q", [b"first"], now_us=1)
        store.commit()
        info = store.queue("q")
        txn = store.env.write()  # (committed without the store's knowledge, as another process would)
        txn.put(
            _KEY.pack(info.qid, info.next_seq + 1), msgpack.packb([5, 0, [b"someone else's"]]), db=store._messages_db
        )
        store.env.commit()
        with pytest.raises(StoreError, match="already stored"):
            store.put_many("q", [[b"a"], [b"b"], [b"c"]], now_us=2)
        assert [m.frames for m in store.scan("q")] == [[b"first"], [b"someone else's"]]
    finally:
        store.close()


def test_a_preview_gives_the_start_of_each_body_its_size_and_a_dead_letters_reason(store):
    big = [b"a" * 3000, b"b" * 3000]
    store.put("q", big, now_us=5)
    store.put("q", [b"small"], now_us=6)
    letter = store.put("q", [b"\xff" * 10], now_us=7)
    store.dead_letters.add(letter, "expired", now_us=8)
    store.commit()
    first, second = store.previews.first("q", 50, 1024)
    assert (first.body_head, first.body_size, first.enqueued_us) == (b"a" * 1024, 6000, 5)
    assert (second.body_head, second.body_size, second.id) == (b"small", 5, store.scan("q", 0, 2)[1].id)
    (dead,) = store.previews.first("q", 50, 4, dead=True)
    assert (dead.body_head, dead.body_size, dead.reason, dead.id) == (b"\xff" * 4, 10, "expired", letter.id)
    assert len(store.previews.first("q", 1, 1024)) == 1 and store.previews.first("nosuch", 5, 10) == []


@pytest.mark.parametrize(
    "body",
    [[b"x" * (1 << 20)], [b"a", b"b" * ((1 << 20) + 5), b"", b"c" * 300, b"d" * 70_000], [b"z" * 70_000] * 17, [b"s"]],
)
def test_a_big_native_record_joined_from_its_frames_is_msgpacks_bytes_to_the_byte(body):
    for now_us in (0, 5, 1_764_190_000_000_000, 2**63 - 1):
        assert native_record(now_us, body) == msgpack.packb([now_us, 0, body])


@pytest.mark.parametrize("frames", [[5], ["text"], [b"ok", 5], [b"ok", None], [[b"nested"]]])
def test_a_record_whose_frames_are_not_all_bytes_is_set_aside(tmp_path, frames):
    from pzq.store.layout import KEY as _KEY

    store = Store(tmp_path / "db", max_size=16 << 20)
    try:
        for body in (b"before", b"damaged", b"after"):
            store.put("q", [body], now_us=1)
        damaged = store.scan("q")[1]
        txn = store.env.write()
        txn.put(_KEY.pack(damaged.qid, damaged.seq), msgpack.packb([1, 0, frames]), db=store._messages_db)
        assert [m.frames for m in store.scan("q")] == [[b"before"], [b"after"]]
        assert store.damaged_total == 1 and store.queue("q").count == 2
    finally:
        store.close()
