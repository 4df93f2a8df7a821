"""Upgrades: a store written by an older pzq opens with this one and keeps every record, and a store
written by a newer pzq is refused in one line (exit 3).

The old store is written by the code of commit db15207 (the last pzq without a format version of its
own to speak of: format 1, the first), taken out of git into a temporary directory and run in a child
interpreter through its own Store, Broker, Leases and side-table APIs. Every later change of a
record's layout raises ``pzq.store.FORMAT`` and adds such a test, from the commit before it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import lmdb
import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.leases import Leases
from pzq.store import FORMAT, Store
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.groups import Groups, LeaseRecords
from pzq.store.layout import U64
from pzq.store.schedules import Schedules

ROOT = Path(__file__).resolve().parent.parent
OLD = "db15207"  # main when the store got its format version: format 1

# Run by the old pzq (its Store, Broker, Leases and side tables), in a child interpreter; prints what
# it stored as JSON for the test to look for.
WRITE_OLD_STORE = r"""
import json, sys
import pzq
assert pzq.__file__.startswith(sys.argv[2]), pzq.__file__  # the old code, not this worktree's
from pzq.broker import Broker
from pzq.leases import Leases
from pzq.store import Store
from pzq.store.bindings import Binding, Bindings
from pzq.store.dedup_keys import DedupKeys, Produced
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules

NOW_US = 1_700_000_000_000_000
store = Store(sys.argv[1])
broker = Broker(store, ack_timeout_s=30)
facts = {}
ids = [broker.produce("jobs", [b"body-%d" % i, b"tail"], now_us=NOW_US + i).id for i in range(5)]
ids.append(broker.produce("jobs", [b"with-meta"], now_us=NOW_US, expires_us=NOW_US * 2,
                          meta={"client": "c1", "msgid": "m-5"}).id)
taken = broker.take("jobs", 2, "consumer-1", now=0.0, now_us=NOW_US)  # in flight, never acked
facts["jobs"] = ids
facts["in_flight"] = [m.id for m in taken]
doomed = broker.produce("poison", [b"bad"], now_us=NOW_US)
broker.produce("poison", [b"fine"], now_us=NOW_US)
store.dead_letter(doomed, "too many deliveries", now_us=NOW_US + 7)
facts["dead"] = doomed.id
Schedules(store).put("sched-1", {"queue": "jobs", "headers": "", "interval": 60, "payload": "p",
                                 "remaining": -1, "next_us": NOW_US + 60_000_000})
Schedules(store).put("sched-2", {"queue": "nightly", "headers": "", "interval": 0, "cron": "30 2 * * *",
                                 "payload": "q", "remaining": 2, "next_us": NOW_US + 120_000_000})
for i in range(5):
    broker.produce("spark", [b"row-%d" % i], now_us=NOW_US)
