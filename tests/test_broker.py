"""Broker rules over a real Store: times are passed in, so nothing sleeps and no socket is involved."""

from __future__ import annotations

import dataclasses

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits
from pzq.errors import StoreFull
from pzq.store import Store

T0 = 1_700_000_000_000_000  # a wall-clock µs timestamp


@pytest.fixture
def broker(store):
    return Broker(store, ack_timeout_s=10.0)


def produce(broker: Broker, *bodies: bytes, queue: str = "q", **kw) -> None:
    for body in bodies:
        broker.produce(queue, [body], now_us=T0, **kw)


def take(broker: Broker, n: int = 100, consumer: str = "c1", now: float = 0.0, queue: str = "q") -> list[bytes]:
    return [m.frames[0] for m in broker.take(queue, n, consumer, now=Now(now, T0))]


def test_messages_are_taken_in_the_order_they_were_produced(broker):
    produce(broker, b"a", b"b", b"c")
    assert take(broker) == [b"a", b"b", b"c"]
    assert broker.counters.produced == 3


def test_take_hands_out_at_most_n_and_keeps_the_rest_ready(broker):
    produce(broker, b"a", b"b", b"c")
    assert take(broker, 2) == [b"a", b"b"]
    assert broker.has_ready("q") is True
    assert take(broker, 2) == [b"c"]
    assert broker.has_ready("q") is False
    assert take(broker, 2) == []
    assert take(broker, 0, queue="q") == []


def test_taking_from_an_unknown_queue_gives_nothing_and_creates_no_queue(broker):
    assert take(broker, queue="nowhere") == []
    assert broker.has_ready("nowhere") is False
    assert broker.store.queue("nowhere", create=False) is None


def test_an_ack_deletes_the_message_for_good(broker):
    produce(broker, b"a", b"b")
    first = broker.take("q", 1, "c1", now=Now(0.0, T0))[0]
    assert broker.ack((first.qid, first.seq), by="c1") is True
    assert broker.ack((first.qid, first.seq), by="c1") is False
    assert broker.store.get("q", first.seq) is None
    assert broker.expire(1000.0) == 0
    assert take(broker) == [b"b"]
    assert broker.counters.acked == 1
    assert broker.ack((99, 1), by="c1") is False


def test_a_late_ack_after_the_timeout_requeued_the_message_still_deletes_it(broker):
    produce(broker, b"a")
    first = broker.take("q", 1, "c1", now=Now(0.0, T0))[0]
    assert broker.expire(10.0) == 1
    assert broker.ack((first.qid, first.seq), by="c1") is True
    assert take(broker, now=20.0) == []
    assert broker.store.queue("q").count == 0
    assert broker.queue_inflight(first.qid) == 0


def test_a_nacked_message_is_handed_out_again_before_newer_ones(broker):
    produce(broker, b"a", b"b", b"c")
    first = broker.take("q", 1, "c1", now=Now(0.0, T0))[0]
    assert broker.nack((first.qid, first.seq), by="c1") is True
    assert broker.nack((first.qid, first.seq), by="c1") is False
    again = broker.take("q", 3, "c1", now=Now(0.0, T0))
    assert [(m.frames[0], m.deliveries) for m in again] == [(b"a", 2), (b"b", 1), (b"c", 1)]
    assert (broker.counters.nacked, broker.counters.redelivered) == (1, 1)


def test_expire_requeues_only_deliveries_past_their_deadline_and_counts_them(broker):
    produce(broker, b"a", b"b", b"c")
    assert take(broker, 1, now=0.0) == [b"a"]
    assert take(broker, 1, now=5.0) == [b"b"]
    assert broker.expire(9.9) == 0
    assert broker.expire(10.0) == 1
    assert broker.next_deadline() == 15.0
    assert take(broker, 2, now=10.0) == [b"a", b"c"]
    assert broker.counters.expired == 1
    assert broker.stats()["expired_messages"] == 1


def test_a_message_delivered_max_deliveries_times_goes_to_the_dead_letters(store):
    broker = Broker(store, ack_timeout_s=10.0, max_deliveries=2)
    produce(broker, b"poison", b"fine")
    for _ in range(2):
        message = broker.take("q", 1, "c1", now=Now(0.0, T0))[0]
        assert message.frames == [b"poison"]
        broker.nack((message.qid, message.seq), by="c1")
    assert take(broker) == [b"fine"]
    [letter] = store.dead_letters.read("q")
    assert (letter.message.frames, letter.reason, letter.message.deliveries) == ([b"poison"], "max-deliveries", 2)
    assert broker.counters.dead_lettered == 1


