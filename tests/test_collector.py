"""The garbage collector's whole walk (issue 39): pzq's biggest table, MQKS's bindings, is kept in objects
the collector does not walk, and a whole walk estimated to hold the loop for long is put off."""

from __future__ import annotations

import dataclasses
import gc
import time

import pytest

from pzq.config import DEFAULT_LIMITS
from pzq.gateways.mqks_bindings import BindingIndex
from pzq.server.collector import Collector
from pzq.store.bindings import Binding, Bindings


def _tracked_inside(index: BindingIndex) -> list[object]:
    """Containers the collector would walk among the index's tables (after a collection untracked what
    it could: a tuple of strings, a dict of strings and tuples)."""
    gc.collect()
    found = [table for table in (index.by_event, index.bindings) if gc.is_tracked(table)]
    found += [queues for queues in index.by_event.values() if gc.is_tracked(queues)]
    found += [binding.events for binding in index.bindings.values() if gc.is_tracked(binding.events)]
    return found


def test_bindings_of_distinct_and_shared_events_leave_no_container_per_event_for_the_collector(store):
    index = BindingIndex(Bindings(store), DEFAULT_LIMITS)
    for q in range(20):  # 20 queues x 1,000 events of their own, and 10 events every queue shares
        events = [f"q{q}.e{i}" for i in range(1_000)] + [f"shared.{i}" for i in range(10)]
        index.set(f"q{q}", Binding(events), save=True)
    index.set("q0", Binding([e for e in index.get("q0").events if e != "shared.3"]), save=True)  # (one goes)
    index.remove("q1")
    assert index.bound_total == 18 * 1_010 + 1_009
    assert index.queues_for("q5.e7") == ("q5",)
    assert sorted(index.queues_for("shared.3")) == sorted(f"q{q}" for q in range(2, 20))
    assert sorted(index.queues_for("shared.4")) == sorted(["q0", *(f"q{q}" for q in range(2, 20))])
    assert index.queues_for("q1.e1") == ()
    # 19 bindings are one object each (the dict of them is walked: 19 entries); 19,000 events, none
    assert _tracked_inside(index) == [index.bindings]


def test_a_whole_walk_estimated_past_its_bound_is_put_off_and_counted_and_one_under_it_runs():
    collector = Collector(whole_s=10.0, most_s=1e-9)  # (no walk of a real heap fits a nanosecond)
    collector.start(now=0.0)
    try:
        collector.turn_ends(now=10.0)
        assert (collector.whole_total, collector.put_off_total) == (0, 1), "put off, not run"
        assert collector.stats()["frozen_objects"] > 0, "what was weighed is shown"
        collector.turn_ends(now=15.0)
        assert collector.put_off_total == 1, "weighed again only when the next is due"
        collector.most_s = 10.0
        collector.turn_ends(now=20.0)
        assert (collector.whole_total, collector.put_off_total) == (1, 1), "one under the bound runs"
        assert collector.stats()["whole_last_ms"] > 0
    finally:
        collector.stop()


@pytest.fixture(autouse=True)
def _no_frozen_leftovers():
    yield
    gc.unfreeze()


def test_the_whole_walk_comes_every_gc_whole_interval_and_the_monitor_shows_it(make_server):
    # (the bound raised: the test process's heap, pytest's modules and all, costs tens of ms to walk)
    srv = make_server(gc_whole_interval=0.2, limits=dataclasses.replace(DEFAULT_LIMITS, gc_whole_most_s=1.0))
    deadline = time.monotonic() + 20
    while (srv.stats().get("gc") or {}).get("whole_total", 0) < 2:
        assert time.monotonic() < deadline, f"no whole walk came: {srv.stats().get('gc')}"
        time.sleep(0.05)
    figures = srv.stats()["gc"]
    assert figures["whole_put_off_total"] == 0 and figures["frozen_objects"] > 0, figures
