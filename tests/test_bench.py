"""`pzq bench` is a tool, not a timed test: its smoke tests run each --protocol with small counts and
check what a user would check in the JSON it writes: every message sent was acked and received once
(nothing lost, nothing duplicated, nothing left), each rate is its count over its seconds, and latency
percentiles are in order. How fast anything was is reported by the tool, never asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pzq.bench.report import lost_or_duplicated
from pzq.cli import cli


def bench(tmp_path, *args: str, timeout: float = 240) -> tuple[dict, str]:
    """Run `pzq bench ARGS --json FILE` as a user would; its JSON and what it printed."""
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "pzq", "bench", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return json.loads(out.read_text()), result.stdout


def assert_rate(figures: dict, count_key: str, rate_key: str = "msg_s", seconds_key: str = "seconds") -> None:
    """The rate is its count over its seconds (within 1 %, or the rounding to a whole number)."""
    count, seconds, rate = figures[count_key], figures[seconds_key], figures[rate_key]
    assert seconds > 0, figures
    assert abs(rate - count / seconds) <= max(0.01 * count / seconds, 0.5), (rate_key, figures)


def assert_latencies_ordered(figures: dict, prefix: str) -> None:
    p50, p99, p999, top = (figures[f"{prefix}_{p}_ms"] for p in ("p50", "p99", "p999", "max"))
    assert 0 <= p50 <= p99 <= p999 <= top, figures


def assert_producer_phase(figures: dict, messages: int) -> None:
    assert (figures["messages"], figures["acked"], figures["refused"]) == (messages, messages, 0), figures
    assert_rate(figures, "acked")
    assert_latencies_ordered(figures, "ack")


def assert_server_cost(figures: dict) -> None:
    """The server's CPU per message is its CPU seconds over the phase's messages. (A phase of a few
    hundred messages may take less than one clock tick of /proc's CPU time, 10 ms: 0 is possible.)"""
    per_message = figures["server_cpu_s"] / figures["messages"] * 1e6
    assert figures["server_cpu_s"] >= 0 and abs(figures["server_cpu_us"] - per_message) <= 0.01, figures


def assert_end_to_end(figures: dict, messages: int) -> None:
    assert (figures["acked"], figures["refused"], figures["received"]) == (messages, 0, messages), figures
    assert (figures["lost"], figures["duplicated"]) == (0, 0), figures
    assert_rate(figures, "received")
    assert_latencies_ordered(figures, "lat")


def test_bench_runs_every_phase_and_its_figures_add_up(tmp_path):
    result, stdout = bench(
        tmp_path,
        *("--runs", "1", "--count", "600", "--latency-count", "50", "--rate", "1000", "--paced-seconds", "0.3"),
        *("--preload", "200", "--quiet"),
    )
    assert "producer, window 1 (msg/s)" in stdout and "restart (s)" in stdout
    run = result["runs"][0]
    assert_producer_phase(run["producer_w1"], 50)
    assert_producer_phase(run["producer_w100"], 600)
    assert run["producer_w1"]["commits"] >= 1  # window 1: each ack waited for a commit
    for phase in ("producer_w1", "producer_w100", "consumer"):
        assert_server_cost(run[phase])
    assert sum(run[phase]["server_cpu_s"] for phase in ("producer_w1", "producer_w100", "consumer")) > 0
    assert "server CPU µs/msg, window W" in stdout
    drain = run["consumer"]
    assert drain["messages"] == 650 and 650 <= drain["received"] <= 650 + 200, drain  # the preload may come too
    assert_rate(drain, "received")
    assert "e2e" not in run  # a backlog (the preload) would be consumed first
    assert_producer_phase(run["ceiling_w1"], 50)
    assert_producer_phase(run["ceiling_w100"], 600)
    assert_end_to_end(run["ceiling_e2e"], 600)
    assert_end_to_end(run["ceiling_paced"], 300)
    assert run["restart_s"] > 0 and run["server_rss_mb"] > 0
    assert result["median"]["producer_w100.msg_s"] == run["producer_w100"]["msg_s"]  # one run: its own median


def test_bench_end_to_end_phases_lose_and_duplicate_nothing(tmp_path):
    result, _ = bench(
        tmp_path,
        *("--runs", "1", "--count", "800", "--latency-count", "20", "--rate", "2000", "--paced-seconds", "0.3"),
        *("--producers", "2", "--consumers", "2", "--no-ceiling", "--transport", "ipc", "--quiet"),
    )
    run = result["runs"][0]
    assert_producer_phase(run["producer_w1"], 20)
    assert_producer_phase(run["producer_w100"], 800)
    assert (run["consumer"]["messages"], run["consumer"]["received"]) == (820, 820)  # both producer phases' messages
    assert_rate(run["consumer"], "received")
    assert_end_to_end(run["e2e"], 800)
    assert_end_to_end(run["e2e_paced"], 600)  # 2,000/s for 0.3 s
    assert not any(key.startswith("ceiling") for key in run)


def test_bench_refuses_a_body_too_small_to_stamp():
    result = subprocess.run(
        [sys.executable, "-m", "pzq", "bench", "--size", "8"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--size" in result.stderr


def test_bench_refuses_options_the_protocol_does_not_read():
    result = CliRunner().invoke(cli, ["bench", "--protocol", "mqks", "--preload", "5", "--window", "3"])
    assert result.exit_code == 2
    assert result.output.strip() == "pzq: error: --preload, --window: not used by --protocol mqks"
    result = CliRunner().invoke(cli, ["bench", "--protocol", "emqp", "--size", "5"])
    assert (result.exit_code, result.output.strip()) == (2, "pzq: error: --size: not used by --protocol emqp")


def test_lost_duplicated_or_left_messages_in_any_run_are_named():
    clean = {"e2e": {"lost": 0, "duplicated": 0}, "send_then_consume": {"messages": 5, "distinct": 5, "left": 0}}
    assert lost_or_duplicated({"runs": [clean, {"pzq": {"jobs": 3, "finished": 3}}]}) == []
    bad = [
        {"e2e_paced": {"lost": 1, "duplicated": 0}},
        {"e2e": {"lost": 0, "duplicated": 2}},
        {"messages": 5, "distinct": 4, "left": 0},
        {"messages": 5, "distinct": 5, "left": 1},
        {"reference": {"jobs": 3, "finished": 4}},
    ]
    assert lost_or_duplicated({"runs": [clean, *bad]}) == [
        "run 2: e2e_paced.lost 1",
        "run 3: e2e.duplicated 2",
        "run 4: distinct 4",
        "run 5: left 1",
        "run 6: reference.finished 4",
    ]
    assert lost_or_duplicated({"runs": [{"ceiling_e2e": {"lost": 1}}]}) == []  # the ceiling is not pzq


def test_bench_draws_the_latency_distribution_as_a_png(tmp_path):
    picture = tmp_path / "latency.png"
    bench(
        tmp_path,
        *("--runs", "1", "--count", "300", "--latency-count", "30", "--rate", "1000", "--paced-seconds", "0.2"),
        *("--no-ceiling", "--quiet", "--plot", str(picture)),
    )
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_through_the_phpmq_gateway_loses_nothing(tmp_path):
    result, stdout = bench(
        tmp_path, "--protocol", "phpmq", "--runs", "1", "--count", "500", "--rate", "1000", "--paced-seconds", "0.3"
    )
    assert "send -> consume -> ack (msg/s)" in stdout
    run = result["runs"][0]
    assert (run["send"]["acked"], run["send"]["refused"]) == (500, 0)  # written: PHPMQ has no receipt
    assert_rate(run["send"], "acked")
    assert (run["consumer"]["messages"], run["consumer"]["received"]) == (500, 500)
    assert_rate(run["consumer"], "received")
    assert_end_to_end(run["e2e"], 500)
    assert_end_to_end(run["e2e_paced"], 300)
    rate = run["send_then_consume"]
    counts = [rate[key] for key in ("messages", "stored", "received", "distinct", "left")]
    assert counts == [500, 500, 500, 500, 0], rate
    for part in ("send_", "consume_", ""):
        assert_rate(rate, "messages", f"{part}msg_s", f"{part}seconds")
    assert rate["seconds"] == pytest.approx(rate["send_seconds"] + rate["consume_seconds"], abs=2e-6)


def test_bench_through_the_mqks_gateway_acks_every_message_once(tmp_path):
    result, stdout = bench(tmp_path, "--protocol", "mqks", "--messages", "300", "--runs", "2", "--size", "20")
    runs = result["runs"]
    assert len(runs) == 2
    for run in runs:
        assert (run["messages"], run["received"], run["distinct"], run["left"]) == (300, 300, 300, 0), run
        assert_rate(run, "messages")
    lines = stdout.splitlines()
    first = f"run 1: {runs[0]['msg_s']:,} msg/s (publish -> consume -> ack, manual ack, 300 messages of 20 B)"
    assert lines[0] == first
    assert lines[1].startswith(f"run 2: {runs[1]['msg_s']:,} msg/s")
    assert lines[2].startswith(f"median: {statistics.median(r['msg_s'] for r in runs):,.0f} msg/s")


@pytest.mark.skipif(importlib.util.find_spec("eventmq") is None, reason="eventmq is installed by scripts/test")
def test_bench_through_a_real_eventmq_jobmanager_finishes_every_job_once(tmp_path):
    result, stdout = bench(tmp_path, "--protocol", "emqp", "--jobs", "30", "--concurrent", "2", "--broker", "pzq")
    figures = result["runs"][0]["pzq"]
    assert (figures["jobs"], figures["finished"]) == (30, 30)
    assert_rate(figures, "jobs", "jobs_s")
    assert stdout.splitlines()[0] == f"pzq        30 trivial jobs, one JobManager x2: {figures['jobs_s']:,} jobs/s"


def test_an_emqp_bench_process_that_died_is_named_at_once_with_its_log(tmp_path):
    from pzq.bench.emqp import _check_alive
    from pzq.errors import PzqError

    log = tmp_path / "router.log"
    with open(log, "wb") as err:
        dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit('no psutil here')"], stderr=err)
    dead.wait(30)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _check_alive([("JobManager", alive, ""), ("pzq server", None, "")])  # running or not started: fine
        with pytest.raises(PzqError, match="the reference router exited with 1: no psutil here"):
            _check_alive([("JobManager", alive, ""), ("reference router", dead, str(log))])
    finally:
        alive.kill()
        alive.wait(30)


def test_the_cpu_of_a_process_tree_counts_a_busy_child_and_not_an_unrelated_process():
    import os
    import time

    from pzq.bench.server import cpu_seconds
    from pzq.bench.spark import tree_cpu_seconds

    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nsys.stdin.read()"
    before = tree_cpu_seconds(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while cpu_seconds(child.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds(child.pid) >= 0.3
        # (/proc counts in clock ticks of 10 ms, and their float difference may fall a hair under)
        assert tree_cpu_seconds(os.getpid()) - before >= 0.3 - 0.011
        assert tree_cpu_seconds(child.pid) == pytest.approx(cpu_seconds(child.pid), abs=0.05)  # (none of ours)
    finally:
        child.communicate(b"", timeout=30)


def test_the_spark_bench_children_run_this_pzq_even_from_another_checkouts_directory(tmp_path):
    from pzq.bench.spark import this_pzq_first

    decoy = tmp_path / "pzq"  # (another checkout's package, where `python -m` would look first)
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy pzq')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    argv = [sys.executable, "-m", "pzq", "--help"]
    fooled = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert "the decoy pzq" in fooled.stderr  # (what the bench's server and Spark's workers did)
    ours = subprocess.run(argv, cwd=tmp_path, env=this_pzq_first(env), capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0 and "serve" in ours.stdout
