"""`pzq bench` is a tool, not a timed test: its smoke test checks that it runs, reports every figure,
writes JSON and loses nothing. The figures themselves are reported by the tool, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_runs_end_to_end_and_reports_nothing_lost(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pzq",
            "bench",
            "--runs",
            "1",
            "--count",
            "600",
            "--latency-count",
            "50",
            "--rate",
            "1000",
            "--paced-seconds",
            "0.3",
            "--preload",
            "200",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "producer, window 1 (msg/s)" in result.stdout and "restart (s)" in result.stdout
    median = json.loads(out.read_text())["median"]
    assert median["producer_w1.msg_s"] > 0 and median["producer_w100.msg_s"] > 0
    assert median["consumer.msg_s"] > 0
    assert median["ceiling_w100.msg_s"] > 0 and median["ceiling_e2e.lost"] == 0
    assert median["producer_w100.refused"] == 0


def test_bench_end_to_end_phases_lose_and_duplicate_nothing(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pzq",
            "bench",
            "--runs",
            "1",
            "--count",
            "800",
            "--latency-count",
            "20",
            "--rate",
            "2000",
            "--paced-seconds",
            "0.3",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--no-ceiling",
            "--transport",
            "ipc",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    median = json.loads(out.read_text())["median"]
    assert (median["e2e.lost"], median["e2e.duplicated"]) == (0, 0)
    assert (median["e2e_paced.lost"], median["e2e_paced.duplicated"]) == (0, 0)
    assert median["e2e.msg_s"] > 0


def test_bench_refuses_a_body_too_small_to_stamp():
    result = subprocess.run(
        [sys.executable, "-m", "pzq", "bench", "--size", "8"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--size" in result.stderr


def test_bench_draws_the_latency_distribution_as_a_png(tmp_path):
    picture = tmp_path / "latency.png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pzq",
            "bench",
            "--runs",
            "1",
            "--count",
            "300",
            "--latency-count",
            "30",
            "--rate",
            "1000",
            "--paced-seconds",
            "0.2",
            "--no-ceiling",
            "--quiet",
            "--json",
            str(tmp_path / "b.json"),
            "--plot",
            str(picture),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_through_the_phpmq_gateway_loses_nothing(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pzq",
            "bench",
            "--protocol",
            "phpmq",
            "--runs",
            "1",
            "--count",
            "500",
            "--rate",
            "1000",
            "--paced-seconds",
            "0.3",
            "--quiet",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    median = json.loads(out.read_text())["median"]
    assert (median["e2e.lost"], median["e2e.duplicated"]) == (0, 0)
    assert median["send.msg_s"] > 0 and median["consumer.msg_s"] > 0


def test_the_mqks_rate_script_runs_and_reports_a_rate():
    script = Path(__file__).resolve().parent.parent / "scripts" / "mqks_rate.py"
    result = subprocess.run(
        [sys.executable, str(script), "--messages", "300", "--runs", "1"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "median:" in result.stdout and "msg/s" in result.stdout
