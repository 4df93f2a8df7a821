"""scripts/cluster_bench.py at a tiny size, as a user runs it: every phase runs (one server, two shards,
one shard with the other stopped), nothing is lost, and each figure is what it is computed from. How fast
anything went is the script's to print, never a test's to check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_cluster_bench_runs_every_phase_at_a_tiny_size_and_its_figures_add_up(tmp_path):
    out = tmp_path / "cluster.json"
    argv = [sys.executable, str(ROOT / "scripts" / "cluster_bench.py"), "--count", "600", "--runs", "1"]
    argv += ["--window", "20", "--batch-size", "10", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    (r,) = summary["rounds"]
    one, shards, alone = r["one"], r["shards"], r["alone"]
    for phase, messages in ((one, 600), (shards[0], 300), (shards[1], 300), (alone, 300)):
        assert (phase["messages"], phase["received"], phase["lost"], phase["duplicated"]) == (messages,) * 2 + (0, 0)
        assert abs(phase["msg_s"] - phase["received"] / phase["seconds"]) <= max(0.01 * phase["msg_s"], 1), phase
        assert abs(phase["server_cpu_us"] - phase["server_cpu_s"] / messages * 1e6) <= 0.01, phase
        assert "error" not in phase, phase
    assert r["two"]["received"] == 600
    # the same client processes, each on both shards: both shards took some, every message once
    wide = r["wide"]
    assert (wide["received"], wide["lost"], wide["duplicated"]) == (600, 0, 0) and "error" not in wide, wide
    assert sum(s["messages"] for s in wide["servers"]) == 600 and all(s["messages"] for s in wide["servers"])
    assert r["ratio"] == round(wide["msg_s"] / one["msg_s"], 3)
    assert r["split_ratio"] == round(r["two"]["msg_s"] / one["msg_s"], 3)
    assert 0 <= r["idle_pct"] <= 100
    assert all(phase["clients_cpu_us"] > 0 for phase in (one, wide, shards[0], alone))
    assert r["alone_ratio"] == round(alone["msg_s"] / shards[1]["msg_s"], 3)
    assert "every client on both) / one" in result.stdout and "medians of 1 (" in result.stdout


def test_with_profile_the_cluster_bench_prints_the_loops_own_cpu_of_one_server_beside_a_shards(tmp_path):
    argv = [sys.executable, str(ROOT / "scripts" / "cluster_bench.py"), "--count", "600", "--window", "20"]
    argv += ["--batch-size", "10", "--profile", str(tmp_path / "profiles")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert {p.name for p in (tmp_path / "profiles").iterdir()} == {"one.prof", "s0.prof", "s1.prof"}
    table = result.stdout.partition("µs a message")[2]
    assert "(all)" in table and "_turn" in table, result.stdout
