"""A damaged store is named, not crashed on: an empty or truncated data file stops the server at start
with one clear line (never a silent fresh start, never SIGBUS), and one unreadable record is set aside
while the server goes on serving."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from pzq.clients import native as client
from pzq.store.layout import KEY as _KEY

from conftest import ProcessServer, start_every_gateway


def serve_exits(srv: ProcessServer) -> subprocess.CompletedProcess:
    return subprocess.run(srv.argv, capture_output=True, text=True, timeout=30)


def stored(process_server, n: int = 50) -> ProcessServer:
    srv = process_server()
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"m%d" % i] for i in range(n)]))
    srv.stop()
    return srv


def test_an_emptied_data_file_is_an_error_not_a_fresh_store(process_server):
    srv = stored(process_server)
    (srv.database / "data.mdb").write_bytes(b"")
    result = serve_exits(srv)
    assert result.returncode == 3 and "Traceback" not in result.stderr  # 3: systemd does not restart it
    assert "data.mdb is empty or truncated (0 bytes): restore it from a backup" in result.stderr
    assert (srv.database / "data.mdb").stat().st_size == 0, "nothing was written over it"


def test_a_data_file_cut_in_half_is_named_at_start_instead_of_a_sigbus(process_server):
    srv = stored(process_server, n=3000)
    data = srv.database / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    result = serve_exits(srv)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "data.mdb is truncated" in result.stderr and "Restore it from a backup" in result.stderr


def test_a_wrecked_page_is_named_at_start_instead_of_an_abort_while_serving(process_server):
    srv = stored(process_server, n=20_000)
    data = srv.database / "data.mdb"
    pages = data.stat().st_size // 4096
    with open(data, "r+b") as f:  # a run of zeroed pages in the middle of the messages' B-tree
        f.seek(pages // 2 * 4096)
        f.write(bytes(4 * 4096))
    result = serve_exits(srv)
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "data.mdb is damaged" in result.stderr and "pzq check" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_one_unreadable_record_is_set_aside_and_the_server_serves_the_rest(process_server):
    srv = stored(process_server, n=10)
    env = lmdb.open(str(srv.database), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(_KEY.pack(1, 4), b"\xc1\xc1 garbage", db=env.open_db(b"messages", txn=txn))
    env.close()
    srv.start()
    got = []
    with client.Consumer(srv.send) as consumer:
        while len(got) < 9:
            delivery = consumer.receive(timeout_s=5)
            assert delivery is not None, f"the server stopped serving after {got}"
            got.append(delivery.body[0])
            consumer.ack(delivery)
    assert got == [b"m%d" % i for i in range(10) if i != 3]
    figures = srv.stats()
    assert (figures["messages"], figures["damaged_total"]) == (0, 1)
    assert "cannot be read" in srv.log.read_text() and srv.proc.poll() is None


def test_pzq_check_and_dump_read_a_store_and_name_what_is_unreadable(process_server, tmp_path):
    import json

    srv = stored(process_server, n=10)
    check = subprocess.run([*srv.argv[:3], "check", str(srv.database)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "queue 'default': 10 messages" in check.stdout, check
    env = lmdb.open(str(srv.database), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(_KEY.pack(1, 4), b"\xc1\xc1 garbage", db=env.open_db(b"messages", txn=txn))
    env.close()
    check = subprocess.run([*srv.argv[:3], "check", str(srv.database)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "1 unreadable" in check.stdout and "Traceback" not in check.stderr
    out = tmp_path / "dump.jsonl"
    dump = subprocess.run(
        [*srv.argv[:3], "dump", str(srv.database), str(out)], capture_output=True, text=True, timeout=60
    )
    assert dump.returncode == 1 and "some records could not be read" in dump.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 9 and {r["queue"] for r in rows} == {"default"}


def test_pzq_check_names_a_truncated_store_in_one_line(process_server):
    srv = stored(process_server, n=3000)
    data = srv.database / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    check = subprocess.run([*srv.argv[:3], "check", str(srv.database)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 3 and "Traceback" not in check.stderr  # damaged: as `pzq serve` exits
    assert check.stderr.strip().splitlines()[-1].startswith("pzq: error:") and "truncated" in check.stderr


@pytest.mark.parametrize(
    "table, key",
    [("groups", b"\0" * 7 + b"\x01g"), ("leases", b"\0" * 16), ("mqks", b"q"), ("schedules", b"s"), ("produced", b"k")],
)
@pytest.mark.parametrize("value", [b"\xc1 not msgpack", b"\x80"])
def test_a_damaged_side_record_is_skipped_at_start_and_named_by_check(process_server, tmp_path, table, key, value):
    srv = stored(process_server, n=3)
    env = lmdb.open(str(srv.database), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(key, value, db=env.open_db(table.encode(), txn=txn))
    env.close()
    check = subprocess.run([*srv.argv[:3], "check", str(srv.database)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and f"table {table}: 0 records, 1 unreadable" in check.stdout, check
    assert "Traceback" not in check.stderr
    srv = start_every_gateway(process_server, tmp_path).server  # every table is read: starts, skips, serves
    with client.Consumer(srv.send) as consumer:
        for _ in range(3):
            delivery = consumer.receive(timeout_s=5)
            assert delivery is not None
            consumer.ack(delivery)
    assert srv.stats()["messages"] == 0 and srv.proc.poll() is None
    if table != "leases":  # (a lease record is read only through its group's, and this one has none)
        assert "cannot be read and is skipped" in srv.log.read_text()


@pytest.fixture(scope="module")
def a_store(tmp_path_factory) -> Path:
    """One store of 50 messages written by a real server, to copy for each test that damages one."""
    srv = ProcessServer(tmp_path_factory.mktemp("pristine")).start()
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"m%d" % i] for i in range(50)]))
    srv.stop()
    return srv.database


def both_commands(srv: ProcessServer, wrapper: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess]:
    """`pzq serve` and `pzq check` on the store of ``srv``, each to its exit (run under ``wrapper``)."""
    check = [*srv.argv[:3], "check", str(srv.database)]
    return [subprocess.run([*wrapper, *argv], capture_output=True, text=True, timeout=60) for argv in (srv.argv, check)]


META = 16  # where a meta page's MDB_meta begins, after the page header: its magic, then its version
HEADER_DAMAGE = {
    "meta page 0 wiped": [(0 * 4096 + META, b"\xaa" * 64)],
    "meta page 1 wiped": [(1 * 4096 + META, b"\xaa" * 64)],
    "both meta pages wiped": [(0 * 4096 + META, b"\xaa" * 64), (1 * 4096 + META, b"\xaa" * 64)],
    "meta page 0 past its magic": [(0 * 4096 + META + 8, b"\xaa" * 180)],
    "meta page 1 past its magic": [(1 * 4096 + META + 8, b"\xaa" * 180)],
    "both meta pages past their magic": [(META + 8, b"\xaa" * 180), (4096 + META + 8, b"\xaa" * 180)],
    "meta page 0 of another format version": [(META + 4, (7).to_bytes(4, "little"))],
}


@pytest.mark.parametrize("damage", [*HEADER_DAMAGE, "random bytes instead of an LMDB file"])
def test_a_damaged_header_exits_3_from_serve_and_check_in_one_line(a_store, tmp_path, damage):
    import random
    import shutil

    srv = ProcessServer(tmp_path)
    shutil.copytree(a_store, srv.database)
    data = srv.database / "data.mdb"
    with open(data, "r+b") as f:
        if damage in HEADER_DAMAGE:
            for offset, garbage in HEADER_DAMAGE[damage]:
                f.seek(offset)
                f.write(garbage)
        else:
            f.truncate(0)
            f.write(random.Random(26).randbytes(64 * 4096))
    for result in both_commands(srv):
        assert result.returncode == 3, result  # 3: systemd does not restart it every 2 s for ever
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"pzq: error: {data} is damaged: LMDB cannot read its header"), line
        assert "restore it from a backup" in line


NOBODY = 65534


def as_another_user() -> tuple[str, ...]:
    """What to run a command under to be refused by the file modes: root reads every file whatever its
    mode, so as root the command runs as nobody. (setpriv, not a preexec_fn that calls setuid: here,
    only setpriv's child may still run the interpreter, whose files are under root's 0700 home.)"""
    if os.geteuid() != 0:
        return ()
    import shutil

    wrapper = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    probe = [*wrapper, sys.executable, "-c", "import pzq"]
    if not shutil.which("setpriv") or subprocess.run(probe, capture_output=True, timeout=30).returncode:
        pytest.skip("running as root, and cannot run pzq as another user here (setpriv missing or refused)")
    return wrapper


@pytest.fixture
def shared_tmp():
    """A directory everyone may enter (pytest's own are its user's alone), removed after the test."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="pzq-perm-"))
    path.chmod(0o755)
    yield path
    for sub in path.rglob("*"):  # (chmod 000 directories are not removable without their mode back)
        if sub.is_dir() and not sub.is_symlink():
            sub.chmod(0o700)
    shutil.rmtree(path)


