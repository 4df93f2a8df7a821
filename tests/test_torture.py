"""The torture benchmark's short run (a smoke test: it prints a line per case; figures are read by
people, not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "torture.py"


@pytest.mark.timeout(180)
def test_the_short_torture_run_reports_every_case_it_ran():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--short", *("--case", "deaf-producer", "--case", "mqks-rebind")]
        + ["--case", "console-flood"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["deaf-producer", "mqks-rebind", "console-flood"]
    assert "(queue depth 50)" in lines[2]
    assert all("honest ack p50" in line and " p99 " in line and "peak RSS" in line for line in lines)