leases = Leases(broker, timeout_s=3600)
facts["leased"] = list(leases.lease("spark", "g1", 0, 3, now=0.0, now_us=NOW_US))
store.queue("mqks-q")
Bindings(store).put("mqks-q", Binding(["ev.a", "ev.b"], 30.0, True))
job = broker.produce("emqp", [b"job-body"], now_us=NOW_US, meta={"client": "w", "msgid": "job-1"})
(delivered,) = broker.take("emqp", 1, "worker-1", now=0.0, now_us=NOW_US)
EmqpJobs(store).put((delivered.qid, delivered.seq), ("job-1", b"worker-1", None))
facts["emqp"] = job.id
DedupKeys(store).put("key-1", Produced(NOW_US, 1, [b"\x01" * 16]))
store.commit()
store.close()
print(json.dumps(facts))
"""


def old_code(tmp: Path, commit: str = OLD) -> Path:
    """The pzq package of ``commit``, unpacked under ``tmp``; skips when git or the commit is missing."""
    try:
        found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    except FileNotFoundError:
        pytest.skip("git is not installed: the old pzq cannot be taken out of the history")
    if found.returncode != 0:
        pytest.skip(f"commit {commit} is not in this repository (a shallow clone?): no old pzq to write a store")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "pzq"], capture_output=True, check=True, timeout=60
    ).stdout
    target = tmp / "old"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def write_old_store(tmp: Path) -> tuple[Path, dict]:
    code = old_code(tmp)
    database = tmp / "db"
    env = {**os.environ, "PYTHONPATH": str(code)}
    child = subprocess.run(
        [sys.executable, "-c", WRITE_OLD_STORE, str(database), str(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,  # (python -c puts its working directory first on the path: not this worktree's pzq)
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    return database, json.loads(child.stdout.strip().splitlines()[-1])


def format_record(database: Path) -> int | None:
    env = lmdb.open(str(database), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            raw = txn.get(b"format", db=env.open_db(b"meta", txn=txn, create=False))
    finally:
        env.close()
    return None if raw is None else U64.unpack(raw)[0]


def set_format(database: Path, version: int | None) -> None:
    """Write (or, with None, remove) the store's format record behind pzq's back."""
    env = lmdb.open(str(database), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            meta = env.open_db(b"meta", txn=txn)
            if version is None:
                txn.delete(b"format", db=meta)
            else:
                txn.put(b"format", U64.pack(version), db=meta)
    finally:
        env.close()


def test_a_store_written_by_db15207_opens_with_every_record_and_is_marked_with_this_format(tmp_path):
    database, facts = write_old_store(tmp_path)
    store = Store(database, verify=True)
    try:
        broker = Broker(store, ack_timeout_s=30)
        jobs = {m.id: m for m in store.scan("jobs", limit=100)}
        assert list(jobs) == facts["jobs"]
        assert [jobs[i].frames for i in facts["jobs"][:5]] == [[b"body-%d" % i, b"tail"] for i in range(5)]
        with_meta = jobs[facts["jobs"][5]]
        assert with_meta.meta == {"client": "c1", "msgid": "m-5"} and with_meta.expires_us > 0
        # In flight when the old server stopped: still stored, counted once, and ready again.
        assert [jobs[i].deliveries for i in facts["in_flight"]] == [1, 1]
        assert [m.id for m in broker.take("jobs", 2, "c", now=Now(0.0, 1))] == facts["in_flight"]

        (dead,) = store.dead_letters.read("poison")
        assert (dead.message.id, dead.message.frames, dead.reason) == (facts["dead"], [b"bad"], "too many deliveries")
        assert [m.frames for m in store.scan("poison")] == [[b"fine"]]

        assert Schedules(store).get("sched-1") == {
            **{"queue": "jobs", "headers": "", "interval": 60, "payload": "p", "remaining": -1},
            "next_us": 1_700_000_000_000_000 + 60_000_000,
        }
        runs_old_schedules_to_their_end(store, broker)
        qid = store.queue("spark").qid
        (((group_qid, group_name), group),) = Groups(store).items()
        assert (group_qid, group_name, group[1:3]) == (qid, "g1", [0, 3])  # [gid, base, end, deadline_us]
        assert len(LeaseRecords(store).items()) == 1
        leases = Leases(broker, timeout_s=3600)
        assert leases.offsets("spark", "g1") == tuple(facts["leased"]) == (0, 3)
        fetched, gone, _ = leases.fetch("spark", "g1", 0, 3, now_us=1)
        assert [(n, m.frames) for n, m in fetched] == [(i, [b"row-%d" % i]) for i in range(3)] and gone == 0
        # Leased messages stay the group's: nobody else is handed them.
        assert [m.frames for m in broker.take("spark", 10, "other", now=Now(0.0, 1))] == [[b"row-3"], [b"row-4"]]

        binding = Bindings(store).get("mqks-q")
        assert binding is not None and list(binding.events) == ["ev.a", "ev.b"]
        assert (binding.unused, binding.owned) == (30.0, True)
        emqp = store.queue("emqp")
        ((key, job),) = EmqpJobs(store).items()
        assert key[0] == emqp.qid and job == ("job-1", b"worker-1", None)
        (message,) = store.scan("emqp")
        assert message.id == facts["emqp"] and message.meta == {"client": "w", "msgid": "job-1"}
        assert DedupKeys(store).get("key-1") is not None

        store.put("jobs", [b"new"], now_us=2)
        store.commit()
    finally:
        store.close()
    assert format_record(database) == FORMAT


def runs_old_schedules_to_their_end(store: Store, broker: Broker) -> None:
    """The old layout's schedules run on time in the new one, each run writing only its run record."""
    from pzq.gateways.emqp import EmqpGateway

    now_us = 1_700_000_000_000_000
    gateway = EmqpGateway(
        broker, EmqpJobs(store), Schedules(store), default_queues=["default"], heartbeat_s=3, liveness=3
    )
    assert gateway.run_schedules(now_us) == 0
    whole = Schedules(store).get_raw(b"sched-1")
    assert gateway.run_schedules(now_us + 120_000_000) == 2, "both due"
    assert Schedules(store).get_raw(b"sched-1") == whole and Schedules(store).get("sched-1")["remaining"] == -1
    day = 86_400_000_000
    assert gateway.run_schedules(now_us + day) == 2 and "sched-2" not in gateway.schedules, "run_count 2 spent"
    assert [m.frames for m in store.scan("nightly")] == [[b"q"], [b"q"]]
    assert [m.frames for m in store.scan("jobs") if m.frames == [b"p"]] == [[b"p"], [b"p"]]


