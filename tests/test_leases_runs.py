"""A lease reads plain messages a run at a time (store/runs.py ``lease_headers``) and an acknowledged
range is deleted in one walk (``delete_range``): the same messages, counts and dead letters as a
message-by-message read, on a real LMDB store."""

from __future__ import annotations

import dataclasses
import struct

import msgpack

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits
from pzq.leases import Leases
from pzq.store import Store

T0 = 1_800_000_000_000_000  # wall-clock µs
NO_TIME_BUDGET = Limits(lease_call_budget_s=60.0)  # (these tests count messages: see test_leases.py)


def _open(path, max_deliveries: int = 0, timeout_s: float = 60.0) -> tuple[Store, Broker, Leases]:
    store = Store(path, max_size=64 << 20)
    broker = Broker(store, ack_timeout_s=5.0, max_deliveries=max_deliveries)
    return store, broker, Leases(broker, timeout_s=timeout_s, limits=dataclasses.replace(NO_TIME_BUDGET))


def _fetched(leases: Leases, hi: int, now_us: int = T0) -> list[tuple[bytes, int]]:
    return [(b"".join(m.frames), m.deliveries) for _, m in leases.fetch("q", "g", 0, hi, now_us=now_us)[0]]


def _reference(store: Store, queue: str) -> list[tuple[int, int, int, int]]:
    """(seq, expires_us, cap, deliveries) of every stored message, each record read whole."""
    out = []
    for m in store.scan(queue, 0, 10_000):
        cap = (m.meta or {}).get("max_deliveries") or 0
        out.append((m.seq, m.expires_us, cap, m.deliveries))
    return out


def _expanded(entries) -> list[tuple[int, int, int, int]]:
    return [(seq + i, exp, cap, deliveries) for seq, count, exp, cap, deliveries in entries for i in range(count)]


def test_a_lease_walk_reads_what_a_whole_record_read_does_with_plain_runs_as_one_entry(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"p%d" % i] for i in range(6)], now_us=T0)
        broker.produce("q", [b"ttl"], now_us=T0, expires_us=T0 + 10**9)
        broker.produce("q", [b"cap"], now_us=T0, meta={"max_deliveries": 3})
        broker.produce("q", [b"a", b"b"], now_us=0)  # (a small enqueued time: another int width)
        broker.produce_many("q", [[b"r%d" % i] for i in range(3)], now_us=T0)
        first = store.queue("q").next_seq - 12
        store.delete("q", first + 3)  # a gap in the first run
        store.set_delivered("q", [first + 1, first + 2, first + 10], 2)  # counts in the deliveries table
        store.commit()
        entries = store.lease_headers("q", 0, 100)
        assert _expanded(entries) == _reference(store, "q")
        assert [(seq - first, count) for seq, count, *_ in entries] == [
            (0, 1),
            (1, 2),  # delivered twice: a run of its own
            (4, 2),  # after the gap
            (6, 1),  # the TTL
            (7, 1),  # the meta (its cap)
            (8, 2),  # plain again, with a small enqueued time
            (10, 1),  # delivered twice
            (11, 1),
        ]
        assert _expanded(store.lease_headers("q", first + 5, 3)) == _reference(store, "q")[4:7]
    finally:
        store.close()


def test_a_lease_over_mixed_messages_dead_letters_the_expired_and_capped_and_leases_the_rest_in_runs(tmp_path):
    store, broker, leases = _open(tmp_path / "db", max_deliveries=3)
    try:
        broker.produce_many("q", [[b"p%d" % i] for i in range(4)], now_us=T0)
        broker.produce("q", [b"expired"], now_us=T0, expires_us=T0 + 5)
        broker.produce("q", [b"capped"], now_us=T0, meta={"max_deliveries": 1})
        broker.produce_many("q", [[b"q%d" % i] for i in range(3)], now_us=T0)
        first = store.queue("q").next_seq - 9
        store.set_delivered("q", [first + 5], 1)  # the capped one was delivered once already
        store.set_delivered("q", [first + 7, first + 8], 3)  # at the server's --max-deliveries
        store.commit()
        assert leases.lease("q", "g", 0, 100, now=Now(0, T0 + 10)) == (0, 5)
        assert _fetched(leases, 5, T0 + 10) == [(b"p0", 1), (b"p1", 1), (b"p2", 1), (b"p3", 1), (b"q0", 1)]
        dead = [(b"".join(d.message.frames), d.reason) for d in store.dead_letters.read("q")]
        capped = "max-deliveries"
        assert dead == [(b"expired", "expired"), (b"capped", capped), (b"q1", capped), (b"q2", capped)]
        assert leases.groups[("q", "g")].runs == 2  # p0..p3 and q0: the dead letters between split them
    finally:
        store.close()


