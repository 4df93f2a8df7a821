"""The eMQP gateway on an injected clock and a real store: draining workers' liveness, jobs held across
a restart, scheduler peers' heartbeats and cron schedules (no test waits for time to pass)."""

from __future__ import annotations

import uuid

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.gateways.emqp import EmqpGateway
from pzq.store import Store
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

V = b"eMQP/1.0"
T0 = 1_000.0  # monotonic seconds of the injected clock


def mid() -> bytes:
    return str(uuid.uuid4()).encode()


def gateway_on(store: Store, now: float = T0, **options) -> EmqpGateway:
    gateway = EmqpGateway(
        Broker(store, ack_timeout_s=5),
        EmqpJobs(store),
        Schedules(store),
        default_queues=["default"],
        heartbeat_s=3,
        liveness=3,
        **options,
    )
    gateway.restore_jobs(now)
    return gateway


def worker(gateway: EmqpGateway, peer: bytes, name: bytes, *args: bytes, now: float) -> list:
    return gateway.from_worker([peer, b"", V, name, mid(), *args], now=Now(now, int(now * 1e6)))


def request(gateway: EmqpGateway, msgid: bytes, payload: bytes = b'"x"', now: float = T0) -> None:
    gateway.from_client(
        [b"client", b"", V, b"REQUEST", msgid, b"jobs", b"reply-requested", payload], now=Now(now, int(now * 1e6))
    )


def given_a_job(gateway: EmqpGateway, peer: bytes = b"w1", now: float = T0) -> list[bytes]:
    worker(gateway, peer, b"INFORM", b'[[10, "jobs"]]', b"worker", now=now)
    worker(gateway, peer, b"READY", now=now)
    [(_, job, _, _)] = gateway.hand_out(now=Now(now, int(now * 1e6)))
    return job


@pytest.fixture
def job_before_a_restart(tmp_path):
    """(store reopened after a restart, the job frames a worker b"w1" was given before it); the REQUEST
    left after the turn's commit, and a kill -9 keeps exactly what was committed."""
    store = Store(tmp_path / "db")
    gateway = gateway_on(store)
    request(gateway, b"req-1")
    job = given_a_job(gateway)
    store.commit()
    store.close()
    store = Store(tmp_path / "db")
    yield store, job
    store.close()


def test_a_draining_worker_silent_for_liveness_intervals_is_dead_and_its_jobs_go_back_at_once(store):
    gateway = gateway_on(store)
    request(gateway, b"req-1")
    given_a_job(gateway)
    worker(gateway, b"w1", b"KBYE", now=T0 + 1)
    gateway.tick(T0 + 1)
    assert gateway.broker.ready_count("jobs") == 0, "draining: it may still REPLY"
    gateway.tick(T0 + 1 + 3 * 3 + 0.5)  # silent for liveness (3) x interval (3 s)
    assert gateway.broker.ready_count("jobs") == 1 and gateway.counters["dead_workers_total"] == 1
    assert b"w1" not in gateway.workers


def test_a_draining_worker_that_replies_in_time_completes_its_job(store):
    gateway = gateway_on(store)
    request(gateway, b"req-1")
    job = given_a_job(gateway)
    worker(gateway, b"w1", b"KBYE", now=T0 + 1)
    gateway.tick(T0 + 8)
    out = worker(gateway, b"w1", b"REPLY", b'{"ok": 1}', job[4], now=T0 + 8)
    assert out[0][1][3] == b"REPLY" and store.queue("jobs").count == 0


def test_a_reply_after_a_restart_completes_the_job_handed_out_before_it(job_before_a_restart):
    store, job = job_before_a_restart
    gateway = gateway_on(store, now=T0 + 100)
    assert gateway.broker.ready_count("jobs") == 0, "held for its worker, not handed out again"
    given_new = worker(gateway, b"w1-reset", b"INFORM", b'[[10, "jobs"]]', b"worker", now=T0 + 101)
    assert given_new[0][1][3] == b"ACK"
    worker(gateway, b"w1-reset", b"READY", now=T0 + 101)
    assert gateway.hand_out(now=Now(T0 + 101, 1)) == []  # the one job is not given out twice
    out = worker(gateway, b"w1-reset", b"REPLY", b'{"ok": 1}', job[4], now=T0 + 102)
    assert out[0][1][:1] == [b"client"] and out[0][1][3] == b"REPLY"
    assert store.queue("jobs").count == 0 and gateway.counters["replies_total"] == 1
    store.commit()
    assert EmqpJobs(store).raw() == []