@pytest.mark.parametrize("denied", ["data.mdb", "the directory"])
def test_a_store_this_user_may_not_open_exits_2_from_serve_and_check_in_one_line(a_store, shared_tmp, denied):
    import shutil

    srv = ProcessServer(shared_tmp)
    shutil.copytree(a_store, srv.database)
    if denied == "data.mdb":
        (srv.database / "data.mdb").chmod(0)
        if os.geteuid() == 0:  # nobody may enter the directory, but not open data.mdb (root's)
            os.chown(srv.database, NOBODY, NOBODY)
    else:
        srv.database.chmod(0)
    results = both_commands(srv, as_another_user())
    for result in results:
        assert result.returncode == 2, result  # 2: a permission to give; systemd does not restart it
        assert "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("pzq: error:") and "Permission denied" in line, line
    assert "must be able to read and write" in results[0].stderr and "may not read" not in results[0].stderr


def test_a_data_file_that_is_a_directory_exits_2_in_one_line(tmp_path):
    srv = ProcessServer(tmp_path)
    (srv.database / "data.mdb").mkdir(parents=True)
    for result in both_commands(srv):
        assert result.returncode == 2 and "Traceback" not in result.stderr, result
        assert result.stderr.strip().splitlines() == [
            f"pzq: error: {srv.database / 'data.mdb'} is not a file: --database must name a pzq store's directory"
        ]
