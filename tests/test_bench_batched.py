"""`pzq bench --client batched|both`: PZQ-BATCH/1 producers and consumers measured beside the legacy
ones, with the same messages in flight. As in tests/test_bench.py, the figures' counts are checked, never
how fast anything was."""

from __future__ import annotations

import importlib.util
import queue
import subprocess
import sys
import threading
from pathlib import Path

from click.testing import CliRunner

from pzq.bench.batched import run_batched_producer
from pzq.bench.server import free_ports
from pzq.bench.workers import ProducerJob
from pzq.cli import cli
from tests.test_bench import assert_end_to_end, assert_producer_phase, assert_rate, assert_server_cost, bench


def test_batched_and_legacy_clients_run_side_by_side_and_lose_nothing(tmp_path):
    result, stdout = bench(
        tmp_path,
        *("--client", "both", "--batch-size", "30", "--runs", "1", "--count", "800", "--latency-count", "20"),
        *("--rate", "1000", "--paced-seconds", "0.2", "--producers", "2", "--consumers", "2", "--no-ceiling"),
        "--quiet",
    )
    run = result["runs"][0]
    assert_producer_phase(run["producer_w100"], 800)  # the legacy phases are all still there
    assert_end_to_end(run["e2e"], 800)
    assert_producer_phase(run["producer_batched"], 800)  # 800 in batches of 30: the last of each producer short
    drain = run["consumer_batched"]
    assert (drain["messages"], drain["received"]) == (800, 800), drain
    assert_rate(drain, "received")
    assert_end_to_end(run["e2e_batched"], 800)
    for phase in ("producer_batched", "consumer_batched", "e2e_batched"):
        assert_server_cost(run[phase])
    assert "batched end to end (msg/s)" in stdout and "server CPU µs/msg, batched W" in stdout
    assert "both clients, batches of 30" in stdout


def test_batched_alone_runs_no_legacy_phase_and_no_ceiling(tmp_path):
    # A batch bigger than the window is cut to the window: the messages in flight stay those asked for.
    result, stdout = bench(
        tmp_path, *("--client", "batched", "--batch-size", "5000", "--window", "40", "--runs", "1"), "--count", "300"
    )
    run = result["runs"][0]
    assert_producer_phase(run["producer_batched"], 300)
    assert_end_to_end(run["e2e_batched"], 300)
    assert not {"producer_w1", "producer_w100", "consumer", "e2e", "e2e_paced"} & set(run)
    assert not any(key.startswith("ceiling") for key in run)
    assert "window 1" not in stdout


def test_batched_options_are_refused_where_they_mean_nothing():
    result = CliRunner().invoke(cli, ["bench", "--protocol", "phpmq", "--client", "batched"])
    assert (result.exit_code, result.output.strip()) == (2, "pzq: error: --client: not used by --protocol phpmq")
    result = subprocess.run(
        [sys.executable, "-m", "pzq", "bench", "--client", "batched", "--batch-size", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--batch-size" in result.stderr


class _Counter:
    """The progress counter's surface (``value``, ``get_lock``) for a producer run in this process."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def get_lock(self) -> threading.Lock:
        return self._lock


def test_a_batched_producer_against_a_server_without_batches_reports_it_instead_of_waiting():
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    # The no-storage echo server acks anything with "1" and "": not a probe answer. (A subprocess, not
    # multiprocessing: spawn's resource tracker would outlive the test.) ZeroMQ connects once it binds.
    code = (
        "import threading; from pzq.bench.workers import run_echo_server; "
        f"run_echo_server({endpoint!r}, threading.Event())"
    )
    echo = subprocess.Popen([sys.executable, "-c", code])
    try:
        results: queue.Queue = queue.Queue()
        job = ProducerJob(endpoint, 0, 10, 10, 100, batch=5, timeout_s=20)
        run_batched_producer(job, threading.Barrier(1), _Counter(), results)
        outcome = results.get(timeout=10)
    finally:
        echo.kill()
        echo.wait(30)
    assert (outcome.acked, outcome.refused) == (0, 0)
    assert outcome.error == "the server does not speak PZQ-BATCH/1"


def _compare_peers():
    path = Path(__file__).resolve().parent.parent / "scripts" / "compare_peers.py"
    spec = importlib.util.spec_from_file_location("compare_peers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_peer_table_shows_batched_and_legacy_pzq_under_the_same_figures_and_judges_the_targets():
    peers = _compare_peers()
    run = {
        "producer_batched": {"msg_s": 300, "server_cpu_us": 4},
        "consumer_batched": {"server_cpu_us": 9},
        "e2e_batched": {"msg_s": 120, "server_cpu_us": 13, "lost": 0},
        "producer_w100": {"msg_s": 50, "server_cpu_us": 20},
        "producer_w1": {"ack_p50_ms": 0.5},
        "e2e": {"server_cpu_us": 30},
        "server_rss_mb": 30,
    }
    columns = peers.columns(run)
    assert columns["pzq batched"] == {
        "producer_w100.msg_s": 300,
        "producer_w100.server_cpu_us": 4,
        "consumer.server_cpu_us": 9,
        "e2e.msg_s": 120,
        "e2e.server_cpu_us": 13,
        "e2e.lost": 0,
    }
    assert columns["pzq legacy"] == {
        "producer_w100.msg_s": 50,
        "producer_w100.server_cpu_us": 20,
        "producer_w1.ack_p50_ms": 0.5,
        "e2e.server_cpu_us": 30,
    }
    results = {
        **columns,
        "pzq before": {"producer_w100.msg_s": 40, "e2e.server_cpu_us": 60, "producer_w1.ack_p50_ms": 0.5},
        "redis": {"producer_w100.msg_s": 100, "e2e.msg_s": 100},
    }
    lines = peers.table(results, ["pzq batched", "pzq legacy", "pzq before", "redis"])
    produce = next(line for line in lines if line.startswith("producer, N in flight"))
    assert produce.split()[-8:] == ["300", "50", "40", "100", "3.00x", "0.50x", "0.40x", "1.25x"]
    assert [line for line in lines if line.startswith("target")] == [
        "target pzq batched producer_w100.msg_s / redis >= 1.5: 3 met",
        "target pzq batched e2e.msg_s / redis >= 1: 1.2 met",
        "target pzq batched consumer.server_cpu_us <= 8: 9 NOT met",
        "target pzq legacy producer_w100.msg_s / pzq before >= 1: 1.25 met",
        "target pzq legacy e2e.server_cpu_us / pzq before <= 0.7: 0.5 met",
        "target pzq legacy producer_w1.ack_p50_ms / pzq before <= 1: 1 met",
    ]
