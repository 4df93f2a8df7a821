"""Durable leases per consumer group, on a real LMDB store (no sockets: the rules themselves)."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits
from pzq.errors import ProtocolError
from pzq.leases import Leases
from pzq.store import Store

T0 = 1_800_000_000_000_000  # wall-clock µs


# A call's 10 ms budget makes its range shorter on a busy machine: these tests count messages, so they
# lift it (the budget has its own test).
NO_TIME_BUDGET = Limits(lease_call_budget_s=60.0)


def _open(path, timeout_s: float = 60.0, **limits) -> tuple[Store, Broker, Leases]:
    store = Store(path, max_size=64 << 20)
    broker = Broker(store, ack_timeout_s=5.0)
    return store, broker, Leases(broker, timeout_s=timeout_s, limits=dataclasses.replace(NO_TIME_BUDGET, **limits))


@pytest.fixture
def leased(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    for i in range(10):
        broker.produce("q", [b"m%d" % i], now_us=T0)
    store.commit()
    yield store, broker, leases
    store.close()


def bodies(fetched) -> list[bytes]:
    return [b"".join(m.frames) for _, m in fetched[0]]


def test_a_lease_numbers_the_next_messages_from_zero_and_fetch_returns_them_in_queue_order(leased):
    store, broker, leases = leased
    assert leases.lease("q", "g", 0, 4, now=Now(0, T0)) == (0, 4)
    fetched = leases.fetch("q", "g", 0, 4, now_us=T0)
    assert bodies(fetched) == [b"m0", b"m1", b"m2", b"m3"]
    assert [lseq for lseq, _ in fetched[0]] == [0, 1, 2, 3]
    assert [m.deliveries for _, m in fetched[0]] == [1, 1, 1, 1]


def test_leasing_again_from_the_same_offset_returns_the_same_range_and_takes_nothing_more(leased):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 4, now=Now(0, T0))
    assert leases.lease("q", "g", 0, 4, now=Now(0, T0)) == (0, 4)
    assert leases.lease("q", "g", 0, 2, now=Now(0, T0)) == (0, 2)
    assert broker.stats()["messages_inflight"] == 4


def test_leased_messages_are_not_handed_to_any_other_consumer(leased):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 4, now=Now(0, T0))
    taken = broker.take("q", 100, "native", now=Now(0, T0))
    assert [b"".join(m.frames) for m in taken] == [b"m%d" % i for i in range(4, 10)]
    assert leases.lease("q", "other", 0, 5, now=Now(0, T0)) == (0, 0)


def test_fetch_is_read_only_and_replays_identically(leased):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 6, now=Now(0, T0))
    store.commit()
    first = leases.fetch("q", "g", 2, 6, now_us=T0)
    again = leases.fetch("q", "g", 2, 6, now_us=T0)
    assert [(lseq, m.id, m.frames, m.deliveries) for lseq, m in first[0]] == [
        (lseq, m.id, m.frames, m.deliveries) for lseq, m in again[0]
    ]
    assert store.queue("q").count == 10


def test_ack_upto_deletes_the_messages_below_and_is_idempotent(leased):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 6, now=Now(0, T0))
    assert leases.ack_upto("q", "g", 4, now_us=T0) == 4
    assert leases.ack_upto("q", "g", 4, now_us=T0) == 4
    assert leases.ack_upto("q", "g", 2, now_us=T0) == 4
    store.commit()
    assert store.queue("q").count == 6
    assert leases.offsets("q", "g") == (4, 6)
    assert leases.fetch("q", "g", 0, 6, now_us=T0)[1] == 4  # the acknowledged part is reported gone


def test_a_reader_that_starts_below_the_base_reads_on_from_the_base(leased):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 3, now=Now(0, T0))
    leases.ack_upto("q", "g", 3, now_us=T0)
    assert leases.lease("q", "g", 0, 3, now=Now(0, T0)) == (3, 6)


@pytest.mark.parametrize(
    "call",
    [
        lambda leases: leases.lease("q", "g", 7, 1, now=Now(0, T0)),  # past what was ever leased
        lambda leases: leases.lease("q", "g", 0, -1, now=Now(0, T0)),
        lambda leases: leases.fetch("q", "g", 0, 5, now_us=T0),  # past the leases
        lambda leases: leases.fetch("q", "g", 3, 2, now_us=T0),
        lambda leases: leases.ack_upto("q", "g", 5, now_us=T0),
    ],
)
def test_offsets_outside_the_leases_are_refused_with_a_protocol_error(leased, call):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 4, now=Now(0, T0))
    with pytest.raises(ProtocolError):
        call(leases)


def test_leases_survive_a_restart_and_stay_away_from_other_consumers(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    for i in range(5):
        broker.produce("q", [b"m%d" % i], now_us=T0)
    leases.lease("q", "g", 0, 3, now=Now(0, T0))
    before = [(lseq, m.id, m.deliveries) for lseq, m in leases.fetch("q", "g", 0, 3, now_us=T0)[0]]
    store.close()

    store, broker, leases = _open(tmp_path / "db")
    try:
        assert leases.offsets("q", "g") == (0, 3)
        after = [(lseq, m.id, m.deliveries) for lseq, m in leases.fetch("q", "g", 0, 3, now_us=T0)[0]]
        assert after == before
        taken = broker.take("q", 100, "native", now=Now(0, T0))
        assert [b"".join(m.frames) for m in taken] == [b"m3", b"m4"]
    finally:
        store.close()


def test_an_idle_group_expires_and_its_messages_go_back_with_the_delivery_count_raised(tmp_path):
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    try:
        for i in range(3):
            broker.produce("q", [b"m%d" % i], now_us=T0)
        leases.lease("q", "g", 0, 3, now=Now(0, T0))
        assert leases.expire(T0 + 9_000_000) == 0
        leases.fetch("q", "g", 0, 1, now_us=T0 + 9_000_000)  # any call keeps the group alive
        assert leases.expire(T0 + 18_000_000) == 0
        assert leases.expire(T0 + 20_000_000) == 3
        assert leases.offsets("q", "g") == (3, 3)
        assert leases.fetch("q", "g", 0, 3, now_us=T0)[1] == 3
        taken = broker.take("q", 10, "native", now=Now(0, T0))
        assert [(b"".join(m.frames), m.deliveries) for m in taken] == [(b"m0", 2), (b"m1", 2), (b"m2", 2)]
    finally:
        store.close()


def test_an_expiry_is_durable_and_so_is_the_deadline_of_a_group_after_a_restart(tmp_path):
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    broker.produce("q", [b"m0"], now_us=T0)
    leases.lease("q", "g", 0, 1, now=Now(0, T0))
    store.close()
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    try:
        assert leases.expire(T0 + 11_000_000) == 1
        store.commit()
        assert [b"".join(m.frames) for m in broker.take("q", 10, "x", now=Now(0, T0))] == [b"m0"]
    finally:
        store.close()


@pytest.mark.parametrize(
    "meddle",
    [
        lambda b, ref: b.ack(ref, by="native"),  # a late ack from the consumer that had it before
        lambda b, ref: b.nack(ref, by="native"),
        lambda b, ref: b.requeue_at_end(ref, by=("phpmq", b"c")),  # PHPMQ REQUEUE naming its id
        lambda b, ref: b.dead_letter(ref, "by a client", by=("phpmq", b"c"), now_us=T0),
    ],
)
def test_no_other_client_can_settle_a_leased_message(leased, meddle):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 3, now=Now(0, T0))
    first = leases.fetch("q", "g", 0, 3, now_us=T0)
    ref = (first[0][0][1].qid, first[0][0][1].seq)
    assert meddle(broker, ref) is False
    again = leases.fetch("q", "g", 0, 3, now_us=T0)
    assert [(lseq, m.id) for lseq, m in again[0]] == [(lseq, m.id) for lseq, m in first[0]]
    assert [b"".join(m.frames) for m in broker.take("q", 100, "native", now=Now(0, T0))][0] == b"m3"


def test_after_a_restart_ready_messages_behind_many_leased_ones_are_handed_out_at_once(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    for i in range(3000):
        broker.produce("q", [b"m%d" % i], now_us=T0)
    leases.lease("q", "g", 0, 2500, now=Now(0, T0))
    store.close()
    store, broker, leases = _open(tmp_path / "db")
    try:
        taken = broker.take("q", 1000, "native", now=Now(0, T0))
        assert len(taken) == 500 and b"".join(taken[0].frames) == b"m2500"
    finally:
        store.close()


def test_a_fetch_stops_after_max_bytes_and_says_where(leased):
    store, broker, leases = leased
    leases.lease("q", "g", 0, 10, now=Now(0, T0))
    messages, gone, upto = leases.fetch("q", "g", 0, 10, now_us=T0, max_bytes=5)
    assert [lseq for lseq, _ in messages] == [0, 1, 2] and gone == 0 and upto == 3


def test_one_lease_call_takes_at_most_max_lease_messages_and_the_next_goes_on(tmp_path):
    store, broker, leases = _open(tmp_path / "db", max_lease=4)
    try:
        for i in range(10):
            broker.produce("q", [b"m%d" % i], now_us=T0)
        assert leases.lease("q", "g", 0, 1_000_000, now=Now(0, T0)) == (0, 4)
        assert leases.lease("q", "g", 4, 1_000_000, now=Now(0, T0)) == (0, 8)
    finally:
        store.close()


def test_a_group_record_claiming_a_vast_lease_range_costs_only_the_leases_it_has(tmp_path):
    # A damaged (or forged) group record saying leases 0 .. 10**12 exist: expiry and acknowledgement
    # walk the lease records there are, not the range (a loop over it would hold the server for hours).
    from pzq.store.groups import Groups, LeaseRecords

    store, broker, leases = _open(tmp_path / "db")
    message = broker.produce("q", [b"m"], now_us=1)
    Groups(store).put((message.qid, "g"), [1, 0, 10**12, 0])
    # (the record as pzq 0.1.0 wrote it: one message, seq u64 | deliveries u32)
    LeaseRecords(store).put_raw(LeaseRecords(store).key((1, 5)), struct.pack(">QI", message.seq, 0))
    store.commit()
    store.close()
    store, broker, leases = _open(tmp_path / "db")
    try:
        assert broker.ready_count("q") == 0, "held by the group's one lease"
        assert leases.expire(now_us=10**15) == 1 and broker.ready_count("q") == 1
        assert LeaseRecords(store).raw() == []
    finally:
        store.close()


def test_a_lease_of_a_fresh_queue_is_one_record_and_one_held_range_however_many_messages(tmp_path):
    from pzq.store.groups import LeaseRecords

    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(3000)], now_us=T0)
        assert leases.lease("q", "g", 0, 3000, now=Now(0, T0)) == (0, 3000)
        assert len(LeaseRecords(store).raw()) == 1
        held = broker.held_ranges(store.queue("q").qid)
        assert held is not None and len(held) == 1 and held.count == 3000
        assert broker.stats()["messages_inflight"] == 3000 and broker.ready_count("q") == 0
    finally:
        store.close()


def test_messages_another_consumer_holds_split_a_lease_into_runs_and_each_fetches_right(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(10)], now_us=T0)
        native = broker.take("q", 3, "native", now=Now(0, T0))  # m0 m1 m2
        broker.nack((native[1].qid, native[1].seq), by="native")  # m1 is ready again, delivered once
        assert leases.lease("q", "g", 0, 5, now=Now(0, T0)) == (0, 5)
        fetched = leases.fetch("q", "g", 0, 5, now_us=T0)[0]
        assert [(lseq, b"".join(m.frames), m.deliveries) for lseq, m in fetched] == [
            (0, b"m1", 2),
            (1, b"m3", 1),
            (2, b"m4", 1),
            (3, b"m5", 1),
            (4, b"m6", 1),
        ]
        assert [b"".join(m.frames) for _, m in leases.fetch("q", "g", 2, 4, now_us=T0)[0]] == [b"m4", b"m5"]
        assert broker.ack((native[0].qid, native[0].seq), by="native")  # the native consumer's own: fine
    finally:
        store.close()


def test_a_big_acknowledgement_is_durable_at_once_and_deleted_a_share_per_turn(tmp_path):
    store, broker, leases = _open(tmp_path / "db", lease_work_per_turn=100)
    broker.produce_many("q", [[b"m%d" % i] for i in range(1000)], now_us=T0)
    leases.lease("q", "g", 0, 1000, now=Now(0, T0))
    assert leases.ack_upto("q", "g", 1000, now_us=T0) == 1000
    assert store.queue("q").count == 900 and leases.pending
    assert leases.fetch("q", "g", 0, 1000, now_us=T0)[1] == 1000, "acknowledged: all gone at once"
    store.commit()
    store.close()  # a restart before the rest is deleted: the base says they are acknowledged

    store, broker, leases = _open(tmp_path / "db", lease_work_per_turn=100)
    try:
        assert leases.pending and broker.ready_count("q") == 0, "held until deleted, never handed out"
        for _ in range(9):  # the 900 left, 100 a turn
            leases.work(T0, budget=100)
        assert store.queue("q").count == 0
        leases.work(T0, budget=100)
        assert not leases.pending
        assert broker.take("q", 10, "native", now=Now(0, T0)) == []
    finally:
        store.close()


def test_an_expired_group_of_many_runs_goes_back_over_several_turns_lowest_first(tmp_path):
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(50)], now_us=T0)
        leases.lease("q", "g", 0, 50, now=Now(0, T0))
        leases.ack_upto("q", "g", 10, now_us=T0)
        assert leases.expire(T0 + 60_000_000) == 40
        assert leases.offsets("q", "g") == (50, 50)
        taken = broker.take("q", 100, "native", now=Now(0, T0))
        assert [(b"".join(m.frames), m.deliveries) for m in taken] == [(b"m%d" % i, 2) for i in range(10, 50)]
    finally:
        store.close()


def test_an_expiry_share_per_turn_returns_the_lowest_leases_and_moves_the_base(tmp_path):
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(30)], now_us=T0)
        leases.lease("q", "g", 0, 30, now=Now(0, T0))
        leases._expiring.add(("q", "g"))
        assert leases.work(T0 + 60_000_000, budget=12) == 12
        assert leases.offsets("q", "g") == (12, 30)
        assert [b"".join(m.frames) for m in broker.take("q", 100, "x", now=Now(0, T0))] == [
            b"m%d" % i for i in range(12)
        ]
        assert leases.fetch("q", "g", 12, 14, now_us=T0 + 60_000_000)[0][0][1].frames == [b"m12"]
    finally:
        store.close()


def test_an_unreadable_message_met_by_a_lease_is_set_aside_and_the_lease_goes_on_past_it(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(5)], now_us=T0)
        info = store.queue("q")
        txn = store.env.write()
        txn.put(struct.pack(">QQ", info.qid, 2), b"\xc1 not msgpack", db=store.env.dbs["messages"])
        assert leases.lease("q", "g", 0, 10, now=Now(0, T0)) == (0, 4)
        assert [b"".join(m.frames) for _, m in leases.fetch("q", "g", 0, 4, now_us=T0)[0]] == [
            b"m0",
            b"m2",
            b"m3",
            b"m4",
        ]
        assert store.damaged_total == 1 and store.queue("q").count == 4
    finally:
        store.close()


def test_a_lease_or_fetch_past_its_time_budget_answers_a_shorter_range_and_the_next_call_goes_on(tmp_path):

    store, broker, leases = _open(tmp_path / "db", lease_call_budget_s=0.0, lease_chunk=3, fetch_chunk=4)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(10)], now_us=T0)
        assert leases.lease("q", "g", 0, 10, now=Now(0, T0)) == (0, 3)
        assert leases.lease("q", "g", 3, 7, now=Now(0, T0)) == (0, 6)
        messages, gone, upto = leases.fetch("q", "g", 0, 6, now_us=T0)
        assert [lseq for lseq, _ in messages] == [0, 1, 2, 3] and gone == 0 and upto == 4
    finally:
        store.close()


def test_leases_that_go_on_from_the_last_run_extend_its_record_but_never_past_an_acknowledged_part(tmp_path):
    from pzq.store.groups import LeaseRecords

    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(30)], now_us=T0)
        for after in (0, 5, 10):
            leases.lease("q", "g", after, 5, now=Now(0, T0))
        assert len(LeaseRecords(store).raw()) == 1
        leases.ack_upto("q", "g", 12, now_us=T0)
        leases.lease("q", "g", 15, 5, now=Now(0, T0))
        assert store.queue("q").count == 18
        fetched = leases.fetch("q", "g", 0, 20, now_us=T0)
        assert [b"".join(m.frames) for _, m in fetched[0]] == [b"m%d" % i for i in range(12, 20)] and fetched[1] == 12
    finally:
        store.close()


def _forge(store, gid: int, lseq: int, run: tuple[int, int, int]) -> None:
    from pzq.store.groups import LeaseRecords

    LeaseRecords(store).put((gid, lseq), run)
    store.commit()


def test_a_forged_run_over_another_groups_leases_is_removed_at_start_and_acknowledges_nothing_of_theirs(tmp_path):
    from pzq.store.groups import Groups

    store, broker, leases = _open(tmp_path / "db")
    broker.produce_many("q", [[b"m%d" % i] for i in range(12)], now_us=T0)
    leases.lease("q", "a", 0, 10, now=Now(0, T0))
    leases.lease("q", "b", 0, 2, now=Now(0, T0))
    qid = store.queue("q").qid
    gid_b = Groups(store).get((qid, "b"))[0]
    first_seq = leases.fetch("q", "a", 0, 1, now_us=T0)[0][0][1].seq
    _forge(store, gid_b, 2, (first_seq, 10, 1))  # b claims a's messages
    Groups(store).put((qid, "b"), [gid_b, 0, 12, T0 + 10**9])
    store.commit()
    store.close()

    store, broker, leases = _open(tmp_path / "db")
    try:
        assert store.unreadable_records == 1
        assert leases.fetch("q", "b", 0, 12, now_us=T0)[1] == 10, "the forged part reads as gone"
        leases.ack_upto("q", "b", 12, now_us=T0)
        assert len(leases.fetch("q", "a", 0, 10, now_us=T0)[0]) == 10 and store.queue("q").count == 10
    finally:
        store.close()


def test_a_run_past_the_queues_end_and_a_second_group_with_one_gid_are_removed_and_nothing_stalls(tmp_path):
    from pzq.store.groups import Groups

    store, broker, leases = _open(tmp_path / "db")
    broker.produce_many("q", [[b"m%d" % i] for i in range(3)], now_us=T0)
    leases.lease("q", "a", 0, 1, now=Now(0, T0))
    qid = store.queue("q").qid
    gid = Groups(store).get((qid, "a"))[0]
    _forge(store, gid, 1, (store.queue("q").next_seq, 2**32 - 1, 1))
    Groups(store).put((qid, "z"), [gid, 0, 1, T0 + 10**9])  # another group with a's gid
    store.commit()
    store.close()

    store, broker, leases = _open(tmp_path / "db")
    try:
        assert store.unreadable_records == 2
        broker.produce("q", [b"late"], now_us=T0)
        assert broker.ready_count("q") == 3 and broker.stats()["messages_inflight"] == 1
        taken = broker.take("q", 10, "native", now=Now(0, T0))
        assert [b"".join(m.frames) for m in taken] == [b"m1", b"m2", b"late"]
        assert leases.offsets("q", "z") == (0, 0)
    finally:
        store.close()


def test_a_group_holds_at_most_max_runs_and_what_it_could_not_hold_stays_ready(tmp_path):
    store, broker, leases = _open(tmp_path / "db", max_runs_per_group=3)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(20)], now_us=T0)
        taken = broker.take("q", 20, "native", now=Now(0, T0))
        for m in taken[1::2]:  # every other message back: a lease of them is one run each
            broker.nack((m.qid, m.seq), by="native")
        assert leases.lease("q", "g", 0, 10, now=Now(0, T0)) == (0, 3)
        assert leases.lease("q", "g", 3, 10, now=Now(0, T0)) == (0, 3), "no room for a fourth run"
        again = broker.take("q", 20, "other", now=Now(0, T0))
        assert [b"".join(m.frames) for m in again] == [b"m7", b"m9", b"m11", b"m13", b"m15", b"m17", b"m19"]
    finally:
        store.close()


def test_an_expirys_raised_delivery_counts_are_durable_with_the_turn_that_returns_them(tmp_path):
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    broker.produce_many("q", [[b"m%d" % i] for i in range(3)], now_us=T0)
    leases.lease("q", "g", 0, 3, now=Now(0, T0))
    store.commit()
    assert leases.expire(T0 + 60_000_000) == 3
    store.commit(counts_older_than=0.0)  # the server's commit: young pending counts wait
    store.close()  # (a SIGKILL here loses nothing that commit made durable)

    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    try:
        assert [m.deliveries for m in broker.take("q", 10, "native", now=Now(0, T0))] == [2, 2, 2]
    finally:
        store.close()


def test_an_acknowledgements_first_share_counts_against_its_turns_share(tmp_path):
    store, broker, leases = _open(tmp_path / "db", lease_work_per_turn=100)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(1000)], now_us=T0)
        leases.lease("q", "g", 0, 1000, now=Now(0, T0))
        leases.ack_upto("q", "g", 1000, now_us=T0)
        leases.work(T0)  # the same turn: its share is spent
        assert store.queue("q").count == 900
        leases.work(T0)
        assert store.queue("q").count == 800
    finally:
        store.close()


def test_at_the_run_limit_a_group_still_leases_what_goes_on_from_its_own_last_run(tmp_path):
    store, broker, leases = _open(tmp_path / "db", max_runs=1)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(20)], now_us=T0)
        assert leases.lease("q", "g", 0, 5, now=Now(0, T0)) == (0, 5)
        assert leases.lease("q", "other", 0, 5, now=Now(0, T0)) == (0, 0), "no room for a second run"
        assert leases.lease("q", "g", 5, 5, now=Now(0, T0)) == (0, 10), "one record, extended"
        assert broker.ready_count("q") == 10
    finally:
        store.close()


def test_a_leased_message_found_unreadable_no_longer_counts_as_held(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(4)], now_us=T0)
        leases.lease("q", "g", 0, 4, now=Now(0, T0))
        info = store.queue("q")
        txn = store.env.write()
        txn.put(struct.pack(">QQ", info.qid, 2), b"\xc1 not msgpack", db=store.env.dbs["messages"])
        assert leases.fetch("q", "g", 0, 4, now_us=T0)[1] == 1
        broker.produce("q", [b"late"], now_us=T0)
        assert broker.has_ready("q") and broker.ready_count("q") == 1
    finally:
        store.close()
