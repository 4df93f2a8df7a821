"""Turns whose commit fails (a real StoreError, raised by the store itself) count no delivery that did
not leave, and say so in one log line now and then, not a traceback each turn."""

from __future__ import annotations

import collections
import logging
import threading
import time

import msgpack
import pytest

from pzq.clients import native as client
from pzq.gateways.native import ref_of_key
from pzq.store import Store
from pzq.store.layout import KEY

from conftest import ThreadServer, make_config

pytestmark = pytest.mark.timeout(60)


def plant_a_foreign_record(path, queue: str, messages: int) -> None:
    """Store ``messages`` messages, then write the record after the next seq as a second writer of
    the file would: from then on every second message produced in a turn fails, and the turn with it."""
    store = Store(path, max_size=64 << 20)
    try:
        for n in range(messages):
            store.put(queue, [b"m%d" % n], now_us=1)
        store.commit()
        info = store.queue(queue)
        txn = store.env.write()  # (committed without the store's knowledge, as another process would)
        txn.put(KEY.pack(info.qid, info.next_seq + 1), msgpack.packb([5, 0, [b"theirs"]]), db=store._messages_db)
        store.env.commit()
    finally:
        store.close()


def failing_producer(endpoint: str, stop: threading.Event) -> None:
    """Produces two messages at a time until ``stop``: each pair's turn fails to store the second."""
    with client.Producer(endpoint, timeout_s=5) as producer:
        while not stop.is_set():
            producer.produce_many([[b"x"], [b"y"]], window=2)


def test_a_failing_commit_counts_no_delivery_that_did_not_leave(tmp_path, caplog):
    cfg = make_config(tmp_path, ack_timeout=600.0)
    plant_a_foreign_record(tmp_path / "db", cfg.queue, 50)
    srv = ThreadServer(cfg)
    stop = threading.Event()
    received: collections.Counter = collections.Counter()
    with caplog.at_level(logging.INFO, logger="pzq"), client.Consumer(srv.send) as consumer:
        producer = threading.Thread(target=failing_producer, args=(srv.receive, stop), daemon=True)
        producer.start()
        deadline = time.monotonic() + 1  # (hundreds of failing turns)
        while time.monotonic() < deadline:
            delivery = consumer.receive(timeout_s=0.2)
            if delivery is not None:
                received[ref_of_key(delivery.key)] += 1  # (never acked: each count is deliveries that left)
        stop.set()
        producer.join(10)
        # Whatever was on its way, before the server stops: a socket closed with deliveries in its
        # pipe drops them (as a crash would), and those did leave the server's hands.
        while (delivery := consumer.receive(timeout_s=0.5)) is not None:
            received[ref_of_key(delivery.key)] += 1
        srv.stop()
    failed = [r for r in caplog.records if "store failure" in r.getMessage()]
    store = Store(tmp_path / "db", max_size=64 << 20)
    try:
        with store.env.reading() as txn:
            counts = {
                (m.qid, m.seq): store.deliveries(KEY.pack(m.qid, m.seq), txn) for m in store.scan(cfg.queue, 0, 1000)
            }
    finally:
        store.close()
    assert received, "the consumer was served while commits failed"
    wrong = {ref: (counts.get(ref), n) for ref, n in received.items() if counts.get(ref) != n}
    assert not wrong, f"(stored count, deliveries that left) of {len(wrong)} messages: {list(wrong.items())[:5]}"
    assert len(failed) == 1, "hundreds of failed turns in a second: one line (the next one 10 s later)"
    assert "already stored" in failed[0].getMessage() and failed[0].exc_info is None, "one line, no traceback"


def test_a_run_of_failures_is_logged_with_how_many_were_not(caplog):
    from pzq.logs import Throttled

    throttled = Throttled(logging.getLogger("pzq.test"), every_s=0.0)
    quiet = Throttled(logging.getLogger("pzq.test"), every_s=3600.0)
    with caplog.at_level(logging.DEBUG, logger="pzq.test"):
        assert quiet.error("commit failed: %s", "full") and not quiet.error("commit failed: %s", "full")
        quiet.every_s = 0.0
        assert quiet.error("commit failed: %s", "full")
        assert throttled.error("x")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["commit failed: full", "commit failed: full (1 more failed since the last line)", "x"]
    assert all(r.exc_info is None for r in caplog.records if r.levelno == logging.ERROR)
