"""InFlight: deliveries waiting for an ack, with their deadlines in order (pure, no clock)."""

from __future__ import annotations

import random

from pzq.inflight import InFlight


def refs(deliveries) -> list:
    return [d.ref for d in deliveries]


def test_a_tracked_delivery_can_be_looked_up_and_counted_per_consumer():
    table = InFlight()
    table.add("a", 10.0, "c1")
    table.add("b", 20.0, "c1")
    table.add("c", 30.0, "c2")
    assert len(table) == 3
    assert "a" in table and "z" not in table
    got = table.get("b")
    assert (got.ref, got.deadline, got.consumer) == ("b", 20.0, "c1")
    assert table.get("z") is None
    assert (table.count("c1"), table.count("c2"), table.count("nobody")) == (2, 1, 0)


def test_removing_a_delivery_returns_it_once_and_updates_the_counts():
    table = InFlight()
    table.add("a", 10.0, "c1")
    table.add("b", 20.0, "c1")
    removed = table.remove("a")
    assert (removed.ref, removed.deadline, removed.consumer) == ("a", 10.0, "c1")
    assert table.remove("a") is None
    assert "a" not in table
    assert (len(table), table.count("c1")) == (1, 1)
    table.remove("b")
    assert (len(table), table.count("c1")) == (0, 0)


def test_pop_expired_returns_only_past_deadlines_earliest_first():
    table = InFlight()
    for ref, deadline in (("late", 30.0), ("first", 10.0), ("future", 99.0), ("second", 20.0)):
        table.add(ref, deadline)
    assert table.pop_expired(5.0) == []
    assert refs(table.pop_expired(30.0)) == ["first", "second", "late"]
    assert refs(table.pop_expired(30.0)) == []
    assert len(table) == 1 and "future" in table
    assert table.next_deadline() == 99.0


def test_pop_expired_stops_at_its_limit_and_leaves_the_rest():
    table = InFlight()
    for i in range(5):
        table.add(i, float(i))
    assert refs(table.pop_expired(10.0, limit=2)) == [0, 1]
    assert refs(table.pop_expired(10.0)) == [2, 3, 4]


def test_next_deadline_skips_deliveries_that_were_removed():
    table = InFlight()
    assert table.next_deadline() is None
    table.add("a", 1.0)
    table.add("b", 2.0)
    table.add("c", 3.0)
    table.remove("a")
    assert table.next_deadline() == 2.0
    table.remove("b")
    table.remove("c")
    assert table.next_deadline() is None
    assert table.pop_expired(100.0) == []


def test_adding_a_ref_again_replaces_its_deadline_and_consumer():
    table = InFlight()
    table.add("a", 10.0, "c1")
    table.add("a", 50.0, "c2")
    assert len(table) == 1
    assert (table.count("c1"), table.count("c2")) == (0, 1)
    assert table.next_deadline() == 50.0
    assert table.pop_expired(20.0) == []
    expired = table.pop_expired(50.0)
    assert [(d.ref, d.deadline, d.consumer) for d in expired] == [("a", 50.0, "c2")]


def test_an_earlier_deadline_on_re_add_takes_effect():
    table = InFlight()
    table.add("a", 50.0)
    table.add("a", 5.0)
    assert refs(table.pop_expired(5.0)) == ["a"]
    assert table.pop_expired(50.0) == []


def test_remove_consumer_takes_away_everything_it_held_and_nothing_else():
    table = InFlight()
    table.add("a", 10.0, "c1")
    table.add("b", 20.0, "c2")
    table.add("c", 30.0, "c1")
    assert sorted(refs(table.remove_consumer("c1"))) == ["a", "c"]
    assert (table.count("c1"), table.count("c2"), len(table)) == (0, 1, 1)
    assert table.remove_consumer("c1") == []
    assert refs(table.pop_expired(100.0)) == ["b"]


def test_remove_consumer_returns_the_deliveries_earliest_deadline_first():
    table = InFlight()
    table.add("late", 30.0, "c1")
    table.add("early", 10.0, "c1")
    assert refs(table.remove_consumer("c1")) == ["early", "late"]


def test_the_heap_stays_bounded_when_many_deliveries_are_acked_early():
    table = InFlight()
    for i in range(20_000):
        table.add(i, float(i))
    for i in range(20_000):
        if i % 1000:
            table.remove(i)
    assert len(table) == 20
    assert len(table._heap) < 2 * len(table) + 1100
    assert table.next_deadline() == 0.0
    assert refs(table.pop_expired(20_000.0)) == list(range(0, 20_000, 1000))


def test_the_heap_stays_bounded_when_one_ref_is_re_added_many_times():
    table = InFlight()
    table.add("steady", 1e9)
    for i in range(10_000):
        table.add("busy", float(i))
    assert len(table) == 2
    assert len(table._heap) < 2 * len(table) + 1100
    assert refs(table.pop_expired(1e9)) == ["busy", "steady"]
    assert table.get("busy") is None


