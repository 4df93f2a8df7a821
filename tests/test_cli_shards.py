"""`pzq shards run N` as a real process: its shard list, its N `pzq serve` children (each its shard, each
answering WHERE from the list), one of them killed (said, not restarted), and all stopped on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pzq import shards
from pzq.clients.admin import admin_request
from pzq.clients.api import ApiClient

from conftest import wait_until

pytestmark = pytest.mark.timeout(120)


class Lines:
    """A child's output read line by line in a thread, waited on with a timeout."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = 60) -> re.Match:
        found: list[re.Match] = []

        def seen() -> bool:
            found[:] = [m for m in (re.search(pattern, line) for line in self.lines) if m]
            return bool(found)

        wait_until(seen, timeout_s)
        return found[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def run(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Lines, Lines]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pzq", "shards", "run", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    return proc, Lines(proc.stdout), Lines(proc.stderr)


def test_shards_run_starts_n_shards_of_one_list_says_one_that_dies_and_stops_the_rest_on_sigterm(tmp_path):
    proc, out, err = run(tmp_path, "2", "--dir", "d")
    try:
        out.wait_for("Ctrl-C")
        listed = shards.load(str(tmp_path / "d" / "shards.toml"))
        assert listed.names() == ["s0", "s1"]
        pids = {m.group(1): int(m.group(2)) for m in map(re.compile(r"^  (s\d) \(pid (\d+)").match, out.lines) if m}
        assert set(pids) == {"s0", "s1"}
        for shard in listed.shards:
            answer = admin_request(shard.monitor_dsn, ["WHERE", "orders"], timeout_s=10)
            assert isinstance(answer, dict) and answer["shard"] == shard.name
            assert answer["shards"] == listed.to_dict()
        with ApiClient(listed.named("s1").api_dsn, timeout_s=10) as api:
            assert api.produce([("orders", b"kept")])["count"] == 1
        os.kill(pids["s0"], signal.SIGKILL)
        err.wait_for(r"shard s0 exited with status -9")
        assert alive(pids["s1"])  # (the others serve on; nothing is restarted)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert children == [str(pids["s1"])]  # (s0 reaped, not started again)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out.wait_for("stopped 2 shards")
    wait_until(lambda: not alive(pids["s1"]), 10)


def test_a_runner_killed_outright_takes_its_shards_with_it(tmp_path):
    """Its children are in sessions of their own (Ctrl-C reaches only the runner): a runner killed with
    SIGKILL had left them serving, orphans holding their stores and ports."""
    proc, out, _err = run(tmp_path, "2", "--dir", "d")
    try:
        out.wait_for("Ctrl-C")
        pids = [int(m.group(1)) for m in map(re.compile(r"^  s\d \(pid (\d+)").match, out.lines) if m]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_until(lambda: not any(alive(pid) for pid in pids), 30), pids
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_options_after_a_double_dash_go_to_every_shard_and_a_second_run_keeps_the_names(tmp_path):
    for _ in range(2):  # (the same stores again: each is still the shard it was)
        proc, out, _err = run(tmp_path, "1", "--dir", "d", "--", "--max-queues", "7")
        try:
            out.wait_for("Ctrl-C")
            pid = int(out.wait_for(r"s0 \(pid (\d+)").group(1))
            assert b"--max-queues\x007" in Path(f"/proc/{pid}/cmdline").read_bytes()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert "shard 's0'" in (tmp_path / "d" / "s0.log").read_text()


def test_a_count_that_is_not_1_to_64_is_one_line_and_exit_2(tmp_path):
    for count in ("0", "65", "x"):
        done = subprocess.run(
            [sys.executable, "-m", "pzq", "shards", "run", count], capture_output=True, text=True, cwd=tmp_path
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "pzq: error:" in done.stderr
        assert not (tmp_path / "pzq-shards").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["1", "--", "--shard", "x"], "--shard after --: `pzq shards run` sets it for each shard itself"),
        (["1", "--", "--mqks-dsn=tcp://127.0.0.1:1"], "--mqks-dsn after --"),
        (["1", "--dir", "a-file/sub"], "--dir a-file/sub: "),
    ],
)
def test_a_serve_option_the_runner_sets_or_a_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path, args, said):
    (tmp_path / "a-file").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "pzq", "shards", "run", *args], capture_output=True, text=True, cwd=tmp_path, timeout=30
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert not (tmp_path / "pzq-shards").exists()