def test_a_run_skips_what_a_native_consumer_still_holds_after_a_rollback(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(6)], now_us=T0)
        store.commit()
        broker.redo_on_rollback("native")
        broker.turn_begins()
        taken = broker.take("q", 2, "native", now=Now(0, T0))  # m0 m1, kept in flight over a rollback
        store.commit()
        broker.committed()
        broker.turn_begins()  # a turn whose commit fails: readiness is found again, the cursor walks m0 m1
        store.abort()
        broker.rolled_back()
        assert leases.lease("q", "g", 0, 100, now=Now(0, T0)) == (0, 4)
        assert _fetched(leases, 4) == [(b"m2", 1), (b"m3", 1), (b"m4", 1), (b"m5", 1)]
        assert [b"".join(m.frames) for m in taken] == [b"m0", b"m1"]
    finally:
        store.close()


def test_a_record_damaged_past_its_first_bytes_is_leased_then_set_aside_by_the_fetch_and_reads_as_gone(tmp_path):
    store, broker, leases = _open(tmp_path / "db")
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(4)], now_us=T0)
        info = store.queue("q")
        seq = info.next_seq - 3
        plain_start = b"\x93" + msgpack.packb(T0) + b"\x00\x91"  # looks plain; its frame is not bytes
        store.env.write().put(struct.pack(">QQ", info.qid, seq), plain_start + b"\xc3", db=store.env.dbs["messages"])
        assert leases.lease("q", "g", 0, 10, now=Now(0, T0)) == (0, 4)
        messages, gone, end = leases.fetch("q", "g", 0, 4, now_us=T0)
        assert [b"".join(m.frames) for _, m in messages] == [b"m0", b"m2", b"m3"] and gone == 1 and end == 4
        assert store.damaged_total == 1 and store.queue("q").count == 3
        assert leases.ack_upto("q", "g", 4, now_us=T0) == 4
        while leases.pending:
            leases.work(T0)
        assert store.queue("q").count == 0 and broker.stats()["messages_inflight"] == 0
    finally:
        store.close()


def test_an_acknowledged_range_is_deleted_with_its_delivery_counts_and_its_bytes_accounted_exactly(tmp_path):
    store, broker, leases = _open(tmp_path / "db", timeout_s=10)
    try:
        broker.produce_many("q", [[b"m%d" % i] for i in range(8)], now_us=T0)
        broker.produce("q", [b"ttl"], now_us=T0, expires_us=T0 + 10**12)
        store.commit()
        before = store.queue("q").bytes
        leases.lease("q", "g", 0, 4, now=Now(0, T0))
        assert leases.expire(T0 + 20_000_000) == 4  # back with a written count of 1
        store.commit()
        counts = store.env.dbs["deliveries"]
        with store.env.reading() as txn:
            assert txn.stat(counts)["entries"] == 4
        leases.lease("q", "other", 0, 100, now=Now(0, T0 + 20_000_000))
        assert _fetched_group(leases, "other", 9)[:5] == [(b"m0", 2), (b"m1", 2), (b"m2", 2), (b"m3", 2), (b"m4", 1)]
        leases.ack_upto("q", "other", 9, now_us=T0 + 20_000_000)
        while leases.pending:
            leases.work(T0 + 20_000_000)
        store.commit()
        with store.env.reading() as txn:
            assert txn.stat(counts)["entries"] == 0
        info = store.queue("q")
        assert (info.count, info.bytes) == (0, 0) and before > 0
    finally:
        store.close()


def _fetched_group(leases: Leases, group: str, hi: int) -> list[tuple[bytes, int]]:
    return [(b"".join(m.frames), m.deliveries) for _, m in leases.fetch("q", group, 0, hi, now_us=T0)[0]]
