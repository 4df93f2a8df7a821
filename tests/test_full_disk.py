"""A full disk never wedges the store: on a real small filesystem (a tmpfs this test mounts), producers
get "queue full" before it fills, consumers drain even when something else takes the last byte, and a
restart with a limit below what is stored starts and drains. And a full disk is not damage: `pzq check`
of a sound store on a full filesystem reads it all, and what cannot be written says so in one line with
exit status 6, never SIGBUS."""

from __future__ import annotations

import faulthandler
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from pzq import check
from pzq.clients import native as client
from pzq.errors import DiskFull, ExitCode, StoreDamaged
from pzq.protocols.phpmq import encode
from pzq.store import Store
from pzq.store.disk import LOCK_FILE_BYTES

from conftest import ProcessServer, free_tcp_endpoint, wait_until

pytestmark = pytest.mark.timeout(180)
MB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs mounted at tmp_path/disk (needs root or CAP_SYS_ADMIN; skipped otherwise)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {result.stderr.strip() or result.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def server_on(disk, tmp_path, *extra: str) -> ProcessServer:
    """A server of the store ``disk``/db, not started yet."""
    srv = ProcessServer(tmp_path, "--min-disk-free", "4M", "--disk-reserve", "2M", *extra)
    srv.database = disk / "db"
    srv.argv[srv.argv.index("--database") + 1] = str(srv.database)
    return srv


def serve_on(disk, tmp_path, *extra: str) -> ProcessServer:
    return server_on(disk, tmp_path, *extra).start()


def fill_until_refused(srv: ProcessServer) -> tuple[int, set[str]]:
    """Produce 4 KiB messages until the server refuses; returns (stored, the refusal texts)."""
    stored, errors = 0, set()
    with client.Producer(srv.receive, timeout_s=10) as producer:
        while not errors:
            results = producer.produce_many([[os.urandom(4096)] for _ in range(50)], window=50)
            stored += sum(r.ok for r in results)
            errors |= {r.error for r in results if not r.ok}
    return stored, errors


def fill_the_rest(path) -> None:
    """What another process does: take every byte left on the filesystem."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * MB)
                f.flush()
        except OSError:
            pass


def drain(srv: ProcessServer) -> int:
    """Consume and ack until the store is empty (a rolled-back turn repeats deliveries: at-least-once);
    returns how many deliveries that took."""
    got = 0
    deadline = time.monotonic() + 60
    with client.Consumer(srv.send) as consumer:
        while srv.stats()["messages"]:
            assert time.monotonic() < deadline, f"the store did not drain: {srv.stats()['messages']} left"
            for _ in range(200):
                delivery = consumer.receive(timeout_s=0.5)
                if delivery is None:
                    break
                consumer.ack(delivery)
                got += 1
    return got


def test_producers_are_refused_before_the_disk_fills_and_consumers_still_drain(small_disk, tmp_path):
    phpmq_dsn, phpmq_addr = free_tcp_endpoint()
    srv = serve_on(small_disk, tmp_path, "--max-store-size", "100M", "--phpmq-dsn", phpmq_dsn)
    try:
        stored, errors = fill_until_refused(srv)
        assert stored > 500 and all(e.startswith("queue full") for e in errors), errors
        php = socket.create_connection(phpmq_addr, timeout=5)
        php.sendall(encode(1, [(1, b"default"), (2, b"no room")]))
        assert php.recv(100) == b"", "a PHPMQ send refused for space closes its connection"
        php.close()
        fill_the_rest(small_disk / "filler")  # something else takes every byte left
        assert drain(srv) >= stored
        assert "reserve was given back" in srv.log.read_text() or "store failure" not in srv.log.read_text()
        os.unlink(small_disk / "filler")
        with client.Producer(srv.receive) as producer:  # room again: producers are served again
            wait_until(lambda: producer.produce([b"again"]).ok, timeout_s=10)
        srv.restart()
        assert srv.stats()["messages"] >= 1
    finally:
        srv.stop()


def test_a_restart_with_a_limit_below_what_is_stored_starts_and_drains(small_disk, tmp_path):
    srv = serve_on(small_disk, tmp_path, "--max-store-size", "100M")
    try:
        stored, _ = fill_until_refused(srv)
        srv.stop()
        srv.argv += ["--max-store-size", "1M"]  # the last flag wins
        srv.start()
        assert srv.stats()["messages"] == stored
        with client.Producer(srv.receive) as producer:
            assert not producer.produce([b"over the limit"]).ok
        assert drain(srv) >= stored
    finally:
        srv.stop()


def test_side_records_are_refused_too_while_the_disk_is_short(small_disk, tmp_path):
    from pzq.clients.mqks import MqksClient
    from pzq.errors import ClientError

    mqks_dsn, _ = free_tcp_endpoint()
    srv = serve_on(small_disk, tmp_path, "--max-store-size", "100M", "--mqks-dsn", mqks_dsn)
    try:
        with MqksClient(mqks_dsn) as mq:
            mq.consume("bound-before", ["e"])
            fill_until_refused(srv)
            with pytest.raises(ClientError, match="refused"):
                mq.consume("bound-after", ["e"])  # a new binding record: refused, nothing changed
            mq.consume("bound-before", ["e"], add=True)  # an existing binding still works
        assert "bound-after" not in srv.stats()["queues"]
    finally:
        srv.stop()


def test_commits_failing_on_a_full_disk_deliver_each_message_about_once(small_disk, tmp_path):
    # Something else takes every byte left and there is no reserve to give back: every commit fails
    # while a consumer drains. A failed commit undoes only its own turn: a delivery that left in an
    # earlier turn stays in flight, and a consumer's ack whose delete was rolled back is done again, so
    # a message is not delivered again at each failure (old main: 20 to 41 deliveries a message).
    srv = serve_on(small_disk, tmp_path, "--max-store-size", "100M", "--disk-reserve", "0")
    try:
        stored, _ = fill_until_refused(srv)
        fill_the_rest(small_disk / "filler")
        deliveries = 0
        with client.Consumer(srv.send) as consumer:
            deadline = time.monotonic() + 5  # commits fail all along: nothing more can be freed
            while time.monotonic() < deadline:
                delivery = consumer.receive(timeout_s=0.2)
                if delivery is not None:
                    consumer.ack(delivery)
                    deliveries += 1
        failed = srv.log.read_text().count("store failure")
        os.unlink(small_disk / "filler")  # room again: what was acked is deleted, the rest drains
        deliveries += drain(srv)
    finally:
        srv.stop()
    assert failed >= 1, "the commits failed while the consumer drained"
    assert stored <= deliveries <= 2 * stored, f"{deliveries} deliveries for {stored} messages"


# -- a full disk is not damage (issue 39 item 5): one line, exit 6 (DISK_FULL), never SIGBUS ----------


def pzq(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pzq", *argv], capture_output=True, text=True, timeout=60, check=False)


def a_store(path, count: int = 300) -> None:
    store = Store(str(path), max_size=64 << 20)
    try:
        store.put_many("default", [[b"m-%05d" % i] for i in range(count)], now_us=1)
        store.commit()
    finally:
        store.close()


def test_lmdb_makes_its_lock_file_the_size_pzq_allocates_for_it(tmp_path):
    # pzq gives the lock file its blocks before LMDB maps it: an LMDB that wanted a bigger one would
    # size the rest with holes again (pzq then allocates those too, but the figure should say so)
    store = Store(str(tmp_path / "db"), max_size=1 << 20)
    store.close()
    assert os.path.getsize(tmp_path / "db" / "lock.mdb") == LOCK_FILE_BYTES
    assert os.stat(tmp_path / "db" / "lock.mdb").st_blocks * 512 >= LOCK_FILE_BYTES  # (no hole in it)


def test_check_and_dump_of_a_sound_backup_on_a_full_filesystem_read_it_all(small_disk, tmp_path):
    # It said "the reader died of SIGBUS: restore it from a backup" (exit 3): LMDB made the backup's lock
    # file with holes and wrote its reader table into them
    a_store(tmp_path / "db")
    shutil.copytree(tmp_path / "db", small_disk / "backup", ignore=shutil.ignore_patterns("lock.mdb"))
    fill_the_rest(small_disk / "filler")
    checked = pzq("check", str(small_disk / "backup"))
    assert checked.returncode == 0, checked.stderr
    assert "300 messages" in checked.stdout and "every record is readable" in checked.stdout
    dumped = pzq("dump", str(small_disk / "backup"), str(tmp_path / "dump.jsonl"))
    assert dumped.returncode == 0, dumped.stderr
    assert len((tmp_path / "dump.jsonl").read_text().splitlines()) == 300
    assert sorted(os.listdir(small_disk / "backup")) == ["data.mdb"]  # (nothing left there)


def test_a_dump_onto_a_full_filesystem_says_so_in_one_line_with_exit_6(small_disk, tmp_path):
    a_store(tmp_path / "db", count=2000)
    fill_the_rest(small_disk / "filler")
    dumped = pzq("dump", str(tmp_path / "db"), str(small_disk / "dump.jsonl"))
    assert dumped.returncode == ExitCode.DISK_FULL and dumped.stderr.count("\n") == 1, dumped.stderr
    assert "is full" in dumped.stderr and "backup" not in dumped.stderr


def test_serve_on_a_full_filesystem_exits_6_in_one_line_and_starts_once_there_is_room(small_disk, tmp_path):
    # It died of SIGBUS without a line. A new store: LMDB cannot even write its first pages
    fill_the_rest(small_disk / "filler")
    srv = server_on(small_disk, tmp_path)
    with pytest.raises(RuntimeError, match="server exited 6"):
        srv.start()
    lines = srv.log.read_text().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("pzq: error: the filesystem of") and "is full" in lines[0]
    assert "backup" not in lines[0] and not os.path.exists(small_disk / "db" / "data.mdb")
    os.unlink(small_disk / "filler")  # room again: nothing left behind reads as damage ("truncated")
    srv.start()
    try:
        with client.Producer(srv.receive) as producer:
            assert producer.produce([b"after"]).ok
    finally:
        srv.stop()


def test_a_store_whose_lock_file_has_holes_is_served_or_refused_never_killed_on_a_full_disk(small_disk, tmp_path):
    # A lock file an older pzq (or LMDB itself) sized with holes, then the disk filled: serve cannot give
    # it blocks and says so; check reads without it, holding servers off meanwhile
    a_store(small_disk / "db")
    lock = small_disk / "db" / "lock.mdb"
    os.unlink(lock)
    with open(lock, "wb") as f:
        f.truncate(LOCK_FILE_BYTES)  # (what LMDB's ftruncate makes: no block)
    fill_the_rest(small_disk / "filler")
    srv = server_on(small_disk, tmp_path)
    with pytest.raises(RuntimeError, match="server exited 6"):
        srv.start()
    assert "lock.mdb" in srv.log.read_text() and "SIGBUS" not in srv.log.read_text()
    checked = pzq("check", str(small_disk / "db"))
    assert checked.returncode == 0 and "300 messages" in checked.stdout, checked.stderr


def test_a_reader_killed_by_sigbus_on_a_full_disk_is_not_called_damage(small_disk):
    # What is left of SIGBUS (a mapping pzq did not allocate) says "full", not "restore it from a backup"
    a_store(small_disk / "db", count=10)
    fill_the_rest(small_disk / "filler")

    def bus(path, target, say) -> None:
        faulthandler.disable()  # (pytest's: its dump of the child's stack is not what this shows)
        os.kill(os.getpid(), signal.SIGBUS)

    with pytest.raises(DiskFull, match="SIGBUS, which a full disk causes"):
        check._read(bus, str(small_disk / "db"), None, io.StringIO())
    os.unlink(small_disk / "filler")
    with pytest.raises(StoreDamaged, match="restore it from a backup"):  # (with room, it is damage)
        check._read(bus, str(small_disk / "db"), None, io.StringIO())


def test_a_backup_of_a_store_on_a_full_filesystem_is_taken_elsewhere(small_disk, tmp_path):
    a_store(tmp_path / "db")
    shutil.copytree(tmp_path / "db", small_disk / "db", ignore=shutil.ignore_patterns("lock.mdb"))
    fill_the_rest(small_disk / "filler")
    taken = pzq("backup", "--database", str(small_disk / "db"), str(tmp_path / "b"))
    assert taken.returncode == 0, taken.stderr
    checked = pzq("check", str(tmp_path / "b"))
    assert checked.returncode == 0 and "300 messages" in checked.stdout, checked.stderr


def test_a_restore_onto_a_full_filesystem_says_so_in_one_line_with_exit_6_and_leaves_nothing(small_disk, tmp_path):
    a_store(tmp_path / "db", count=3000)
    fill_the_rest(small_disk / "filler")
    restored = pzq("restore", str(tmp_path / "db"), "--database", str(small_disk / "new"))
    assert restored.returncode == ExitCode.DISK_FULL and restored.stderr.count("\n") == 1, restored.stderr
    assert not os.path.exists(small_disk / "new" / "data.mdb") and os.listdir(small_disk / "new") == []
