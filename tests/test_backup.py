"""`pzq backup` and `pzq restore` (issue 29, item 7): a consistent, compacted copy of a store taken while
its server serves producers and consumers, restored and served again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients import native as client
from pzq.errors import StoreDamaged, StoreError, StoreLocked
from pzq.store import Store
from pzq.store.backup import backup, restore

from conftest import ProcessServer, wait_until


def hold_a_reader(db) -> subprocess.Popen:
    """Another process with a read transaction open on the store at ``db`` (it prints 'reading' once it
    holds it, then sleeps): what a slow backup or check looks like to the server."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import lmdb, sys, time; t = lmdb.open(sys.argv[1], readonly=True).begin();"
            "print('reading', flush=True); time.sleep(60)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def _pzq(*argv: str, process: bool = False) -> subprocess.CompletedProcess:
    """`pzq ARGV` as the command line runs it: through click's runner in this process (its exit status,
    stdout and stderr), or with ``process`` in a process of its own, where what matters is that another
    process opens the store (an in-process server has it open: LMDB's locks are a process's)."""
    if process:
        return subprocess.run([sys.executable, "-m", "pzq", *argv], capture_output=True, text=True, timeout=120)
    handler = signal.getsignal(signal.SIGTERM)  # (`pzq backup` sets its own, for the process it would be)
    try:
        ran = CliRunner().invoke(cli, list(argv), prog_name="pzq", catch_exceptions=False)
    finally:
        signal.signal(signal.SIGTERM, handler)
    return subprocess.CompletedProcess(["pzq", *argv], ran.exit_code, ran.stdout, ran.stderr)


def _fill(path, count: int, size: int = 100) -> None:
    store = Store(str(path), max_size=256 << 20)
    try:
        store.put_many("default", [[b"m-%07d" % i + b"." * size] for i in range(count)], now_us=1)
        store.commit()
    finally:
        store.close()


def _bodies(path) -> set[bytes]:
    store = Store(str(path), readonly=True)
    try:
        return {record.frames[0] for kind, record in store.previews.audit("default") if kind == "message" and record}
    finally:
        store.close()


def test_a_backup_of_a_store_holds_its_messages_and_is_read_back_by_check(tmp_path):
    _fill(tmp_path / "db", 2000)
    done = backup(str(tmp_path / "db"), str(tmp_path / "backups" / "one"))
    assert done.bytes == os.path.getsize(tmp_path / "backups" / "one" / "data.mdb") > 0
    assert sorted(os.listdir(tmp_path / "backups")) == ["one"]  # (no partial copy left beside it)
    assert _bodies(tmp_path / "backups" / "one") == _bodies(tmp_path / "db")
    checked = _pzq("check", str(tmp_path / "backups" / "one"))
    assert checked.returncode == 0, checked.stderr
    assert "2000 messages" in checked.stdout and "every record is readable" in checked.stdout


def test_a_backup_never_overwrites_one_that_is_there_unless_forced(tmp_path):
    _fill(tmp_path / "db", 10)
    dest = tmp_path / "b"
    backup(str(tmp_path / "db"), str(dest))
    refused = _pzq("backup", "--database", str(tmp_path / "db"), str(dest))
    assert refused.returncode == 1 and "exists" in refused.stderr and "--force" in refused.stderr
    (tmp_path / "not-a-backup").mkdir()
    (tmp_path / "not-a-backup" / "precious.txt").write_text("keep me")
    with pytest.raises(StoreError, match="not a pzq backup"):
        backup(str(tmp_path / "db"), str(tmp_path / "not-a-backup"), replace=True)
    assert (tmp_path / "not-a-backup" / "precious.txt").read_text() == "keep me"
    forced = _pzq("backup", "--force", "--database", str(tmp_path / "db"), str(dest))
    assert forced.returncode == 0, forced.stderr
    assert len(_bodies(dest)) == 10


def test_a_copy_that_fails_midway_leaves_no_backup_and_no_partial_file(tmp_path):
    _fill(tmp_path / "db", 20000, size=200)

    def fail(copied: int, expected: int, seconds: float) -> None:
        raise OSError(28, "No space left on device")  # (what a full disk raises mid-copy)

    with pytest.raises(StoreError, match="the disk filled during the copy; no backup was kept"):
        backup(str(tmp_path / "db"), str(tmp_path / "backups" / "b"), progress=fail, every_s=0)
    assert os.listdir(tmp_path / "backups") == []


