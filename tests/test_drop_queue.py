"""Deleting a queue over turns (issue 39: `delete_queue` of 200,000 messages had held the loop 634 ms in
one turn): the queue is gone for clients at once, its records go a share at a time, a restart goes on
with them, and at the end nothing of it is left in any table."""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import pytest

from pzq.clients.mqks import MqksClient
from pzq.config import DEFAULT_LIMITS
from pzq.store import Store
from pzq.store.layout import U64

from conftest import free_tcp_endpoint

MIB = 1 << 20


def _left_of(store: Store, qid: int) -> dict[str, int]:
    """Committed records whose key starts with queue ``qid``, per table (what a restart would find)."""
    prefix = U64.pack(qid)
    found = {}
    with store.env.snapshot() as txn:
        for table in ("messages", "deliveries", "dead"):
            cursor = txn.cursor(db=store.env.dbs[table])
            count = 0
            if cursor.set_range(prefix):
                for key in cursor.iternext(values=False):
                    if key[:8] != prefix:
                        break
                    count += 1
            found[table] = count
        found["bodies"] = txn.stat(store.env.dbs["bodies"])["entries"]
    return found


def test_a_dropped_queue_is_gone_at_once_and_its_records_go_a_share_at_a_time_across_a_restart(tmp_path):
    store = Store(tmp_path / "db", max_size=1 << 30)
    empty = store.stored_bytes
    for i in range(300):
        store.put("q", [b"message %d" % i], now_us=1)
    upload = store.bodies.begin([os.urandom(MIB + 7)], MIB)  # (a big body: its chunks go with its record)
    while not upload.done:
        store.bodies.write(upload, 2 * MIB)
    store.put_body("q", upload, now_us=1)
    for seq in (1, 2, 3):
        store.mark_delivered("q", seq)
    for seq in (4, 5):
        assert store.dead_letters.add(store.get("q", seq), "expired", now_us=2)
    store.commit(counts_older_than=time.monotonic() + 1)  # (the delivery counts written too)
    qid, next_seq = store.queue("q").qid, store.queue("q").next_seq
    assert _left_of(store, qid) == {"messages": 299, "deliveries": 3, "dead": 2, "bodies": 2}

    assert store.drops.drop("q") == 299
    store.commit()
    assert store.queue("q", create=False) is None and "q" not in [q.name for q in store.queues()]
    again = store.queue("q")  # the name makes a new, empty queue at once, above every old seq
    assert again.qid != qid and again.next_seq >= next_seq and again.count == 0
    assert store.drops.left() == (1, 301)
    assert store.stored_bytes > empty + MIB, "what is not deleted yet still counts toward the store's size"

    assert store.drops.share(100) == 100
    store.commit()
    store.close()
    store = Store(tmp_path / "db", max_size=1 << 30)  # a restart: what is left is still to delete
    assert store.drops.left() == (1, 201)
    assert _left_of(store, qid)["messages"] == 199
    shares = []
    while store.drops.left()[0]:
        shares.append(store.drops.share(100))
        store.commit()
    assert max(shares) <= 100 and sum(shares) == 199 + 3 + 2, "every record once, a share at a time"
    assert _left_of(store, qid) == {"messages": 0, "deliveries": 0, "dead": 0, "bodies": 0}
    assert [q.name for q in store.queues()] == ["q"]
    with store.env.snapshot() as txn:
        names = [bytes(key) for key in txn.cursor(db=store.env.dbs["queues"]).iternext(values=False)]
    assert names == [b"q"], "the record of what was left to delete went with the last share"
    assert store.stored_bytes == empty, "every byte it counted is given back"
    store.close()
    assert Store(tmp_path / "db", max_size=1 << 30).stored_bytes == empty


def _raw_lines(conn: socket.socket, count: int) -> list[str]:
    data = b""
    while data.count(b"\n") < count:
        chunk = conn.recv(1 << 16)
        assert chunk, "closed"
        data += chunk
    return data.decode().splitlines()


@pytest.mark.timeout(60)
def test_delete_queue_answers_at_once_and_the_records_go_over_turns_while_others_are_served(make_server):
    limits = dataclasses.replace(DEFAULT_LIMITS, turn_records=50)  # (a share of 50 records a turn)
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=limits)
    with MqksClient(srv.config.mqks_dsn) as mq:
        mq.send("r1 rebind --confirm doomed doomed.e")
        assert mq.read_line() == "r1 ok "
        port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
            raw.sendall(b"".join(b"p%d publish --confirm doomed.e x\n" % i for i in range(3000)))
            assert len(_raw_lines(raw, 3000)) == 3000
        mq.send("d1 delete_queue --confirm doomed")
        assert mq.read_line() == "d1 ok "
        mq.send("r2 rebind --confirm doomed doomed.e")  # the name is free at once: a new, empty queue
        mq.send("pg ping served")
        assert [mq.read_line(), mq.read_line()] == ["r2 ok ", "pg ok served"]
        figures = srv.stats()
        assert figures["queues"]["doomed"]["depth"] == 0
        assert figures["mqks"]["deleting_messages"] > 0, "the records of the old one were still going"
        deadline = time.monotonic() + 30
        while srv.stats()["mqks"]["deleting_queues"]:
            assert time.monotonic() < deadline, "the records of a deleted queue never went"
            time.sleep(0.05)
