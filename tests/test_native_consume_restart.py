"""A batched consumer (BatchConsumer, PZQ-BATCH/1) whose server goes away under it: killed (SIGKILL) and
started again on the same store, or stopped (SIGSTOP) and continued. Real `pzq serve` processes.

The consumer hears a dropped connection from its socket monitor and starts afresh at once (HELLO and its
credit again), instead of at its keepalive, a third of the server's consume idle time (20 s by default:
a consumer idle with its credit granted waited that long for the first message after a restart). What it
held went back to the queue on the server's side; the acks of it the caller still sends get a clear
answer (refused: not held), never a wait for an answer that will not come.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients import consume_link
from pzq.clients import native as client
from pzq.clients.cluster import Cluster
from pzq.clients.cluster_consume import ShardedConsumer
from pzq.errors import AnswerLost

from conftest import ProcessServer, steady_ports

pytestmark = pytest.mark.timeout(120)
BACK_S = 5.0  # the next message after the server is back comes within this (it was ~20 s: the keepalive)


def steady_tcp() -> str:
    """A free loopback tcp endpoint below the kernel's ephemeral ports (conftest.steady_ports): while the
    server is down, a port of that range may be taken by its own client reconnecting to it."""
    return f"tcp://127.0.0.1:{steady_ports(1, 21_000, 28_000)[0]}"


def produce(srv: ProcessServer, n: int, prefix: str = "m") -> list[bytes]:
    bodies = [f"{prefix}{i}".encode() for i in range(n)]
    with client.Producer(srv.receive, timeout_s=5) as producer:
        assert all(r.ok for r in producer.send_many([[b] for b in bodies], batch=n))
    return bodies


def serve(tmp_path: Path, consume: str | None = None) -> ProcessServer:
    srv = ProcessServer(tmp_path, *(("--consume-dsn", consume) if consume else ()))
    srv.consume = consume or srv.consume
    return srv.start()


def test_an_idle_consumer_gets_the_first_message_within_seconds_of_its_server_killed_and_restarted(tmp_path):
    srv = serve(tmp_path, steady_tcp())  # (over tcp://, as across hosts)
    try:
        with client.BatchConsumer(srv.consume, prefetch=10) as consumer:
            assert consumer.receive(10, timeout_s=0.2) == []  # (idle, its credit granted)
            back: list[float] = []

            def kill_restart_produce() -> None:
                srv.stop(signal.SIGKILL)
                srv.start()
                back.append(time.monotonic())
                produce(srv, 1)

            fault = threading.Thread(target=kill_restart_produce)
            fault.start()
            batch = consumer.receive(10, timeout_s=30)  # (waiting through the kill and the restart)
            came = time.monotonic()
            fault.join()
            assert [body for _, body in batch] == [[b"m0"]]
            assert came - back[0] < BACK_S, f"{came - back[0]:.1f} s after the server was back"
            assert consumer.ack([batch[0][0]]).count == 1 and consumer.reconnects >= 1
    finally:
        srv.stop(signal.SIGKILL)


def test_a_consumer_gets_messages_again_within_seconds_of_its_server_stopped_and_continued(tmp_path):
    srv = serve(tmp_path)
    try:
        with client.BatchConsumer(srv.consume) as consumer:
            assert consumer.receive(10, timeout_s=0.2) == []
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGSTOP)
            try:
                assert consumer.receive(10, timeout_s=1.5) == []
            finally:
                srv.proc.send_signal(signal.SIGCONT)
            continued = time.monotonic()
            produce(srv, 3)
            batch = consumer.receive(10, timeout_s=30)
            assert time.monotonic() - continued < BACK_S
            assert [body[0] for _, body in batch] == [b"m0", b"m1", b"m2"]
            assert consumer.ack([key for key, _ in batch]).count == 3
    finally:
        srv.stop(signal.SIGKILL)


def test_a_consumer_whose_server_is_silent_past_the_heartbeat_s_timeout_starts_afresh_and_reads_it_again(
    tmp_path, monkeypatch
):
    # (as a host that lost power: nothing closes the connection; only the server's silence tells)
    monkeypatch.setitem(consume_link.OPTIONS, zmq.HEARTBEAT_TIMEOUT, 1000)
    monkeypatch.setitem(consume_link.OPTIONS, zmq.HEARTBEAT_IVL, 200)
    srv = serve(tmp_path)
    try:
        with client.BatchConsumer(srv.consume) as consumer:
            assert consumer.receive(10, timeout_s=0.2) == []
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGSTOP)
            try:
                assert consumer.receive(10, timeout_s=2.5) == []
                assert consumer.reconnects >= 1, "its silence was heard: the connection taken for dropped"
            finally:
                srv.proc.send_signal(signal.SIGCONT)
            continued = time.monotonic()
            produce(srv, 1)
            batch = consumer.receive(10, timeout_s=30)
            assert time.monotonic() - continued < BACK_S
            assert [body for _, body in batch] == [[b"m0"]] and consumer.ack([batch[0][0]]).count == 1
    finally:
        srv.stop(signal.SIGKILL)


def test_acking_what_was_held_before_a_restart_is_answered_at_once_and_the_messages_come_again(tmp_path):
    srv = serve(tmp_path)
    try:
        produce(srv, 3)
        with client.BatchConsumer(srv.consume) as consumer:
            held = consumer.receive(3, timeout_s=5)
            assert len(held) == 3
            srv.stop(signal.SIGKILL)
            srv.start()
            started = time.monotonic()
            try:  # (sent on the old socket, or after the consumer heard the drop: refused by the server)
                settled = consumer.ack([key for key, _ in held], timeout_s=10)
                assert settled.count == 0 and settled.refused == [key for key, _ in held]
            except AnswerLost:  # (the old socket's pipe took it and the drop was heard first)
                pass
            assert time.monotonic() - started < BACK_S, "answered, not timed out"
            again = consumer.receive(3, timeout_s=10)  # (they were never acked: back from the store)
            assert sorted(key for key, _ in again) == sorted(key for key, _ in held)
            assert consumer.ack([key for key, _ in again]).count == 3
    finally:
        srv.stop(signal.SIGKILL)


def test_acks_the_killed_server_never_answered_raise_answer_lost_at_once_not_at_their_timeout(tmp_path):
    srv = serve(tmp_path)
    try:
        produce(srv, 4)
        with client.BatchConsumer(srv.consume) as consumer:
            held = consumer.receive(4, timeout_s=5)
            keys = [key for key, _ in held]
            assert srv.proc is not None
            srv.proc.send_signal(signal.SIGSTOP)  # (it reads nothing more: the acks below are lost with it)
            consumer.ack_async(keys[:2])
            consumer.ack_async(keys[2:])
            srv.stop(signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(AnswerLost, match="dropped before it answered 2 ACK"):
                consumer.settle(timeout_s=10)
            assert time.monotonic() - started < 2, "said at the drop: no wait for the server"
            assert consumer.settle(timeout_s=1).count == 0, "said once"
            srv.start()
            again = consumer.receive(4, timeout_s=10)
            assert sorted(key for key, _ in again) == sorted(keys), "not acked: they come again"
            assert consumer.ack([key for key, _ in again]).count == 4
    finally:
        srv.stop(signal.SIGKILL)


def test_a_consumer_on_the_legacy_send_socket_gets_messages_again_after_its_server_restarted(tmp_path):
    srv = serve(tmp_path)
    try:
        with client.BatchConsumer(None, fallback=srv.send) as consumer:
            assert not consumer.batched and consumer.receive(10, timeout_s=0.2) == []
            srv.stop(signal.SIGKILL)
            srv.start()
            back = time.monotonic()
            produce(srv, 2)
            batch = consumer.receive(10, timeout_s=30)
            assert time.monotonic() - back < BACK_S
            while len(batch) < 2:  # (the send socket pushes each message alone: they may come apart)
                batch += consumer.receive(10, timeout_s=5) or pytest.fail(f"only {len(batch)} came")
            assert sorted(body[0] for _, body in batch) == [b"m0", b"m1"]
            consumer.ack([key for key, _ in batch])
    finally:
        srv.stop(signal.SIGKILL)


def test_a_sharded_consumer_gets_a_restarted_shard_s_messages_within_seconds(tmp_path):
    (tmp_path / "a").mkdir()
    srv = serve(tmp_path / "a")
    listing = tmp_path / "shards.toml"
    endpoints = {"receive_dsn": srv.receive, "send_dsn": srv.send, "consume_dsn": srv.consume}
    listing.write_text('[[shard]]\nname = "a"\n' + "".join(f'{k} = "{v}"\n' for k, v in endpoints.items()))
    cluster = Cluster.from_file(str(listing))
    try:
        with ShardedConsumer(cluster, "default") as consumer:
            assert consumer.receive(10, timeout_s=0.2) == []
            srv.stop(signal.SIGKILL)
            srv.start()
            back = time.monotonic()
            produce(srv, 1)
            batch = consumer.receive(10, timeout_s=30)
            assert time.monotonic() - back < BACK_S, f"{time.monotonic() - back:.1f} s"
            assert [body for _, body in batch] == [[b"m0"]] and consumer.ack([batch[0][0]]).count == 1
    finally:
        cluster.close()
        srv.stop(signal.SIGKILL)


def test_a_curve_consumer_gets_the_first_message_within_seconds_of_its_server_killed_and_restarted(tmp_path):
    from test_curve import curve_server

    runner = CliRunner()
    keys = tmp_path / "keys"
    for name in ("server", "alice"):
        assert runner.invoke(cli, ["keygen", str(keys / name), name]).exit_code == 0
    (keys / "clients").mkdir()
    shutil.copy(keys / "alice" / "alice.key", keys / "clients")
    srv = ProcessServer(tmp_path, *curve_server(keys)).start()
    alice = (str(keys / "alice" / "alice.key_secret"), str(keys / "server" / "server.key"))
    try:
        # (a CURVE client's socket has its monitor already, its Reach: the drop is counted there)
        with client.BatchConsumer(srv.consume, curve=alice) as consumer:
            assert consumer.receive(10, timeout_s=0.2) == []
            srv.stop(signal.SIGKILL)
            srv.start()
            back = time.monotonic()
            with client.Producer(srv.receive, curve=alice, timeout_s=5) as producer:
                assert producer.send_many([[b"m0"]], batch=1)[0].ok
            batch = consumer.receive(10, timeout_s=30)
            assert time.monotonic() - back < BACK_S and consumer.reconnects >= 1
            assert [body for _, body in batch] == [[b"m0"]] and consumer.ack([batch[0][0]]).count == 1
    finally:
        srv.stop(signal.SIGKILL)