def test_a_backup_is_refused_where_it_cannot_go(tmp_path):
    _fill(tmp_path / "db", 10)
    with pytest.raises(StoreError, match="no store there"):
        backup(str(tmp_path / "nothing"), str(tmp_path / "b"))
    assert not (tmp_path / "nothing").exists()  # (a read-only open would have made it)
    with pytest.raises(StoreError, match="into the store it copies"):
        backup(str(tmp_path / "db"), str(tmp_path / "db" / "b"))


def test_restore_refuses_a_directory_that_is_not_empty_and_one_a_server_runs_on(tmp_path, make_server):
    _fill(tmp_path / "src", 5)
    backup(str(tmp_path / "src"), str(tmp_path / "b"))
    srv = make_server()  # (its store is tmp_path / "db")
    refused = _pzq("restore", str(tmp_path / "b"), "--database", str(tmp_path / "db"))
    assert refused.returncode == 1 and "not empty" in refused.stderr
    with pytest.raises(StoreLocked, match="a server runs on"):
        restore(str(tmp_path / "b"), str(tmp_path / "db"), force=True)
    assert srv.stats()["messages"] == 0  # (its store untouched; it serves on)
    srv.stop()
    restore(str(tmp_path / "b"), str(tmp_path / "db"), force=True)
    assert len(_bodies(tmp_path / "db")) == 5


def test_restore_refuses_a_torn_backup_and_leaves_the_directory_as_it_was(tmp_path):
    _fill(tmp_path / "src", 2000)
    backup(str(tmp_path / "src"), str(tmp_path / "b"))
    torn = tmp_path / "torn.mdb"
    torn.write_bytes((tmp_path / "b" / "data.mdb").read_bytes()[: 3 * 4096])
    with pytest.raises(StoreDamaged, match="truncated"):
        restore(str(torn), str(tmp_path / "new"))
    assert os.listdir(tmp_path / "new") == []
    refused = _pzq("restore", str(tmp_path / "nowhere"), "--database", str(tmp_path / "new"))
    assert refused.returncode == 1 and "no backup there" in refused.stderr


def test_a_backup_taken_under_load_restores_every_acked_message_and_none_settled_before_it(tmp_path, process_server):
    srv = process_server()
    with client.Producer(srv.receive) as producer:
        before = [[b"pre-%06d" % i + b"." * 500] for i in range(20000)]
        assert all(r.ok for r in producer.send_many(before))
    settled_before: set[bytes] = set()
    with client.BatchConsumer(srv.consume) as consumer:
        while len(settled_before) < 2000:
            batch = consumer.receive(100, timeout_s=5)
            assert batch, "no delivery within 5 s"
            assert not consumer.ack([key for key, _ in batch]).refused
            settled_before.update(body[0] for _, body in batch)
    # Load from threads while the backup runs: a producer and a consumer (which settles with a reply)
    stop = threading.Event()
    acked_at: dict[bytes, float] = {body[0]: 0.0 for body in before}  # body -> when its produce was acked
    settle_sent_at: dict[bytes, float] = {body: 0.0 for body in settled_before}
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with client.Producer(srv.receive) as p:
                n = 0
                while not stop.is_set():
                    bodies = [[b"load-%07d" % (n + i)] for i in range(100)]
                    n += 100
                    results = p.send_many(bodies)
                    now = time.monotonic()
                    acked_at.update((b[0], now) for b, r in zip(bodies, results, strict=True) if r.ok)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def consume() -> None:
        try:
            with client.BatchConsumer(srv.consume) as c:
                while not stop.is_set():
                    batch = c.receive(50, timeout_s=5)
                    now = time.monotonic()
                    settle_sent_at.update((body[0], now) for _, body in batch)
                    c.ack([key for key, _ in batch])
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(acked_at) > 20500 and len(settle_sent_at) > 2500 or errors, timeout_s=30)
        began = time.monotonic()
        taken = _pzq("backup", "--database", str(srv.database), str(tmp_path / "backups" / "b1"), process=True)
        ended = time.monotonic()
        assert taken.returncode == 0, taken.stderr
        wait_until(lambda: len(settle_sent_at) > 3000 or errors, timeout_s=30)  # (load goes on after it)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    srv.stop()
    checked = _pzq("check", str(tmp_path / "backups" / "b1"), process=True)
    assert checked.returncode == 0 and "every record is readable" in checked.stdout, checked.stdout + checked.stderr

    second = ProcessServer(tmp_path / "second")
    (tmp_path / "second").mkdir()
    restored = _pzq("restore", str(tmp_path / "backups" / "b1"), "--database", str(second.database), process=True)
    assert restored.returncode == 0, restored.stderr
    second.start()
    try:
        expected = second.stats()["messages"]
        found: set[bytes] = set()
        with client.BatchConsumer(second.consume) as consumer:
            while len(found) < expected:
                batch = consumer.receive(500, timeout_s=5)
                assert batch, f"{len(found)} of {expected} messages delivered, then nothing for 5 s"
                found.update(body[0] for _, body in batch)
                consumer.ack([key for key, _ in batch])
    finally:
        second.stop()
    # Acked before the backup began, and not settled by the time it ended (still queued, or in flight)
    must = {b for b, at in acked_at.items() if at < began and settle_sent_at.get(b, float("inf")) > ended}
    assert must <= found, f"{len(must - found)} messages acked before the backup began are missing"
    assert not found & settled_before, "messages settled before the backup began came back"
    assert found <= set(acked_at)  # (nothing that was not produced)
    assert len(must) > 10000  # (the check above is about a real backlog, not an empty queue)