def test_a_message_past_its_ttl_is_dead_lettered_and_never_handed_out(broker):
    produce(broker, b"stale1", b"stale2", expires_us=T0 - 1)
    produce(broker, b"fresh", expires_us=T0 + 1)
    assert take(broker, 1) == [b"fresh"]
    letters = broker.store.dead_letters.read("q")
    assert [(d.message.frames, d.reason, d.dead_at_us) for d in letters] == [
        ([b"stale1"], "expired", T0),
        ([b"stale2"], "expired", T0),
    ]
    assert broker.store.queue("q").count == 1


def test_undeliver_requeues_and_takes_back_the_delivery_count(broker):
    produce(broker, b"a")
    first = broker.take("q", 1, "c1", now=Now(0.0, T0))[0]
    broker.undeliver((first.qid, first.seq))
    assert len(broker.inflight) == 0
    again = broker.take("q", 1, "c1", now=Now(0.0, T0))
    assert [(m.frames, m.deliveries) for m in again] == [([b"a"], 1)]
    assert broker.counters.redelivered == 0


def test_a_consumer_that_leaves_has_everything_it_held_requeued_at_once(broker):
    produce(broker, b"a", b"b", b"c")
    assert take(broker, 2, consumer="c1") == [b"a", b"b"]
    assert take(broker, 1, consumer="c2") == [b"c"]
    assert broker.consumer_gone("c1") == 2
    assert broker.consumer_gone("c1") == 0
    assert take(broker, consumer="c2") == [b"a", b"b"]
    assert broker.inflight.count("c2") == 3
    assert broker.queue_inflight(broker.store.queue("q").qid) == 3


def test_after_reset_in_flight_messages_are_ready_again_in_order(broker):
    produce(broker, b"a", b"b", b"c")
    assert take(broker, 2) == [b"a", b"b"]
    broker.reset()
    assert len(broker.inflight) == 0
    again = broker.take("q", 10, "c1", now=Now(0.0, T0))
    assert [(m.frames[0], m.deliveries) for m in again] == [(b"a", 2), (b"b", 2), (b"c", 1)]


def test_delivery_counts_carry_over_to_a_broker_on_the_reopened_store(tmp_path):
    store = Store(tmp_path / "db")
    broker = Broker(store, ack_timeout_s=10.0, max_deliveries=2)
    produce(broker, b"a")
    take(broker)
    store.close()
    store = Store(tmp_path / "db")
    try:
        broker = Broker(store, ack_timeout_s=10.0, max_deliveries=2)
        assert [m.deliveries for m in broker.take("q", 1, "c1", now=Now(0.0, T0))] == [2]
        broker.reset()
        assert take(broker) == []
        assert store.dead_letters.read("q")[0].reason == "max-deliveries"
    finally:
        store.close()


def test_a_produce_refused_as_full_is_counted_and_raises(tmp_path):
    store = Store(tmp_path / "small", max_size=1000)
    try:
        broker = Broker(store, ack_timeout_s=10.0)
        produce(broker, b"x" * 600)
        with pytest.raises(StoreFull):
            produce(broker, b"y" * 600)
        assert (broker.counters.produced, broker.counters.refused_full) == (1, 1)
    finally:
        store.close()


def test_stats_report_the_six_pzq_figures_then_the_queues(broker):
    produce(broker, b"a", b"b", b"c")
    produce(broker, b"z", queue="other")
    taken = broker.take("q", 2, "c1", now=Now(0.0, T0))
    broker.ack((taken[0].qid, taken[0].seq), by="c1")
    broker.store.commit()
    broker.expire(10.0)
    take(broker, 1, now=10.0)
    stats = broker.stats()
    assert list(stats) == [
        "messages",
        "messages_inflight",
        "db_size",
        "inflight_db_size",
        "syncs",
        "expired_messages",
        "queues",
    ]
    assert (stats["messages"], stats["messages_inflight"], stats["syncs"], stats["expired_messages"]) == (3, 1, 1, 1)
    assert stats["db_size"] == broker.store.disk_bytes() > 0
    assert stats["inflight_db_size"] == broker.inflight.approx_bytes() > 0
    assert stats["queues"] == {
        "q": {"depth": 2, "inflight": 1, "dead_letters": 0, "bytes": broker.store.queue("q").bytes},
        "other": {"depth": 1, "inflight": 0, "dead_letters": 0, "bytes": broker.store.queue("other").bytes},
    }