def test_a_job_whose_reply_never_comes_after_a_restart_runs_again_after_the_grace(job_before_a_restart):
    from pzq.gateways.emqp_workers import RESTART_GRACE_S

    store, _ = job_before_a_restart
    gateway = gateway_on(store, now=T0)
    assert gateway.broker.expire(T0 + RESTART_GRACE_S - 1) == 0
    assert gateway.broker.expire(T0 + RESTART_GRACE_S + 1) == 1
    assert gateway.broker.ready_count("jobs") == 1
    assert given_a_job(gateway, b"w2", now=T0 + RESTART_GRACE_S + 2)[4] == b"req-1"


@pytest.mark.parametrize("peer_of", ["another worker", "another key"])
def test_a_restored_job_is_not_completed_by_a_worker_that_cannot_inherit_it(job_before_a_restart, peer_of):
    store, job = job_before_a_restart
    gateway = gateway_on(store, now=T0)
    queues = b'[[10, "other"]]' if peer_of == "another worker" else b'[[10, "jobs"]]'
    user = "another-key" if peer_of == "another key" else None
    gateway.from_worker([b"w9", b"", V, b"INFORM", mid(), queues, b"worker"], now=Now(T0, 1), user=user)
    gateway.from_worker([b"w9", b"", V, b"REPLY", mid(), b"{}", job[4]], now=Now(T0, 1), user=user)
    assert store.queue("jobs").count == 1 and gateway.counters["replies_refused_total"] == 1


def test_after_a_restart_the_same_jobmanager_connection_is_taken_back_by_its_heartbeat(job_before_a_restart):
    store, job = job_before_a_restart
    gateway = gateway_on(store, now=T0)
    worker(gateway, b"w1", b"HEARTBEAT", b"0", now=T0 + 1)  # no INFORM: it never noticed the restart
    assert b"w1" in gateway.workers and [b"w1", b"", V, b"HEARTBEAT"] == gateway.tick(T0 + 1)[0][1][:4]
    out = worker(gateway, b"w1", b"REPLY", b'{"ok": 1}', job[4], now=T0 + 2)
    assert out[0][1][3] == b"REPLY" and store.queue("jobs").count == 0


def test_a_scheduler_peer_gets_heartbeats_on_the_frontend_until_it_falls_silent(store):
    gateway = gateway_on(store)
    out = gateway.from_client([b"sched", b"", V, b"INFORM", b"m1", b"", b"scheduler"], now=Now(T0, 1))
    assert out[0][1][3] == b"ACK"
    beats = gateway.tick(T0)
    assert [(send.socket, send.peer, send.frames[3]) for send in beats] == [("front", b"sched", b"HEARTBEAT")]
    gateway.from_client([b"sched", b"", V, b"HEARTBEAT", b"m2", b"1.0"], now=Now(T0 + 8, 1))
    assert gateway.tick(T0 + 16) != [], "heard from 8 s before: alive"
    assert gateway.tick(T0 + 30) == [] and gateway.schedulers == {}, "silent for more than 3 x 3 s"


def schedule(gateway, payload: bytes, cron: bytes, headers: bytes = b"", now_us: int = 0) -> list:
    return gateway.from_client(
        [b"client", b"", V, b"SCHEDULE", mid(), b"jobs", headers, b"-1", payload, cron], now=Now(T0, now_us)
    )


def utc_us(text: str) -> int:
    import datetime

    return int(datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp() * 1e6)


def test_a_cron_schedule_runs_now_then_at_each_cron_time_in_utc(store):
    gateway = gateway_on(store)
    assert schedule(gateway, b'"tick"', b"*/15 * * * *", now_us=utc_us("2026-11-23 10:07:30"))[0][1][3] == b"ACK"
    assert gateway.run_schedules(utc_us("2026-11-23 10:07:30")) == 1  # haste: the first run is at once
    assert gateway.run_schedules(utc_us("2026-11-23 10:14:59")) == 0
    assert gateway.run_schedules(utc_us("2026-11-23 10:15:00")) == 1
    assert gateway.run_schedules(utc_us("2026-11-23 10:29:59")) == 0
    assert gateway.run_schedules(utc_us("2026-11-23 11:02:00")) == 1  # after a pause: once, then on time
    assert gateway.run_schedules(utc_us("2026-11-23 11:14:00")) == 0
    assert gateway.run_schedules(utc_us("2026-11-23 11:15:00")) == 1
    assert store.queue("jobs").count == 4


