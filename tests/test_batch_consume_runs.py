"""The batched consumer's runs, done over each whole run in C (issue 40), do what the same calls one
message at a time do: the store's read of a run, the broker's ack of a run, a rollback of either, the
DELIVER's keys frame and the ACK's keys. Random runs, hostile ones included, against the slow paths."""

from __future__ import annotations

import itertools
import random

import msgpack
import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.gateways.native import ref_of_key
from pzq.gateways.native_keys import message_keys, refs_of_keys
from pzq.store import Store
from pzq.store.layout import KEY
from pzq.store.plain_runs import plain_columns, plain_rows

T0 = 1_700_000_000_000_000


def fill(store: Store, rng: random.Random, count: int) -> None:
    """``count`` messages of a random mix: batches, single ones, multi-frame ones, some with a TTL."""
    while count > 0:
        kind = rng.random()
        if kind < 0.1:
            store.put("q", [b"ttl"], now_us=T0, expires_us=T0 + 10**9)
            count -= 1
            continue
        n = min(count, rng.randint(1, 40))
        bodies = [[b"%d" % i] * rng.randint(1, 3) for i in range(n)]
        store.put_many("q", bodies, now_us=T0 + rng.randint(0, 2))
        count -= n


@pytest.mark.parametrize("seed", range(6))
def test_a_run_read_at_once_is_the_run_read_record_by_record(tmp_path, seed):
    rng = random.Random(seed)
    store = Store(tmp_path / "db", max_size=1 << 26, sync=False)
    fill(store, rng, 300)
    store.put_many("r", [[b"another queue's"]] * 5, now_us=T0)  # (after q's records: a run stops before them)
    info = store.queue("q")
    if seed % 2:  # (some counts written: the runs read them from the table)
        store.mark_delivered_run("q", [store.get("q", seq) for seq in rng.sample(range(1, 200), 30)])
        store.commit()
    for _ in range(60):
        start = rng.randint(1, 300)
        limit, most = rng.randint(1, 80), rng.choice([1, 50, 400, 1 << 30])
        skip = {(info.qid, seq) for seq in rng.sample(range(1, 320), rng.choice([0, 0, 5]))}
        with store.env.reading() as txn:
            cursor = txn.cursor(db=store._messages_db)
            assert cursor.set_range(KEY.pack(info.qid, start))
            records = list(itertools.islice(cursor.iternext(), limit))
        counts = None
        if seed % 2:
            with store.env.reading() as txn:
                got = {k: txn.get(k, db=store._deliveries_db) for k, _ in records}
            counts = got.get
        rows = plain_rows(info.qid, start, list(records), most, skip, counts, store._pending_counts)
        columns = plain_columns(info.qid, list(records), most, skip, counts, store._pending_counts)
        if columns is not None:
            assert columns[0]._replace(deliveries=columns[0].deliveries or [0] * len(columns[0].keys)) == rows[0]
            assert columns[1:] == rows[1:]
        whole = store.plain_run("q", start, limit, most, skip)
        assert whole[0]._replace(deliveries=whole[0].deliveries or [0] * len(whole[0].keys)) == rows[0]
        assert whole[1:] == rows[1:]
    store.close()


@pytest.mark.parametrize("seed", range(8))
def test_an_ack_run_settles_and_refuses_as_acks_one_at_a_time_do_and_rolls_back_alike(tmp_path, seed):
    outcomes = []
    for by_run in (True, False):
        rng = random.Random(seed)
        store = Store(tmp_path / f"db{by_run}", max_size=1 << 26, sync=False)
        broker = Broker(store, ack_timeout_s=10.0)
        broker.produce_many("q", [[b"x" * rng.randint(1, 50)] for _ in range(120)], now_us=T0)
        mine = [r for r, _, _ in broker.take_run("q", 60, "c1", now=Now(0.0, T0))]
        theirs = [r for r, _, _ in broker.take_run("q", 20, "c2", now=Now(0.0, T0))]
        if seed % 3 == 1:  # (some of mine timed out: late acks)
            broker.expire(11.0, 5)
        if seed % 3 == 2:  # (some gone from the store under it)
            for ref in rng.sample(mine, 3):
                store.delete("q", ref[1])
        store.commit()
        broker.turn_begins()
        store.turn_begins()
        run = rng.sample(mine, rng.randint(1, 60)) if seed % 4 else mine[: rng.randint(1, 60)]  # (or as taken)
        if seed % 2:
            run += rng.sample(theirs, 2) + run[:2] + [(999, 1)]  # (another's, repeats, unknown)
        refused = broker.ack_many(run, by="c1") if by_run else [r for r in run if not broker.ack(r, by="c1")]
        info = store.queue("q")
        state = (
            refused,
            info.count,
            info.bytes,
            broker.held_count("c1"),
            broker.queue_inflight(info.qid),
            broker.inflight.bytes_of("c1"),
            broker.counters.acked,
        )
        store.abort()  # (a failed commit: the turn is undone)
        broker.rolled_back()
        info = store.queue("q")
        outcomes.append((state, info.count, broker.held_count("c1"), broker.inflight.bytes_of("c1")))
        store.close()
    assert outcomes[0] == outcomes[1]


def test_the_keys_frame_of_a_deliver_is_the_msgpack_array_of_each_message_key():
    rng = random.Random(4)
    for n in (1, 15, 16, 17, 100, 300, 70_000):
        refs = [(rng.randrange(1, 1 << 64), rng.randrange(1 << 64)) for _ in range(n)]
        enqueued = sorted(rng.choice([T0, T0 + 1, 5, 10**16 - 1]) for _ in range(n))
        want = [b"%016d|%016x%016x" % (at, *ref) for ref, at in zip(refs, enqueued, strict=True)]
        assert message_keys([KEY.pack(*ref) for ref in refs], enqueued) == msgpack.packb(want)
    long_ago = [10**17]  # (past 16 digits: packed one by one, the same key)
    assert message_keys([KEY.pack(1, 2)], long_ago) == msgpack.packb([b"%016d|%016x%016x" % (10**17, 1, 2)])


def test_the_keys_of_an_ack_read_at_once_are_the_keys_read_one_by_one_hostile_ones_included():
    good = [b"%016d|%016x%016x" % (T0, 1, seq) for seq in range(50)]
    hostile = [
        good[0].upper(),
        good[1][:48],
        good[2] + b"0",
        good[3].replace(b"|", b"/"),
        good[4][:20] + b"g" + good[4][21:],
        b"x" * 16 + good[5][16:],  # (not digits before the bar: ref_of_key reads the id all the same)
        b"",
        b"0000000000000001|" + b"f" * 32,
    ]
    rng = random.Random(1)
    for _ in range(200):
        keys = rng.sample(good, rng.randint(1, 50)) + rng.sample(hostile, rng.choice([0, 0, 1, 2]))
        rng.shuffle(keys)
        assert refs_of_keys(keys) == [ref_of_key(key) for key in keys]
