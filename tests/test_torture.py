"""The torture benchmark's short run (a smoke test: it prints a table row per case; the figures are read
by people, not asserted, since a shared CI machine cannot keep to the latency targets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import torture  # noqa: E402 - the script's own directory


@pytest.mark.timeout(240)
def test_the_short_torture_run_prints_a_full_row_for_every_case():
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "torture.py"), "--short"], capture_output=True, text=True, timeout=230
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and not line.startswith("| case ")]
    assert [row.split(" | ")[0][2:] for row in rows] == list(torture.CASES)
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 2 + len(torture.CLIENTS) + 2, row
        assert "case failed" not in cells[1] and "server exited" not in cells[1], row
        for client, cell in zip(torture.CLIENTS, cells[2:-2], strict=True):
            assert cell == "-" or (cell.count("/") == 2 and " n=" in cell), f"{client}: {row}"
        assert cells[-2].isdigit() and cells[-1] in ("PASS", "FAIL"), row


def test_the_figures_are_the_median_the_99th_percentile_and_the_longest_wait_in_ms():
    p50, p99, longest = torture.figures([0.001] * 98 + [0.05, 0.2])
    assert (p50, p99, longest) == (1.0, 200.0, 200.0)
    assert torture.figures([]) == (0.0, 0.0, 0.0)