def test_a_restore_over_a_planted_link_and_a_backup_where_it_may_not_write_say_one_line(tmp_path):
    _fill(tmp_path / "src", 5)
    backup(str(tmp_path / "src"), str(tmp_path / "b"))
    (tmp_path / "target").mkdir()
    (tmp_path / "elsewhere").write_bytes(b"someone else's file")
    os.symlink(tmp_path / "elsewhere", tmp_path / "target" / "data.mdb")
    refused = _pzq("restore", "--force", str(tmp_path / "b"), "--database", str(tmp_path / "target"))
    assert refused.returncode != 0 and refused.stderr.startswith("pzq: error:") and "Traceback" not in refused.stderr
    assert (tmp_path / "elsewhere").read_bytes() == b"someone else's file"
    (tmp_path / "locked").mkdir(mode=0o500)
    try:
        refused = _pzq("backup", "--database", str(tmp_path / "src"), str(tmp_path / "locked" / "b"))
        if os.geteuid() != 0:  # (root writes anywhere)
            assert refused.returncode == 1 and "Permission denied" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        os.chmod(tmp_path / "locked", 0o700)


def test_a_reader_killed_in_a_transaction_does_not_make_the_store_grow_for_ever(tmp_path, caplog):
    # A `pzq backup` or `pzq check` killed with SIGKILL leaves its reader slot; LMDB would keep every
    # page that reader saw, so each rewrite of the store would take new pages.
    store = Store(str(tmp_path / "db"), max_size=256 << 20)
    store.put_many("default", [[b"x" * 1000] for _ in range(1000)], now_us=1)
    store.commit()
    reader = hold_a_reader(tmp_path / "db")
    try:
        assert reader.stdout.readline() == "reading\n"
    finally:
        reader.kill()
        reader.wait(10)
    with caplog.at_level("WARNING", logger="pzq.store"):
        store.watch_disk()  # (what the server's loop calls every turn; the readers every 10 s)
    assert "1 reader(s) died in a transaction" in caplog.text
    size = os.path.getsize(tmp_path / "db" / "data.mdb")
    for _ in range(30):  # each round replaces every message: 1 MB of new pages, the old ones free
        store.put_many("default", [[b"y" * 1000] for _ in range(1000)], now_us=1)
        assert store.delete_range("default", 0, 10**12, 1000)[0] == 1000  # (the oldest 1000)
        store.commit()
    assert os.path.getsize(tmp_path / "db" / "data.mdb") < size + (8 << 20)
    store.close()


def test_a_forced_backup_over_a_planted_link_replaces_nothing_it_names(tmp_path):
    _fill(tmp_path / "db", 3)
    _fill(tmp_path / "other", 7)  # someone's store, which a link at DEST names
    os.symlink(tmp_path / "other", tmp_path / "b")
    with pytest.raises(StoreError, match="not a pzq backup"):
        backup(str(tmp_path / "db"), str(tmp_path / "b"), replace=True)
    assert len(_bodies(tmp_path / "other")) == 7
    assert sorted(os.listdir(tmp_path)) == ["b", "db", "other"]  # (no partial copy left)