def test_a_client_settles_only_what_was_delivered_to_it(broker):
    produce(broker, b"a", b"b", b"c")
    given = broker.take("q", 1, "alice", now=Now(0.0, T0))[0]
    ref = (given.qid, given.seq)
    never_given = (given.qid, given.seq + 1)
    assert broker.ack(ref, by="mallory") is False
    assert broker.nack(ref, by="mallory") is False
    assert broker.requeue_at_end(ref, by="mallory") is False
    assert broker.dead_letter(ref, "x", by="mallory", now_us=T0) is False
    assert broker.ack(never_given, by="alice") is False  # stored, ready, but never given to anyone
    assert broker.dead_letter(never_given, "x", by="alice", now_us=T0) is False
    assert (broker.store.queue("q").count, broker.store.queue("q").dead_count, broker.counters.refused_not_held) == (
        3,
        0,
        6,
    )
    assert broker.inflight.get(ref).consumer == "alice"
    assert broker.ack(ref, by="alice") is True


def test_a_late_answer_counts_only_from_the_last_holder_and_only_until_settled(broker):
    produce(broker, b"a")
    given = broker.take("q", 1, "alice", now=Now(0.0, T0))[0]
    ref = (given.qid, given.seq)
    assert broker.expire(10.0) == 1
    assert broker.nack(ref, by="alice") is False  # already back in the queue: a late nack means nothing
    assert broker.ack(ref, by="bob") is False
    assert broker.take("q", 1, "bob", now=Now(10.0, T0))[0].seq == given.seq
    assert broker.ack(ref, by="alice") is True  # the work was done: a late ack deletes it (the PZQ rule)
    assert broker.store.get("q", given.seq) is None


def test_the_late_answer_memory_is_bounded(store):
    broker = Broker(store, ack_timeout_s=10.0, limits=Limits(late_memory=2))
    produce(broker, b"a", b"b", b"c")
    refs = [(m.qid, m.seq) for m in broker.take("q", 3, "alice", now=Now(0.0, T0))]
    broker.expire(10.0)
    assert broker.ack(refs[0], by="alice") is False  # forgotten: it will simply be delivered again
    assert broker.ack(refs[2], by="alice") is True


def test_readiness_grows_whenever_messages_may_have_become_ready_and_only_then(broker):
    seen = [broker.readiness]

    def changed() -> bool:
        seen.append(broker.readiness)
        return seen[-1] != seen[-2]

    produce(broker, b"a", b"b", b"c", b"d", b"e", b"f")
    assert changed(), "produced"
    assert broker.produce_many("q", [[b"g"]], now_us=T0) == 1 and changed()
    refs = [(m.qid, m.seq) for m in broker.take("q", 6, "alice", now=Now(0.0, T0))]
    assert not changed(), "a take makes nothing ready"
    assert broker.ack(refs[0], by="alice") and not changed(), "nor does an ack"
    assert broker.nack(refs[1], by="alice") and changed()
    assert broker.take_back(refs[2], by="alice") and changed()
    broker.undeliver(refs[3])
    assert changed()
    assert broker.requeue_at_end(refs[4], by="alice") and changed()
    assert broker.expire(100.0) == 1 and changed(), "an ack timeout"
    [again] = broker.take("q", 1, "bob", now=Now(100.0, T0))
    assert not changed()
    assert broker.consumer_gone("bob") == 1 and changed()
    broker.dead_letter((again.qid, again.seq), "bad", by="bob", now_us=T0)  # (a late holder: still bob's)
    assert not changed(), "a dead letter is not ready"
    assert broker.requeue_dead("q") and changed(), "dead letters requeued by the operator"
    broker.reset()
    assert changed(), "every delivery forgotten"


def test_a_released_range_raises_readiness(broker):
    from pzq.broker import Exclusive

    produce(broker, b"a", b"b")
    group = Exclusive("g")
    [(lo, count, _)] = broker.take_ranges("q", 2, group, now_us=T0)
    before = broker.readiness
    assert broker.release_range(broker.store.queue("q").qid, lo, lo + count, group, deliveries=1) == 2
    assert broker.readiness != before and broker.ready_count("q") == 2


