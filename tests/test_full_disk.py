"""A full disk never wedges the store: on a real small filesystem (a tmpfs this test mounts), producers
get "queue full" before it fills, consumers drain even when something else takes the last byte, and a
restart with a limit below what is stored starts and drains."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from pzq.clients import native as client
from pzq.protocols.phpmq import encode

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


def serve_on(disk, tmp_path, *extra: str) -> ProcessServer:
    srv = ProcessServer(tmp_path, "--min-disk-free", "4M", "--disk-reserve", "2M", *extra)
    srv.database = disk / "db"
    srv.argv[srv.argv.index("--database") + 1] = str(srv.database)
    return srv.start()


def fill_until_refused(srv: ProcessServer) -> tuple[int, set[str]]:
    """Produce 4 KiB messages until the server refuses; returns (stored, the refusal texts)."""
    stored, errors = 0, set()
    with client.Producer(srv.receive, timeout_ms=10_000) as producer:
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
                delivery = consumer.receive(500)
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
                delivery = consumer.receive(200)
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