def test_a_torn_or_foreign_backup_is_named_by_its_own_path_in_restores_one_line(tmp_path):
    # The copy is read back under a temporary name that is gone when the error is shown: the line must
    # name the file the operator gave, and not tell them to "restore it from a backup" they are restoring.
    _fill(tmp_path / "src", 2000)
    backup(str(tmp_path / "src"), str(tmp_path / "b"))
    torn = tmp_path / "torn.mdb"
    torn.write_bytes((tmp_path / "b" / "data.mdb").read_bytes()[: 3 * 4096])
    foreign = tmp_path / "foreign.mdb"
    foreign.write_bytes(os.urandom(64 << 10))
    for bad in (torn, foreign):
        refused = _pzq("restore", str(bad), "--database", str(tmp_path / "new"))
        assert refused.returncode == 3 and refused.stderr.count("\n") == 1, refused.stderr
        assert str(bad) in refused.stderr and ".restore-" not in refused.stderr, refused.stderr
        assert "restore it from a backup" not in refused.stderr.lower() and "nothing was replaced" in refused.stderr
        assert os.listdir(tmp_path / "new") == []


def _read_only_view(of, at) -> bool:
    """Bind-mount ``of`` read-only at ``at`` (as systemd's ProtectSystem=strict shows a path); False
    where this process may not mount."""
    at.mkdir()
    made = subprocess.run(["mount", "--bind", str(of), str(at)], capture_output=True, timeout=30, check=False)
    if made.returncode != 0:
        return False
    subprocess.run(["mount", "-o", "remount,bind,ro", str(at)], capture_output=True, timeout=30, check=True)
    return True


def test_a_backup_through_a_read_only_view_of_a_store_a_server_writes_is_refused(tmp_path, make_server):
    # On a read-only filesystem LMDB opens without its lock file: the copy's snapshot has no reader
    # slot, so the server reuses the pages being copied and the "complete" backup is torn.
    (tmp_path / "unused").mkdir()
    if os.geteuid() != 0 or not _read_only_view(tmp_path / "unused", tmp_path / "probe"):
        pytest.skip("needs root to bind-mount a read-only view")
    subprocess.run(["umount", str(tmp_path / "probe")], timeout=30, check=True)
    srv = make_server()  # (its store is tmp_path / "db")
    with client.Producer(srv.receive, timeout_s=10) as producer:
        assert all(r.ok for r in producer.send_many([[b"kept-%d" % i] for i in range(10)]))
    assert _read_only_view(tmp_path / "db", tmp_path / "ro")
    try:
        refused = _pzq("backup", "--database", str(tmp_path / "ro"), str(tmp_path / "b"), process=True)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert "read-only" in refused.stderr and "a server runs on it" in refused.stderr
        assert not [name for name in os.listdir(tmp_path) if name == "b" or name.startswith(".b.")]
        srv.stop()  # no writer: the read-only view is a safe source, and holds off a server meanwhile
        taken = _pzq("backup", "--database", str(tmp_path / "ro"), str(tmp_path / "b"), process=True)
        assert taken.returncode == 0, taken.stderr
        assert len(_bodies(tmp_path / "b")) == 10
    finally:
        subprocess.run(["umount", str(tmp_path / "ro")], timeout=30, check=False)


def test_a_restore_killed_mid_copy_leaves_no_debris_once_it_is_run_again(tmp_path):
    # kill -9 between the copy and its rename: the half-written copy under .restore-* is as big as the
    # backup; nothing else would ever remove it from the store's directory.
    _fill(tmp_path / "src", 2000)
    backup(str(tmp_path / "src"), str(tmp_path / "b"))
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys; from pzq.store import backup as b;"
            "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL); b.restore(sys.argv[1], sys.argv[2])",
            str(tmp_path / "b"),
            str(tmp_path / "new"),
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    assert [n for n in os.listdir(tmp_path / "new") if n.startswith(".restore-")]
    again = _pzq("restore", "--force", str(tmp_path / "b"), "--database", str(tmp_path / "new"))
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(tmp_path / "new")) == ["data.mdb"]
    assert len(_bodies(tmp_path / "new")) == 2000