def test_the_development_flow_three_shards_a_queue_of_six_partitions_made_on_each_and_found(tmp_path):
    proc, out, _err = run(tmp_path, "3", "--dir", "d")
    try:
        out.wait_for("Ctrl-C")
        listed = str(tmp_path / "d" / "shards.toml")
        pzq = [sys.executable, "-m", "pzq", "queue"]
        made = subprocess.run([*pzq, "create", "jobs", "--partitions", "6", "--cluster", listed], **QUIET)
        assert made.returncode == 0 and made.stdout.count("'jobs' has 6 partitions") == 3, made.stdout + made.stderr
        placed = shards.load(listed).place("jobs", 6)
        queue, home = placed[4]
        with ApiClient(home.api_dsn, timeout_s=10) as api:
            assert api.produce([(queue, b"1"), (queue, b"2")])["count"] == 2
        found = subprocess.run([*pzq, "where", "jobs", "--cluster", listed], **QUIET)
        assert found.returncode == 0, found.stderr
        assert re.search(rf"shard {home.name}: .*{re.escape(queue)}: 2", found.stdout), found.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


QUIET = {"capture_output": True, "text": True, "timeout": 60, "env": {**os.environ, "PZQ_CONFIG": ""}}


def test_a_second_run_in_the_dir_of_one_that_serves_is_refused_and_leaves_its_list_as_it_was(tmp_path):
    """Before, the second run wrote its list over the first's (the first's clients then reached nobody),
    took the first's shards, answering at the same ipc monitors, for its own, and printed ports nobody
    served: its children had found their stores in use."""
    proc, out, _err = run(tmp_path, "2", "--dir", "d")
    try:
        out.wait_for("Ctrl-C")
        first = (tmp_path / "d" / "shards.toml").read_text()
        again = subprocess.run([sys.executable, "-m", "pzq", "shards", "run", "2", "--dir", "d"], cwd=tmp_path, **QUIET)
        assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
        assert "earlier run serve there still (s0, s1)" in again.stderr
        assert (tmp_path / "d" / "shards.toml").read_text() == first
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_sigterm_while_the_shards_start_stops_them_and_announces_nothing_it_does_not_serve(tmp_path):
    """Before, a SIGTERM while the children started was followed by the list, "Ctrl-C (or SIGTERM) stops
    them all" and "not answering after 30 s" for shards that had been told to stop, not slow ones."""
    proc, out, err = run(tmp_path, "3", "--dir", "d")
    try:
        assert wait_until(lambda: (tmp_path / "d" / "s0.log").exists(), 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out.wait_for(r"stopped [1-3] shards")
    assert not any("Ctrl-C" in line for line in out.lines), out.lines
    assert not any("not answering" in line for line in err.lines), err.lines


def test_shards_that_exit_at_start_are_each_said_once_and_the_run_ends_with_exit_1(tmp_path):
    """Before: each said twice ("exited at start", then "exited with status 2"), after the list and
    "Ctrl-C (or SIGTERM) stops them all" of shards that had never served."""
    done = subprocess.run(
        [sys.executable, "-m", "pzq", "shards", "run", "2", "--dir", "d", "--", "--max-queues", "0"],
        cwd=tmp_path,
        **QUIET,
    )
    assert done.returncode == 1
    assert done.stderr.count("shard s0 exited") == 1 and done.stderr.count("shard s1 exited") == 1, done.stderr
    assert "every shard exited at start" in done.stderr and "Ctrl-C" not in done.stdout
