"""Job functions a real eventmq JobManager runs in the tests (importable: tests/ is on its path)."""

from __future__ import annotations

import time


def add(a, b):
    return a + b


def mark(path, tag, seconds=0.0):
    """Append "start <tag>", wait, append "done <tag>": the file shows every run of the job."""
    with open(path, "a") as f:
        f.write(f"start {tag}\n")
    time.sleep(seconds)
    with open(path, "a") as f:
        f.write(f"done {tag}\n")
    return tag


def tally(path):
    """Append one byte: the file's size counts finished jobs, whoever runs them (a trivial job)."""
    with open(path, "ab") as f:
        f.write(b".")
