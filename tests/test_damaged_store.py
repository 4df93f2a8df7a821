"""A damaged store is named, not crashed on: an empty or truncated data file stops the server at start
with one clear line (never a silent fresh start, never SIGBUS), and one unreadable record is set aside
while the server goes on serving."""

from __future__ import annotations

import subprocess

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
            delivery = consumer.receive(5000)
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
    assert check.returncode == 1 and "Traceback" not in check.stderr
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
            delivery = consumer.receive(5000)
            assert delivery is not None
            consumer.ack(delivery)
    assert srv.stats()["messages"] == 0 and srv.proc.poll() is None
    if table != "leases":  # (a lease record is read only through its group's, and this one has none)
        assert "cannot be read and is skipped" in srv.log.read_text()