def test_undo_puts_back_every_entry_changed_since_the_mark_and_nothing_else():
    table = InFlight()
    table.add("kept", 10.0, "c1")
    table.add("acked", 20.0, "c1")
    table.add("expires", 1.0, "c2")
    table.mark()
    table.remove("acked")
    table.add("new", 30.0, "c2")
    table.add("kept", 99.0, "c3")  # (its deadline and holder replaced)
    assert refs(table.pop_expired(5.0)) == ["expires"]
    table.undo()
    assert sorted(ref for ref, _ in table.holders()) == ["acked", "expires", "kept"]
    assert (table.get("kept").deadline, table.get("kept").consumer) == (10.0, "c1")
    assert table.count("c1") == 2 and table.count("c2") == 1 and table.count("c3") == 0
    assert refs(table.pop_expired(15.0)) == ["expires", "kept"], "deadlines are in the heap again"
    table.undo()  # (the journal goes on after an undo: what was popped since comes back)
    assert table.count("c1") == 2 and "expires" in table


def _state(table: InFlight) -> tuple:
    live = sorted((e.ref, e.deadline, e.consumer) for e in table._entries.values())
    return live, {c: table.count(c) for c in ("c1", "c2")}, table.next_deadline()


def test_adding_a_run_is_the_same_as_adding_each_one_replacements_and_repeats_included():
    one, run = InFlight(), InFlight()
    for table in (one, run):
        table.add("a", 5.0, "c2")
        table.mark()
    for ref in ["a", "b", "c", "b"]:
        one.add(ref, 10.0, "c1")
    run.add_many(["a", "b", "c", "b"], 10.0, "c1")
    assert _state(run) == _state(one)
    assert refs(run.pop_expired(20.0)) == refs(one.pop_expired(20.0)) == ["a", "c", "b"]
    assert run.count("c1") == run.count("c2") == 0


def test_a_run_added_then_removed_is_undone_by_a_rollback_like_single_calls():
    one, run = InFlight(), InFlight()
    for table in (one, run):
        table.add("a", 5.0, "c2")
        table.mark()
    for ref in ["b", "c"]:
        one.add(ref, 10.0, "c1")
    run.add_many(["b", "c"], 10.0, "c1")
    gone_one = [one.remove(ref) for ref in ["a", "b", "z", "b"]]
    gone_run = run.remove_many(["a", "b", "z", "b"])
    assert [d and d.ref for d in gone_run] == [d and d.ref for d in gone_one] == ["a", "b", None, None]
    assert _state(run) == _state(one)
    one.undo()
    run.undo()
    assert _state(run) == _state(one) == ([("a", 5.0, "c2")], {"c1": 0, "c2": 1}, 5.0)


def test_a_big_run_replacing_many_keeps_every_deadline_when_the_heap_is_rebuilt():
    table = InFlight()
    table.add_many(list(range(3000)), 1.0, "c1")
    table.add_many(list(range(3000)), 2.0, "c1")  # (each replaced: stale heap items trigger rebuilds)
    assert len(table) == 3000 and table.count("c1") == 3000
    assert refs(table.pop_expired(1.5)) == []
    assert len(table.pop_expired(2.5)) == 3000


def test_runs_expire_one_message_at_a_time_in_deadline_then_delivery_order_whatever_was_acked():
    # A run is one heap item (issue 27); what expires must stay exactly what single adds would give
    rng = random.Random(27)
    table: InFlight = InFlight()
    model: dict[int, tuple[float, int]] = {}  # ref -> (deadline, order of its last add)
    order = 0
    for step in range(3000):
        roll = rng.random()
        if roll < 0.3:
            run = [rng.randrange(2000) for _ in range(rng.randrange(1, 60))]
            deadline = float(rng.randrange(50))
            table.add_many(run, deadline, "c")
            for ref in run:
                order += 1
                model[ref] = (deadline, order)
        elif roll < 0.4:
            ref, deadline = rng.randrange(2000), float(rng.randrange(50))
            table.add(ref, deadline, "c")
            order += 1
            model[ref] = (deadline, order)
        elif roll < 0.8:
            gone = [rng.randrange(2000) for _ in range(rng.randrange(1, 40))]
            table.remove_many(gone)
            for ref in gone:
                model.pop(ref, None)
        else:
            now, limit = float(rng.randrange(50)), rng.randrange(1, 30)
            due = sorted((d, o, ref) for ref, (d, o) in model.items() if d <= now)[:limit]
            assert [(e.ref, e.deadline) for e in table.pop_expired(now, limit)] == [(r, d) for d, _, r in due], step
            for _, _, ref in due:
                del model[ref]
        assert table.next_deadline() == (min(d for d, _ in model.values()) if model else None)
        assert len(table) == len(model) and table.count("c") == len(model)
        assert table._heaped <= 2 * len(table) + 1024 + 60  # (memory stays bounded by what is in flight)


def test_a_run_is_one_heap_item_however_long():
    table = InFlight()
    table.add_many(list(range(500)), 1.0, "c1")
    assert len(table._heap) == 1
    table.remove_many(list(range(0, 500, 2)))
    assert refs(table.pop_expired(1.0, limit=3)) == [1, 3, 5]
    assert refs(table.pop_expired(1.0)) == list(range(7, 500, 2))