def test_a_cron_schedule_honours_nohaste_and_run_count_and_survives_a_restart(tmp_path):
    store = Store(tmp_path / "db")
    gateway = gateway_on(store)
    schedule(gateway, b'"nightly"', b"30 2 * * *", headers=b"nohaste,run_count:2", now_us=utc_us("2026-11-23 10:00:00"))
    assert gateway.run_schedules(utc_us("2026-11-23 10:00:00")) == 0, "nohaste: not now"
    assert gateway.run_schedules(utc_us("2026-11-24 02:30:00")) == 1
    store.commit()
    store.close()
    store = Store(tmp_path / "db")
    try:
        gateway = gateway_on(store)
        assert gateway.run_schedules(utc_us("2026-11-24 12:00:00")) == 0
        assert gateway.run_schedules(utc_us("2026-11-25 02:30:00")) == 1
        assert gateway.schedules == {} and Schedules(store).raw() == [], "run_count:2 spent"
        assert gateway.run_schedules(utc_us("2026-11-26 02:30:00")) == 0
        assert store.queue("jobs").count == 2
    finally:
        store.close()


def test_cron_times_are_read_in_the_configured_time_zone(store):
    gateway = gateway_on(store, cron_timezone="Europe/Berlin")
    schedule(gateway, b'"berlin"', b"0 9 * * *", headers=b"nohaste", now_us=utc_us("2026-11-23 06:00:00"))
    assert gateway.run_schedules(utc_us("2026-11-23 07:59:59")) == 0
    assert gateway.run_schedules(utc_us("2026-11-23 08:00:00")) == 1  # 09:00 in Berlin (UTC+1 in November)


def test_unschedule_of_the_same_job_removes_a_cron_schedule(store):
    gateway = gateway_on(store)
    job = b'["run", {"callable": "f", "path": "m", "args": [1], "kwargs": {}, "class_args": [], "class_kwargs": {}}]'
    schedule(gateway, job, b"* * * * *")
    assert len(gateway.schedules) == 1
    gateway.from_client([b"client", b"", V, b"UNSCHEDULE", mid(), b"jobs", b"", b"-1", job, b""], now=Now(T0, 1))
    assert gateway.schedules == {} and Schedules(store).raw() == []


def interval_schedule(gateway, seconds: bytes, headers: bytes, now_us: int) -> None:
    job = b'["run", {"callable": "tick", "path": "m", "args": [], "kwargs": {}, "class_args": [], "class_kwargs": {}}]'
    out = gateway.from_client(
        [b"client", b"", V, b"SCHEDULE", mid(), b"jobs", headers, seconds, job, b""], now=Now(T0, now_us)
    )
    assert out[0].frames[3] == b"ACK"


def test_an_interval_schedule_runs_now_then_an_interval_apart_until_its_run_count_is_spent(store):
    gateway = gateway_on(store)
    interval_schedule(gateway, b"10", b"run_count:2", now_us=0)
    assert gateway.run_schedules(0) == 1, "haste: the first run is at once"
    assert gateway.run_schedules(9_999_999) == 0
    assert gateway.run_schedules(10_000_000) == 1
    assert gateway.schedules == {} and Schedules(store).raw() == [], "run_count:2 spent"
    assert gateway.run_schedules(60_000_000) == 0 and store.queue("jobs").count == 2


def test_nohaste_waits_one_interval_and_a_pause_runs_a_schedule_once_then_on_time(store):
    gateway = gateway_on(store)
    interval_schedule(gateway, b"60", b"nohaste", now_us=0)
    assert gateway.run_schedules(0) == 0 and gateway.run_schedules(59_999_999) == 0
    assert gateway.run_schedules(60_000_000) == 1
    assert gateway.run_schedules(500_000_000) == 1, "after a pause: once, not once per missed interval"
    assert gateway.run_schedules(559_999_999) == 0 and gateway.run_schedules(560_000_000) == 1


