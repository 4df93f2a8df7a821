"""One contract for every side table of the store: what its owner writes is read back as written,
survives a restart only once committed, and a damaged record is skipped, never fatal."""

from __future__ import annotations

import pytest

from pzq.errors import StoreFull
from pzq.store import OWNERS, SideTable, Store
from pzq.store.bindings import Binding, Bindings
from pzq.store.dedup_keys import DedupKeys, Produced
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.groups import Groups, LeaseRecords
from pzq.store.schedules import Schedules

SCHEDULE = {"queue": "jobs", "headers": "", "interval": 60, "payload": '["run", {}]', "remaining": -1, "next_us": 9}
# Two distinct records per table: (key, value) as its owner takes them.
SAMPLES: dict[type[SideTable], list[tuple]] = {
    Schedules: [("a1", SCHEDULE), ("b2", {**SCHEDULE, "interval": 0, "cron": "*/5 * * * *"})],
    Groups: [((1, "spark"), [7, 0, 10, 123]), ((2, "other"), [8, 3, 4, 456, "z85-key"])],
    LeaseRecords: [((7, 0), (11, 1, 1)), ((7, 1), (12, 5, 3))],
    DedupKeys: [("batch-1", Produced(5, 2, [b"d" * 16])), ("batch-2", Produced(6, 1, [b"e" * 16, b"f" * 16]))],
    Bindings: [("orders", Binding(["paid", "shipped"], 30.0, True)), ("logs", Binding(["*"], None, False))],
    EmqpJobs: [((1, 5), ("msg-1", b"worker-a", None)), ((1, 6), ("msg-2", b"worker-b", "z85"))],
}


@pytest.fixture(params=OWNERS, ids=lambda owner: owner.NAME)
def owner(request) -> type[SideTable]:
    return request.param


def open_store(path, max_size: int = 16 << 20) -> Store:
    return Store(path, max_size=max_size)


def test_every_side_table_has_an_owner_with_samples():
    assert set(SAMPLES) == set(OWNERS)
    assert len({owner.NAME for owner in OWNERS}) == len(OWNERS)


def test_what_an_owner_writes_it_reads_back_in_key_order(tmp_path, owner):
    store = open_store(tmp_path / "db")
    try:
        table = owner(store)
        (k1, v1), (k2, v2) = SAMPLES[owner]
        table.put(k2, v2)
        table.put(k1, v1)
        assert table.get(k1) == v1 and table.get(k2) == v2
        assert sorted(table.items(), key=lambda kv: table.key(kv[0])) == table.items()
        assert dict(table.items()) == {k1: v1, k2: v2}
        table.put(k1, v2)  # a replacement
        assert table.get(k1) == v2
        assert table.delete(k1) and not table.delete(k1)
        assert table.get(k1) is None and dict(table.items()) == {k2: v2}
    finally:
        store.close()


def test_a_record_is_on_disk_after_the_commit_and_gone_after_an_abort(tmp_path, owner):
    (k1, v1), (k2, v2) = SAMPLES[owner]
    store = open_store(tmp_path / "db")
    owner(store).put(k1, v1)
    store.commit()
    owner(store).put(k2, v2)
    store.abort()
    assert dict(owner(store).items()) == {k1: v1}
    store.close()
    store = open_store(tmp_path / "db")
    try:
        assert dict(owner(store).items()) == {k1: v1}
    finally:
        store.close()


def test_a_damaged_record_is_skipped_counted_and_reads_as_absent(tmp_path, owner):
    (k1, v1), (k2, _) = SAMPLES[owner]
    store = open_store(tmp_path / "db")
    try:
        table = owner(store)
        table.put(k1, v1)
        table.put_raw(table.key(k2), b"\xc1 not a record")
        assert table.items() == [(k1, v1)] and store.unreadable_records == 1
        assert table.get(k2) is None
        assert table.delete(k2), "a damaged record can still be removed"
    finally:
        store.close()


def test_records_count_toward_the_store_limit_and_only_counted_tables_refuse_new_ones(tmp_path, owner):
    store = open_store(tmp_path / "small", max_size=64 << 10)
    try:
        (k1, v1), (k2, v2) = SAMPLES[owner]
        table = owner(store)
        table.put(k1, v1)
        before = store.stored_bytes
        store.put("q", [b"x" * (store.max_size - before - 110)], now_us=1)  # under 20 bytes of room left
        if owner.COUNTED:
            with pytest.raises(StoreFull):
                table.put(k2, v2)
            assert table.get(k2) is None, "nothing was written"
        else:
            table.put(k2, v2)  # (records that let consumers drain a full store are never refused)
            assert table.get(k2) == v2
        table.put(k1, v2)  # a replacement is always written
        assert table.get(k1) == v2
    finally:
        store.close()


# Records that decode but whose numbers are out of range: each would crash a start-up, wedge a loop or
# fail every turn if it were believed (found by a hostile run: tests/test_damaged_store.py has the server).
OUT_OF_RANGE: list[tuple[type[SideTable], object]] = [
    (Groups, [-1, 0, 0, 0]),
    (Groups, [7, 5, 4, 0]),
    (DedupKeys, [float("inf"), 1, []]),
    (DedupKeys, [float("nan"), 1, []]),
    (Schedules, {**SCHEDULE, "queue": ""}),
    (Schedules, {**SCHEDULE, "queue": "q" * 300}),
    (Schedules, {**SCHEDULE, "interval": (1 << 64) - 1}),
    (Schedules, {**SCHEDULE, "next_us": -5}),
]


@pytest.mark.parametrize("owner, value", OUT_OF_RANGE, ids=lambda v: getattr(v, "NAME", None) or repr(v)[:30])
def test_a_record_with_numbers_out_of_range_is_unreadable_not_believed(tmp_path, owner, value):
    import msgpack

    store = open_store(tmp_path / "db")
    try:
        table = owner(store)
        (k1, v1), (k2, _) = SAMPLES[owner]
        table.put(k1, v1)
        table.put_raw(table.key(k2), msgpack.packb(value))
        assert table.items() == [(k1, v1)] and store.unreadable_records == 1
    finally:
        store.close()


def test_a_schedules_run_record_overrides_its_moving_part_and_a_damaged_one_leaves_the_whole_record(tmp_path):
    import msgpack

    store = open_store(tmp_path / "db")
    try:
        table = Schedules(store)
        table.put("a1", SCHEDULE)
        table.put("b2", SCHEDULE)
        table.ran("a1", 70, 4)
        table.put_raw(b"\0b2", msgpack.packb([-5, 1]))  # out of range: unreadable, not believed
        assert table.get("a1") == {**SCHEDULE, "next_us": 70, "remaining": 4} and table.get("b2") == SCHEDULE
        assert table.all() == {"a1": {**SCHEDULE, "next_us": 70, "remaining": 4}, "b2": SCHEDULE}
        assert store.unreadable_records == 1 and table.payload("a1") == SCHEDULE["payload"]
        table.put("a1", {**SCHEDULE, "next_us": 9})  # a SCHEDULE again: its runs start afresh
        assert table.get("a1") == {**SCHEDULE, "next_us": 9} and table.get_raw(b"\0a1") is None
        assert table.delete("b2") and table.raw() == [(b"a1", table.pack({**SCHEDULE, "next_us": 9}))]
    finally:
        store.close()