def test_a_store_written_by_this_pzq_is_refused_by_db15207_which_would_run_spent_runs_again(tmp_path):
    code = old_code(tmp_path)
    database = tmp_path / "db"
    store = Store(database)
    Schedules(store).put(
        "s", {"queue": "q", "headers": "", "interval": 60, "payload": "p", "remaining": 2, "next_us": 1}
    )
    Schedules(store).ran("s", 61_000_000, 1)
    store.commit()
    store.close()
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from pzq.store import Store; Store(sys.argv[1])", str(database)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(code)},
        cwd=tmp_path,
        timeout=120,
    )
    assert child.returncode != 0 and f"has store format {FORMAT}; this pzq reads 1" in child.stderr


BEFORE_CHUNKS = "56ef5dc"  # format 3: the last pzq without big bodies in chunks


def test_a_store_written_by_56ef5dc_takes_big_bodies_in_chunks_and_56ef5dc_then_refuses_it(tmp_path):
    code = old_code(tmp_path, BEFORE_CHUNKS)
    database = tmp_path / "db"
    env = {**os.environ, "PYTHONPATH": str(code)}
    write = "import sys; from pzq.store import Store; s = Store(sys.argv[1]); s.put('q', [b'old'], now_us=1); s.close()"
    old_run = [sys.executable, "-c", write, str(database)]
    assert subprocess.run(old_run, env=env, cwd=tmp_path, timeout=120, capture_output=True).returncode == 0
    store = Store(database)
    body = [os.urandom(3 << 20)]
    upload = store.bodies.begin(body, 1 << 20)
    while not upload.done:
        store.bodies.write(upload, 2 << 20)
    store.put_body("q", upload, now_us=2)
    store.commit()
    assert [m.frames for m in store.scan("q")] == [[b"old"], body]
    store.close()
    assert format_record(database) == FORMAT == 4
    child = subprocess.run(old_run, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    # (it would read the chunked message as an empty one)
    assert child.returncode != 0 and "has store format 4, newer than format 3" in child.stderr


def test_a_store_without_a_format_record_is_read_as_format_1_and_marked_after_a_write(tmp_path):
    database = tmp_path / "db"
    store = Store(database)
    store.put("q", [b"x"], now_us=1)
    store.close()
    set_format(database, None)  # as a pzq from before the record wrote it
    store = Store(database)
    try:
        assert store.catalog.format == 1 and [m.frames for m in store.scan("q")] == [[b"x"]]
        store.put("q", [b"y"], now_us=2)
        store.commit()
    finally:
        store.close()
    assert format_record(database) == FORMAT


@pytest.mark.parametrize("command", ["check", "serve"])
def test_a_store_of_a_newer_format_is_refused_in_one_line_with_exit_3(tmp_path, command):
    database = tmp_path / "db"
    Store(database).close()
    set_format(database, FORMAT + 1)
    if command == "check":  # (in this process: click's runner)
        from click.testing import CliRunner

        from pzq.cli import cli

        ran = CliRunner().invoke(cli, ["check", str(database)], prog_name="pzq", catch_exceptions=False)
        result = subprocess.CompletedProcess(["pzq", "check"], ran.exit_code, ran.stdout, ran.stderr)
    else:  # (a process: serve sets up the process's logging and signals first)
        argv = [sys.executable, "-m", "pzq", command, "--database", str(database)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 3, result.stderr
    assert lines == [
        f"pzq: error: {database} has store format {FORMAT + 1}, newer than format {FORMAT}, the newest this pzq "
        f"reads: run the newer pzq that wrote it (or restore a backup of format {FORMAT})"
    ]