def test_restore_from_the_store_of_a_running_server_is_refused_as_a_torn_copy_would_be(tmp_path, make_server):
    # `pzq restore /var/lib/pzq --database elsewhere` copies data.mdb byte by byte: under a writing server
    # that is the torn file `pzq backup` exists to avoid.
    srv = make_server()  # (its store is tmp_path / "db")
    with client.Producer(srv.receive, timeout_s=10) as producer:
        assert all(r.ok for r in producer.send_many([[b"live-%d" % i] for i in range(10)]))
    refused = _pzq("restore", str(tmp_path / "db"), "--database", str(tmp_path / "copy"), process=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
    assert "a server runs on" in refused.stderr and "pzq backup" in refused.stderr
    assert not os.path.exists(tmp_path / "copy" / "data.mdb")
    srv.stop()
    taken = _pzq("restore", str(tmp_path / "db"), "--database", str(tmp_path / "copy"))
    assert taken.returncode == 0, taken.stderr
    assert len(_bodies(tmp_path / "copy")) == 10


def test_restore_of_an_empty_file_does_not_advise_restoring_from_a_backup(tmp_path):
    (tmp_path / "empty.mdb").write_bytes(b"")
    refused = _pzq("restore", str(tmp_path / "empty.mdb"), "--database", str(tmp_path / "new"))
    assert refused.returncode == 3 and "nothing was replaced" in refused.stderr
    assert "restore it from a backup" not in refused.stderr.lower(), refused.stderr


def test_a_backup_stopped_with_sigterm_says_so_in_one_line_and_leaves_no_partial_copy(tmp_path):
    # systemctl stop, a shutdown, or `kill PID`: the default SIGTERM ended the process where it stood and
    # left a hidden copy as big as a backup.
    _fill(tmp_path / "db", 12_000, size=1000)  # (about 12 MiB: past one 8 MiB step)
    slow = (
        "import os, sys, time; synced = os.fdatasync;"
        "os.fdatasync = lambda fd: (print('step', flush=True), time.sleep(0.5), synced(fd));"
        "sys.argv = ['pzq', *sys.argv[1:]]; from pzq.cli import main; main()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", slow, "backup", "--database", str(tmp_path / "db"), str(tmp_path / "b")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "step\n"  # (mid-copy: the first 8 MiB are being written)
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1 and err.count("\n") == 1 and "no backup was kept" in err, err
    assert sorted(os.listdir(tmp_path)) == ["db"]


def test_a_reader_that_holds_one_snapshot_for_long_is_named_once_in_the_servers_log(tmp_path, caplog):
    # `pzq backup` suspended with ^Z (or kill -STOP, or stuck on a stalled disk) is alive: its slot is not
    # cleared, and every page the server frees meanwhile stays unused: the store grows without a word.
    from pzq.store import readers

    store = Store(str(tmp_path / "db"), max_size=64 << 20)
    store.put_many("default", [[b"x"]], now_us=1)
    store.commit()
    reader = hold_a_reader(tmp_path / "db")
    try:
        assert reader.stdout.readline() == "reading\n"
        seen: dict = {}
        env = store.env._env
        with caplog.at_level("WARNING", logger="pzq.store"):
            readers.sweep(env, str(tmp_path / "db"), seen, now=1000.0)
            assert "snapshot" not in caplog.text  # (first seen now)
            readers.sweep(env, str(tmp_path / "db"), seen, now=1000.0 + readers.HELD_S - 1)
            assert "snapshot" not in caplog.text
            readers.sweep(env, str(tmp_path / "db"), seen, now=1000.0 + readers.HELD_S)
            readers.sweep(env, str(tmp_path / "db"), seen, now=1000.0 + 2 * readers.HELD_S)
        named = [r.getMessage() for r in caplog.records if "snapshot" in r.getMessage()]
        assert len(named) == 1 and f"process {reader.pid} " in named[0] and "grows" in named[0], named
    finally:
        reader.kill()
        reader.wait(10)
        store.close()


def test_a_backup_whose_progress_has_nowhere_to_go_is_still_taken(tmp_path):
    # `pzq backup DEST 2>&1 | head -1`, or a terminal that went away: writing a progress line fails, and
    # that failure is no reason to throw the copy away.
    _fill(tmp_path / "db", 3000, size=1000)  # (3 MiB: a progress line after each 1 MiB read, as asked below)
    slow = (
        "import functools, sys; from pzq.store import backup;"
        "backup.backup = functools.partial(backup.backup, every_s=0.0);"  # (a line each chunk, not each 2 s)
        "sys.argv = ['pzq', *sys.argv[1:]]; from pzq.cli import main; main()"
    )
    read_end, write_end = os.pipe()
    os.close(read_end)  # (a reader that went away)
    try:
        ran = subprocess.run(
            [sys.executable, "-c", slow, "backup", "--database", str(tmp_path / "db"), str(tmp_path / "b")],
            stdout=subprocess.PIPE,
            stderr=write_end,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert ran.returncode == 0 and "complete" in ran.stdout
    assert len(_bodies(tmp_path / "b")) == 3000


def test_a_backup_on_the_stores_own_filesystem_leaves_the_server_the_free_room_it_keeps(tmp_path):
    # The timer's /var/lib/pzq-backups is on /var/lib/pzq's filesystem: a copy that left only 64 MiB there
    # would put the server under its --min-disk-free, and producers would be refused.
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("needs root to mount a small filesystem")
    try:
        _fill(disk / "db", 20_000, size=1000)  # (about 40 MiB: 104 MiB with the headroom, of about 160 free)
        config = tmp_path / "pzq.toml"
        config.write_text(f'database = "{disk / "db"}"\nmin_disk_free = "150M"\ndisk_reserve = "8M"\n')
        refused = _pzq("backup", "--config", str(config), str(disk / "b"))
        assert refused.returncode == 6 and refused.stderr.count("\n") == 1, refused.stderr  # (DISK_FULL)
        assert "min_disk_free" in refused.stderr and sorted(os.listdir(disk)) == ["db"]
        taken = _pzq("backup", "--config", str(config), str(tmp_path / "elsewhere"))  # (another filesystem)
        assert taken.returncode == 0, taken.stderr
    finally:
        subprocess.run(["umount", str(disk)], timeout=30, check=False)


def test_a_check_through_a_read_only_view_of_a_store_a_server_writes_is_refused(tmp_path, make_server):
    # As a backup there: no reader slot, so the server reuses pages the check reads, and a sound store
    # could be reported damaged (and restored from a backup for nothing).
    (tmp_path / "unused").mkdir()
    if os.geteuid() != 0 or not _read_only_view(tmp_path / "unused", tmp_path / "probe"):
        pytest.skip("needs root to bind-mount a read-only view")
    subprocess.run(["umount", str(tmp_path / "probe")], timeout=30, check=True)
    srv = make_server()
    with client.Producer(srv.receive, timeout_s=10) as producer:
        assert all(r.ok for r in producer.send_many([[b"kept-%d" % i] for i in range(10)]))
    assert _read_only_view(tmp_path / "db", tmp_path / "ro")
    try:
        refused = _pzq("check", str(tmp_path / "ro"), process=True)
        assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
        assert "read-only" in refused.stderr and "a server runs on it" in refused.stderr
        srv.stop()
        checked = _pzq("check", str(tmp_path / "ro"), process=True)
        assert checked.returncode == 0 and "10 messages" in checked.stdout, checked.stderr
    finally:
        subprocess.run(["umount", str(tmp_path / "ro")], timeout=30, check=False)


def test_a_file_where_a_directory_is_needed_is_named_as_such_by_backup_and_restore(tmp_path):
    _fill(tmp_path / "db", 3)
    backup(str(tmp_path / "db"), str(tmp_path / "b"))
    (tmp_path / "afile").write_text("not a directory")
    for argv in (
        ("backup", "--database", str(tmp_path / "db"), str(tmp_path / "afile" / "b")),
        ("backup", "--database", str(tmp_path / "db"), str(tmp_path / "afile" / "deeper" / "b")),
        ("restore", str(tmp_path / "b"), "--database", str(tmp_path / "afile")),
    ):
        refused = _pzq(*argv)
        assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
        assert "afile is not a directory" in refused.stderr, refused.stderr
    assert (tmp_path / "afile").read_text() == "not a directory"
