"""The eMQP scheduler does bounded work (issue 26), on an injected clock and a real store: due schedules
run in due order, a turn's share at a time; a cron expression that names no time is refused at SCHEDULE
after a bounded search; a run writes only the schedule's small run record, never its payload again."""

from __future__ import annotations

import json
import random

import pytest

from pzq.clock import Now
from pzq.config import Limits
from pzq.gateways.emqp import EmqpGateway
from pzq.store import Store
from pzq.store.schedules import Schedules

from test_emqp_gateway import T0, V, gateway_on, mid, schedule, utc_us


def job(name: str) -> bytes:
    body = {"callable": name, "path": "m", "args": [], "kwargs": {}, "class_args": [], "class_kwargs": {}}
    return json.dumps(["run", body]).encode()


def test_a_thousand_schedules_due_in_the_same_second_run_over_several_turns_in_due_order_each_once(store):
    limits = Limits(schedule_runs_per_turn=150, schedule_turn_s=60.0)
    gateway = gateway_on(store, limits=limits, wall_clock=lambda: 61.0)
    order = list(range(1000))
    random.Random(26).shuffle(order)  # added in any order; each due 60 s after it was added, i ms apart
    for i in order:
        out = gateway.from_client(
            [b"client", b"", V, b"SCHEDULE", mid(), b"jobs", b"nohaste", b"60", job(f"j{i:04}"), b""],
            now=Now(T0, i * 1000),
        )
        assert out[0].frames[3] == b"ACK"
    gateway.tick(T0)  # (its next heartbeat is 3 s away)
    assert gateway.next_wake(T0) <= T0, "due"
    turns = []
    while ran := gateway.run_schedules(61_000_000):
        turns.append(ran)
        assert gateway.next_wake(T0) <= T0 or sum(turns) == 1000, "due ones left over: the next turn at once"
    assert turns == [150] * 6 + [100]
    runs = [m.frames[0] for m in store.scan("jobs", limit=2000)]
    assert runs == [job(f"j{i:04}") for i in range(1000)], "in due order, each once"
    # (run late, each is next due an interval after the run: at 121 s)
    assert gateway.scheduler.next_us() == 121_000_000 and gateway.next_wake(T0) > T0


def test_a_turns_share_of_schedules_also_ends_with_its_time_budget(store):
    gateway = gateway_on(store, limits=Limits(schedule_turn_s=0.005))
    for i in range(20):
        interval_schedule_of(gateway, job(f"t{i}"))
    ticks = iter(range(10_000))
    gateway.scheduler.clock = lambda: next(ticks) / 1000  # each look at the clock: 1 ms later
    assert [gateway.run_schedules(1) for _ in range(5)] == [5, 5, 5, 5, 0]


def interval_schedule_of(gateway: EmqpGateway, payload: bytes, headers: bytes = b"") -> None:
    out = gateway.from_client(
        [b"client", b"", V, b"SCHEDULE", mid(), b"jobs", headers, b"60", payload, b""], now=Now(T0, 1)
    )
    assert out[0].frames[3] == b"ACK"


class CroniterSteps:
    """Counts croniter's search steps (each field it moves on to its next match), calling the real ones."""

    def __init__(self, monkeypatch):
        import croniter

        self.steps = 0
        real = croniter.croniter._get_next_nearest_diff
        nth = croniter.croniter._get_nth_weekday_of_month

        def counted(*args):
            self.steps += 1
            return real(*args)

        def counted_nth(*args):
            self.steps += 1
            return nth(*args)

        monkeypatch.setattr(croniter.croniter, "_get_next_nearest_diff", staticmethod(counted))
        monkeypatch.setattr(croniter.croniter, "_get_nth_weekday_of_month", staticmethod(counted_nth))


def default_search_steps(expression: str, counter: CroniterSteps) -> int:
    """Steps croniter takes on ``expression`` with its own bound (50 years)."""
    import datetime

    import croniter

    before = counter.steps
    try:
        croniter.croniter(expression, datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)).get_next(float)
    except croniter.CroniterBadDateError:
        pass
    return counter.steps - before