def test_runs_of_acks_and_take_backs_settle_each_and_name_what_was_refused(broker):
    produce(broker, b"a", b"b", b"c", b"d")
    refs = [(m.qid, m.seq) for m in broker.take("q", 4, "alice", now=Now(0.0, T0))]
    assert broker.ack_many([refs[0], (refs[0][0], 999), refs[1]], by="alice") == [(refs[0][0], 999)]
    assert broker.ack_many([refs[2]], by="bob") == [refs[2]], "not bob's"
    assert broker.take_back_many(refs[2:], by="alice") == 2
    assert broker.deadline(refs[2], "alice") is None and broker.ready_count("q") == 2
    [again] = broker.take("q", 1, "bob", now=Now(0.0, T0))
    assert broker.deadline((again.qid, again.seq), "bob") == 10.0
    broker.undeliver_many([(again.qid, again.seq)])
    assert broker.ready_count("q") == 2


def test_a_rolled_back_turn_undoes_only_its_own_deliveries_and_acks_are_done_again(store):
    broker = Broker(store, ack_timeout_s=10.0)
    broker.redo_on_rollback("native")
    produce(broker, b"a", b"b", b"c", b"d")
    store.commit()
    broker.turn_begins()
    first, second = broker.take("q", 2, "native", now=Now(0.0, T0))
    other = broker.take("q", 1, "c1", now=Now(0.0, T0))[0]  # a holder whose gateway forgets its own
    store.commit()
    broker.committed()
    broker.turn_begins()  # the turn that fails: an ack, and a delivery that never leaves
    assert broker.ack((first.qid, first.seq), by="native")
    [fourth] = broker.take("q", 1, "native", now=Now(1.0, T0))
    store.abort()  # (the commit failed)
    broker.rolled_back()
    assert broker.deadline((second.qid, second.seq), "native") == 10.0, "it left in an earlier turn: still held"
    assert broker.deadline((fourth.qid, fourth.seq), "native") is None, "it never left: ready again"
    assert broker.deadline((other.qid, other.seq), "c1") is None, "forgotten, as its gateway forgets it"
    broker.turn_begins()  # the ack the rollback took back is done again
    assert broker.stored((first.qid, first.seq)) is None
    assert take(broker, consumer="c2", now=2.0) == [b"c", b"d"], "neither the acked nor the held one again"


def _figures(broker: Broker) -> tuple:
    infos = {i.name: (i.count, i.bytes) for i in broker.store.queues()}
    return (
        infos,
        dataclasses.astuple(broker.counters),
        {q: dict(c) for q, c in broker.per_queue.items()},
        sorted(ref for ref, _ in broker.inflight.holders()),
        {q: broker.queue_inflight(broker.store.queue(q).qid) for q in ("q", "r")},
        list(broker._state.unwritten),
    )


def test_an_ack_run_does_what_one_ack_after_another_does_even_for_a_hostile_mix(tmp_path):
    """Repeats, another's deliveries, unknown seqs, a late ack after a timeout (its message since
    handed to someone else), two queues: the run refuses and counts exactly what single acks would."""
    twins = []
    for name in ("one", "run"):
        store = Store(tmp_path / name, max_size=64 << 20)
        broker = Broker(store, ack_timeout_s=10.0)
        broker.redo_on_rollback("alice")
        produce(broker, b"a", b"b", b"c", b"d", b"e")
        produce(broker, b"x", b"y", queue="r")
        mine = broker.take("q", 3, "alice", now=Now(0.0, T0)) + broker.take("r", 2, "alice", now=Now(0.0, T0))
        late = broker.take("q", 1, "bob", now=Now(0.0, T0), timeout_s=1.0)
        broker.expire(5.0)  # bob's delivery timed out: his late ack still counts
        again = broker.take("q", 1, "carol", now=Now(5.0, T0))  # (the same message, now carol's)
        theirs = broker.take("q", 1, "carol", now=Now(5.0, T0))
        assert again[0].seq == late[0].seq and theirs
        refs = [(m.qid, m.seq) for m in mine]
        qid = refs[0][0]
        run = [refs[0], refs[0], (qid, 999), (theirs[0].qid, theirs[0].seq), refs[3], (late[0].qid, late[0].seq)]
        run += [refs[1], (77, 1), refs[4], refs[1]]
        twins.append((broker, run, [(late[0].qid, late[0].seq)]))
    (one, run_one, _), (many, run_many, _) = twins
    refused_one = [ref for ref in run_one if not one.ack(ref, by="alice")]
    refused_many = many.ack_many(run_many, by="alice")
    assert refused_many == refused_one
    assert _figures(many) == _figures(one)
    late_ref = twins[0][2]
    assert one.ack_many(late_ref, by="bob") == many.ack_many(late_ref, by="bob") == []
    assert _figures(many) == _figures(one)
    for broker, _, _ in twins:
        broker.store.close()