def test_a_job_with_a_timeout_header_is_requeued_after_its_timeout_and_the_grace(store):
    from pzq.gateways.emqp_workers import TIMEOUT_GRACE_S

    gateway = gateway_on(store)
    gateway.from_client(
        [b"client", b"", V, b"REQUEST", b"req-1", b"jobs", b"timeout:2", b'"x"'], now=Now(T0, int(T0 * 1e6))
    )
    given_a_job(gateway)
    assert gateway.broker.expire(T0 + 2 + TIMEOUT_GRACE_S - 0.01) == 0, "--ack-timeout does not apply to jobs"
    assert gateway.broker.expire(T0 + 2 + TIMEOUT_GRACE_S + 0.01) == 1
    worker(gateway, b"w1", b"READY", now=T0 + 10)
    [again] = gateway.hand_out(now=Now(T0 + 10, int((T0 + 10) * 1e6)))
    assert again.frames[3] == b"REQUEST" and again.frames[4] == b"req-1"


def test_retry_count_caps_deliveries_then_the_job_is_dead_lettered(store):
    gateway = gateway_on(store)
    gateway.from_client(
        [b"client", b"", V, b"REQUEST", b"req-1", b"jobs", b"retry-count:1", b'"x"'], now=Now(T0, int(T0 * 1e6))
    )
    now = T0
    for peer in (b"w1", b"w2"):  # the first delivery and one retry, each to a worker that then dies
        given_a_job(gateway, peer, now=now)
        now += 3 * 3 + 1  # silent for liveness (3) x interval (3 s)
        gateway.tick(now)
        assert peer not in gateway.workers
    worker(gateway, b"w3", b"INFORM", b'[[10, "jobs"]]', b"worker", now=now)
    worker(gateway, b"w3", b"READY", now=now)
    assert gateway.hand_out(now=Now(now, int(now * 1e6))) == []
    assert store.queue("jobs").dead_count == 1 and store.queue("jobs").count == 0


@pytest.mark.parametrize("command", [b"REQUEST", b"SCHEDULE"])
def test_a_request_whose_headers_frame_is_over_the_limit_is_answered_with_an_error_and_not_stored(store, command):
    import dataclasses

    from pzq.limits import DEFAULT_LIMITS

    gateway = gateway_on(store, limits=dataclasses.replace(DEFAULT_LIMITS, emqp_header_bytes=64))
    args = [b"jobs", b"a" * 65, *([b"60", b"payload", b""] if command == b"SCHEDULE" else [b'"x"'])]
    [answer] = gateway.from_client([b"client", b"", V, command, b"m1", *args], now=Now(T0, int(T0 * 1e6)))
    assert answer.frames[3] == b"REPLY" and answer.frames[-1] == b"m1"
    assert b"refused: a headers frame of 65 bytes; at most 64" in answer.frames[5]
    assert store.queue("jobs", create=False) is None and gateway.schedules == {}
    assert gateway.counters["bad_input_total"] == 1


def test_a_requests_headers_are_parsed_once_from_its_arrival_to_its_reply(store, monkeypatch):
    from pzq.protocols import emqp

    parsed: list[str] = []
    real = emqp.parse_headers
    monkeypatch.setattr(emqp, "parse_headers", lambda text: parsed.append(text) or real(text))
    gateway = gateway_on(store)
    gateway.from_client(
        [b"client", b"", V, b"REQUEST", b"req-1", b"jobs", b"guarantee", b'"x"'], now=Now(T0, int(T0 * 1e6))
    )
    job = given_a_job(gateway)
    assert job[6] == b"guarantee,reply-requested", "the worker is still asked for its REPLY"
    assert worker(gateway, b"w1", b"REPLY", b'"done"', b"req-1", now=T0) == [], "the client did not ask for it"
    assert parsed == ["guarantee"]


def test_a_job_stored_before_the_reply_flag_is_still_dispatched_and_its_reply_forwarded(store):
    # A REQUEST stored by an older pzq keeps the client's headers text only: read as before.
    gateway = gateway_on(store)
    meta = {"client": b"client", "msgid": "req-1", "headers": "reply-requested"}
    gateway.broker.produce("jobs", [b'"x"'], now_us=int(T0 * 1e6), meta=meta)
    job = given_a_job(gateway)
    assert job[6] == b"reply-requested"
    [forwarded] = worker(gateway, b"w1", b"REPLY", b'"done"', b"req-1", now=T0)
    assert forwarded.frames[0] == b"client" and forwarded.frames[-1] == b"req-1"