@pytest.mark.parametrize(
    "cron, searched",
    [
        (b"0 0 31 2 *", False),  # 31 February
        (b"0 0 30 feb *", False),
        (b"0 0 31 4,6,9,11 *", False),  # a 31st in the 30-day months
        (b"* * * 31 2 * *", False),  # with seconds
        (b"0 0 1-5 * 1#5", False),  # a fifth Monday among the 1st to 5th (croniter wants both)
        (b"0 0 L * 1#1", False),  # the last day, a first Monday
        (b"0 0 29 2 1#5", True),  # 29 Feb on a fifth Monday (2044): searched 8 years ahead only
    ],
)
def test_a_cron_expression_that_names_no_time_is_refused_at_schedule_after_a_bounded_search(
    store, monkeypatch, cron, searched
):
    gateway = gateway_on(store)
    counter = CroniterSteps(monkeypatch)
    out = schedule(gateway, b'"never"', cron, now_us=utc_us("2026-11-26 12:00:00"))
    assert out[0].frames[3] == b"REPLY" and b"schedule refused" in b"".join(out[0].frames)
    assert gateway.schedules == {} and Schedules(store).raw() == []
    if not searched:
        assert counter.steps == 0, "refused on the table of month lengths, before any search"
    else:
        ours = counter.steps
        assert 0 < ours < 500 and ours * 2 < default_search_steps(cron.decode(), counter), ours


@pytest.mark.parametrize(
    "cron, start, first",
    [
        (b"0 0 29 2 *", "2096-03-01 00:00:00", "2104-02-29 00:00:00"),  # 29 February, 8 years ahead over 2100
        (b"0 0 31 2 1", "2026-11-26 00:00:00", "2027-02-01 00:00:00"),  # the 31st or a Monday: Mondays
        (b"0 0 L 2 *", "2026-11-26 00:00:00", "2027-02-28 00:00:00"),
        (b"@monthly", "2026-11-26 00:00:00", "2026-12-01 00:00:00"),
    ],
)
def test_a_cron_expression_whose_days_occur_is_accepted_and_runs_on_them(store, cron, start, first):
    gateway = gateway_on(store)
    assert schedule(gateway, b'"rare"', cron, headers=b"nohaste", now_us=utc_us(start))[0].frames[3] == b"ACK"
    assert gateway.scheduler.next_us() == utc_us(first)


@pytest.mark.parametrize(
    "cron", [b"0 0 1 1 \x07", b"0 0 1 1", b"0 0 1 1 * * * *", "0 0 1 1 \u0661".encode(), b"@reboot"]
)
def test_a_cron_expression_not_made_of_5_to_7_fields_of_crons_characters_is_refused(store, cron):
    gateway = gateway_on(store)
    out = schedule(gateway, b'"x"', cron)
    assert out[0].frames[3] == b"REPLY" and gateway.schedules == {}


def test_a_schedules_payload_is_written_once_and_each_run_writes_only_its_small_run_record(tmp_path):
    store = Store(tmp_path / "db")
    gateway = gateway_on(store)
    big = b'"' + b"p" * 100_000 + b'"'
    interval_schedule_of(gateway, big, headers=b"run_count:4")
    (key,) = gateway.schedules
    whole = Schedules(store).get_raw(key.encode())
    assert [gateway.run_schedules(t * 60_000_000 + 1) for t in range(3)] == [1, 1, 1]
    assert Schedules(store).get_raw(key.encode()) == whole, "the payload's record is not rewritten"
    (run_key, run), _ = Schedules(store).raw()
    assert run_key == b"\0" + key.encode() and len(run) < 20
    store.commit()
    store.close()
    store = Store(tmp_path / "db")  # a restart: the run record says one run is left
    try:
        gateway = gateway_on(store)
        assert gateway.schedules[key]["remaining"] == 1
        assert gateway.run_schedules(180_000_001) == 1 and gateway.schedules == {} and Schedules(store).raw() == []
        assert [m.frames for m in store.scan("jobs")] == [[big]] * 4
    finally:
        store.close()


def test_a_schedule_sent_again_a_thousand_times_runs_once_when_due_and_its_stale_times_are_dropped(store):
    gateway = gateway_on(store)
    for i in range(1000):  # each SCHEDULE of the same job replaces it: a later first run each time
        out = gateway.from_client(
            [b"client", b"", V, b"SCHEDULE", mid(), b"jobs", b"nohaste", b"60", job("again"), b""],
            now=Now(T0, i),
        )
        assert out[0].frames[3] == b"ACK"
    assert len(gateway.scheduler._heap) <= 2 + 64, "stale entries do not pile up"
    assert gateway.run_schedules(60_000_998) == 0 and gateway.run_schedules(60_000_999) == 1
    assert gateway.run_schedules(60_000_999) == 0 and store.queue("jobs").count == 1
