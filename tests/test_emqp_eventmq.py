"""The real eventmq 0.3.13 client (Sender + defer_job) and JobManager workers against pzq's eMQP gateway.

Workers run as subprocesses in their own sessions (a JobManager forks its job processes), with
tests/ on their path so that they can import tests/eventmq_app/jobs.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_tcp_endpoint, wait_until

eventmq = pytest.importorskip("eventmq", reason="eventmq is installed by scripts/test")
from eventmq.client.messages import defer_job, schedule  # noqa: E402
from eventmq.sender import Sender  # noqa: E402

TESTS = Path(__file__).parent


class Workers:
    """Start and stop real JobManager processes."""

    def __init__(self, backend: str, log_dir: Path):
        self.backend = backend
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, queue: str = "jobs", concurrent: int = 2) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "eventmq_app.worker", self.backend, queue, str(concurrent)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for proc in self.procs:
            self.kill(proc)
            proc.wait(10)


@pytest.fixture
def emqp_server(process_server, tmp_path):
    """(server, frontend, workers); a JobManager heartbeats every 3 s, so liveness must exceed that:
    1 s x 4 notices a dead worker within about 4 s."""
    front, _ = free_tcp_endpoint()
    back, _ = free_tcp_endpoint()
    server = process_server(
        "--emqp-frontend-dsn",
        front,
        "--emqp-backend-dsn",
        back,
        "--emqp-heartbeat-interval",
        "1",
        "--emqp-heartbeat-liveness",
        "4",
    )
    workers = Workers(back, tmp_path)
    yield server, front, workers
    workers.close()


def sender(front: str) -> Sender:
    s = Sender()
    s.connect(front)
    return s


def replies(s: Sender, n: int, timeout_s: float = 20) -> dict[str, str]:
    """request msgid -> reply JSON, for the next n REPLYs (ACKs are skipped)."""
    out = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} replies arrived"
        if s.zsocket.poll(200):
            frames = s.recv_multipart()
            if frames[2] == "REPLY":
                out[frames[5]] = frames[4]
    return out


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_real_jobs_run_on_a_real_job_manager_and_replies_reach_the_client(emqp_server):
    server, front, workers = emqp_server
    workers.start()
    s = sender(front)
    ids = {defer_job(s, "eventmq_app.jobs.add", args=[i, i], queue="jobs", reply_requested=True): i for i in range(6)}
    got = replies(s, 6)
    assert {ids[m]: value for m, value in got.items()} == {i: f'{{"value": {2 * i}}}' for i in range(6)}
    wait_until(lambda: server.stats()["queues"]["jobs"]["depth"] == 0)


def test_a_job_of_a_worker_killed_mid_job_runs_again_on_another_worker(emqp_server, tmp_path):
    server, front, workers = emqp_server
    trace = tmp_path / "trace"
    first = workers.start(concurrent=1)
    s = sender(front)
    defer_job(s, "eventmq_app.jobs.mark", args=[str(trace), "slow", 30], queue="jobs")
    wait_until(lambda: lines(trace) == ["start slow"], timeout_s=20)
    workers.kill(first)
    workers.start(concurrent=1)
    wait_until(lambda: lines(trace).count("start slow") == 2, timeout_s=20)
    # (its connection's end drops it at once; silence, after liveness x interval, where none is seen)
    figures = server.stats()["emqp"]
    assert figures["worker_connections_closed_total"] + figures["dead_workers_total"] >= 1


def test_a_worker_stopped_with_sigterm_finishes_its_job_which_runs_only_once(emqp_server, tmp_path):
    server, front, workers = emqp_server
    trace = tmp_path / "trace"
    first = workers.start(concurrent=1)
    s = sender(front)
    msgid = defer_job(s, "eventmq_app.jobs.mark", args=[str(trace), "once", 2], queue="jobs", reply_requested=True)
    wait_until(lambda: lines(trace) == ["start once"], timeout_s=20)
    first.send_signal(signal.SIGTERM)  # to the JobManager only: it sends KBYE, then drains its jobs
    workers.start(concurrent=1)
    assert replies(s, 1) == {msgid: '{"value": "once"}'}
    wait_until(lambda: server.stats()["queues"]["jobs"]["depth"] == 0)
    assert lines(trace) == ["start once", "done once"]


def test_a_job_running_across_a_broker_kill_9_is_completed_by_its_reply_and_runs_once(emqp_server, tmp_path):
    server, front, workers = emqp_server
    trace = tmp_path / "trace"
    workers.start(concurrent=1)
    s = sender(front)
    msgid = defer_job(s, "eventmq_app.jobs.mark", args=[str(trace), "long", 4], queue="jobs", reply_requested=True)
    wait_until(lambda: lines(trace) == ["start long"], timeout_s=20)
    server.restart(signal.SIGKILL)  # the JobManager and its running job outlive the broker
    wait_until(lambda: server.stats()["queues"]["jobs"]["depth"] == 0, timeout_s=30)  # its REPLY completed it
    assert lines(trace) == ["start long", "done long"], "the job ran once"
    assert server.stats()["emqp"]["replies_total"] == 1
    assert msgid  # (the client's socket went with the old broker's connection; the job is what counts)


def test_requests_acked_before_a_broker_kill_9_all_run_after_the_restart(emqp_server, tmp_path):
    server, front, workers = emqp_server
    trace = tmp_path / "trace"
    s = sender(front)
    sent = [defer_job(s, "eventmq_app.jobs.mark", args=[str(trace), f"job{i}"], queue="jobs") for i in range(20)]
    acked = set()
    deadline = time.monotonic() + 10
    while len(acked) < 20 and time.monotonic() < deadline:
        if s.zsocket.poll(200):
            frames = s.recv_multipart()
            if frames[2] == "ACK":
                acked.add(frames[4])
    assert acked == set(sent)
    server.restart(signal.SIGKILL)
    workers.start()
    wait_until(lambda: sum(1 for line in lines(trace) if line.startswith("done")) >= 20, timeout_s=30)
    assert {line.split()[1] for line in lines(trace)} == {f"job{i}" for i in range(20)}


def test_a_real_cron_schedule_runs_its_job_and_unschedule_stops_it(emqp_server, tmp_path):
    server, front, workers = emqp_server
    trace = tmp_path / "trace"
    workers.start(concurrent=1)
    s = sender(front)
    schedule(s, "eventmq_app.jobs.mark", args=[str(trace), "cron"], cron="0 0 1 1 *", queue="jobs")
    wait_until(lambda: lines(trace) == ["start cron", "done cron"], timeout_s=20)  # haste: it runs at once
    assert server.stats()["emqp"]["schedules"] == 1  # and next on the 1st of January
    schedule(s, "eventmq_app.jobs.mark", args=[str(trace), "cron"], unschedule=True, queue="jobs")
    wait_until(lambda: server.stats()["emqp"]["schedules"] == 0)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_real_scheduler_daemon_stays_connected_across_four_of_its_heartbeat_timeouts(emqp_server, tmp_path):
    server, front, _ = emqp_server
    log = tmp_path / "scheduler.log"
    env = dict(
        os.environ,
        EVENTMQ_SCHEDULER_ADDR=front,
        EVENTMQ_REDIS_STARTUP_ERROR_HARD_KILL="false",
        EVENTMQ_CONFIG_FILE=str(tmp_path / "none.conf"),
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(sys.executable).parent / "emq-scheduler")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: server.stats()["emqp"]["schedulers"] == 1, timeout_s=20)
        # eventmq's scheduler gives the broker up after HEARTBEAT_TIMEOUT (5 s) without a heartbeat:
        # four of those without a reconnect show the gateway's heartbeats keep it (it was a minute).
        deadline = time.monotonic() + 4 * 5
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert "appears to have gone away" not in log.read_text(), log.read_text()[-2000:]
            time.sleep(1)  # (watching a real daemon for a while is the point of this test)
        assert log.read_text().count("Received ACK") == 1, "one INFORM, never a reconnect"
        assert server.stats()["emqp"]["schedulers"] == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_the_consoles_clients_page_lists_a_real_worker_its_slots_and_a_schedule(process_server, tmp_path):
    import json
    import urllib.request

    front, _ = free_tcp_endpoint()
    back, _ = free_tcp_endpoint()
    http, _ = free_tcp_endpoint()
    url = http.replace("tcp://", "http://")
    server = process_server("--emqp-frontend-dsn", front, "--emqp-backend-dsn", back, "--http-dsn", url)
    workers = Workers(back, tmp_path)

    def tables() -> dict:  # (the clients page's JSON twin; the console asks pzq at most once a second)
        try:
            with urllib.request.urlopen(url + "/api/clients", timeout=10) as answer:
                return {t["kind"]: t["rows"] for t in json.loads(answer.read())["tables"]}
        except OSError:
            return {}

    try:
        workers.start(concurrent=2)
        s = sender(front)
        schedule(s, "eventmq_app.jobs.mark", args=[str(tmp_path / "trace"), "c"], cron="0 0 1 1 *", queue="jobs")
        wait_until(lambda: lines(tmp_path / "trace") == ["start c", "done c"], timeout_s=20)
        wait_until(lambda: server.stats()["emqp"]["slots"] == 2, timeout_s=20)
        listed = wait_until(
            lambda: (
                (t := tables())
                and [[r["queues (weight)"], r["free slots"]] for r in t.get("emqp-workers", [])] == [["jobs (10)", 2]]
                and t
            ),
            timeout_s=20,
        )
        page = urllib.request.urlopen(url + "/clients", timeout=10).read().decode()
    finally:
        workers.close()
    [row] = listed["emqp-schedules"]
    assert [row["queue"], row["when"], row["next run"]] == ["jobs", "cron 0 0 1 1 *", "2027-01-01 00:00:00 UTC"]
    assert "cron 0 0 1 1 *" in page and "2027-01-01 00:00:00 UTC" in page
