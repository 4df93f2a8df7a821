"""Batched native consumers (PZQ-BATCH/1) against a real server: credit, batches, ownership, sharing the
queue with the legacy send socket, durability across a restart, and hostile consumers."""

from __future__ import annotations

import dataclasses
import random
import signal
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from pzq.clients import native as client
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS
from pzq.errors import ClientError
from pzq.protocols import native_consume as wire

from conftest import free_tcp_endpoint, recv, wait_until


def produce(endpoint: str, count: int, prefix: bytes = b"m") -> None:
    with client.Producer(endpoint) as producer:
        results = producer.produce_many([[prefix + b"%d" % i] for i in range(count)])
    assert all(r.ok for r in results)


def dealer(sockets, srv) -> zmq.Socket:
    sock = sockets(zmq.DEALER, srv.config.consume_dsn)
    sock.send_multipart(wire.hello())
    assert isinstance(wire.parse_reply(recv(sock)), wire.Limits)
    return sock


def take(sock: zmq.Socket, count: int) -> None:
    """Grant ``count`` deliveries and read DELIVERs until that many keys came."""
    sock.send_multipart(wire.credit(count))
    got = 0
    while got < count:
        got += len(wire.parse_reply(recv(sock)).keys)


def hog(sockets, srv) -> zmq.Socket:
    """A batched consumer that reads its HELLO answer, asks for 1,000 and then reads nothing (a 1-message
    pipe and a 4 KiB receive buffer: what pzq sends it soon waits on pzq's side)."""
    sock = sockets(zmq.DEALER, None)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(srv.config.consume_dsn)
    sock.send_multipart(wire.hello())
    assert isinstance(wire.parse_reply(recv(sock)), wire.Limits)
    sock.send_multipart(wire.credit(1000))
    return sock


def nothing_within(sock: zmq.Socket, ms: int) -> bool:
    return not sock.poll(ms)


def test_credit_n_gives_exactly_n_deliveries_and_no_more(server, sockets):
    produce(server.receive, 50)
    sock = dealer(sockets, server)
    sock.send_multipart(wire.credit(7))
    got: list[bytes] = []
    while len(got) < 7:
        got += wire.parse_reply(recv(sock)).keys
    assert len(got) == 7
    assert nothing_within(sock, 300)
    assert server.stats()["queues"]["default"]["inflight"] == 7


def test_a_batch_comes_in_fifo_order_is_acked_in_one_ack_and_settled(server):
    produce(server.receive, 30)
    with client.BatchConsumer(server.config.consume_dsn) as consumer:
        assert consumer.batched
        batch = consumer.receive(30, timeout_s=5)
        while len(batch) < 30:
            batch += consumer.receive(30 - len(batch), timeout_s=5)
        assert [body for _, body in batch] == [[b"m%d" % i] for i in range(30)]
        settled = consumer.ack([key for key, _ in batch])
        assert (settled.count, settled.refused) == (30, [])
    assert server.stats()["queues"]["default"]["depth"] == 0


def test_a_consumer_cannot_ack_or_nack_another_consumers_keys(server):
    produce(server.receive, 4)
    with client.BatchConsumer(server.config.consume_dsn) as one, client.BatchConsumer(server.config.consume_dsn) as two:
        mine = one.receive(2, timeout_s=5)
        assert len(mine) == 2
        keys = [key for key, _ in mine]
        assert two.ack(keys).refused == keys
        assert two.nack(keys).refused == keys
        forged = b"0000000000000001|ffffffffffffffffffffffffffffffff"
        assert one.ack([*keys, forged, b"garbage"]) == wire.Settled(2, [forged, b"garbage"])
    assert server.stats()["queues"]["default"]["depth"] == 2


def test_a_nacked_message_comes_back_first_and_its_delivery_counts(server):
    produce(server.receive, 3)
    with client.BatchConsumer(server.config.consume_dsn) as consumer:
        first = consumer.receive(1, timeout_s=5)
        assert consumer.nack([first[0][0]]) == wire.Settled(1, [])
        again = consumer.receive(1, timeout_s=5)
        assert again == first
        consumer.ack([again[0][0]])


def test_bye_gives_back_everything_held(server, sockets):
    produce(server.receive, 5)
    sock = dealer(sockets, server)
    sock.send_multipart(wire.credit(5))
    assert len(wire.parse_reply(recv(sock)).keys) == 5
    sock.send_multipart(wire.bye())
    assert wire.parse_reply(recv(sock)) == 5
    assert server.stats()["queues"]["default"]["inflight"] == 0


def test_legacy_and_batched_consumers_share_the_queue_without_loss_or_duplicates(server, sockets):
    total = 600
    produce(server.receive, total)
    legacy = sockets(zmq.ROUTER, server.send)
    seen: list[bytes] = []
    with client.BatchConsumer(server.config.consume_dsn) as batched:

        def drain() -> bool:
            while legacy.poll(0):
                frames = legacy.recv_multipart()
                seen.append(frames[5])
                legacy.send_multipart([frames[0], frames[1], b"1"])
            batch = batched.receive(50, timeout_s=0.02)
            seen.extend(body[0] for _, body in batch)
            if batch:
                assert batched.ack([key for key, _ in batch]).refused == []
            return len(seen) >= total

        wait_until(drain, timeout_s=30)
    assert sorted(seen) == sorted(b"m%d" % i for i in range(total))
    assert wait_until(lambda: server.stats()["queues"]["default"]["depth"] == 0)


def test_acked_messages_are_gone_and_unacked_ones_back_after_a_restart(process_server):
    srv = process_server()
    produce(srv.receive, 10)
    with client.BatchConsumer(srv.consume) as consumer:
        batch = consumer.receive(6, timeout_s=5)
        while len(batch) < 6:
            batch += consumer.receive(6 - len(batch), timeout_s=5)
        assert consumer.ack([key for key, _ in batch[:4]]) == wire.Settled(4, [])  # (answered after the commit)
        srv.stop(9)  # (SIGKILL: no clean shutdown; the two unacked are still held)
    srv.start()
    with client.BatchConsumer(srv.consume) as consumer:
        rest = consumer.receive(10, timeout_s=5)
        while len(rest) < 6:
            rest += consumer.receive(10 - len(rest), timeout_s=2)
    assert [body for _, body in rest] == [[b"m%d" % i] for i in range(4, 10)]


def test_a_server_without_the_endpoint_is_consumed_through_the_send_socket(make_server):
    srv = make_server(consume_dsn="")
    produce(srv.receive, 3)
    endpoint = srv.config.send_dsn.replace("send", "consume")  # (nobody binds it)
    with client.BatchConsumer(endpoint, fallback=srv.send, hello_timeout_s=0.3) as consumer:
        assert not consumer.batched
        got = consumer.receive(3, timeout_s=5)
        while len(got) < 3:
            got += consumer.receive(3 - len(got), timeout_s=5)
        assert consumer.ack([key for key, _ in got]).count == 3
    assert wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == 0)


# -- hostile consumers: each is answered ERR (changing nothing) or capped, and an honest one is served ----


def honest_round_trip(srv, n: int = 3) -> None:
    produce(srv.receive, n, b"honest")
    with client.BatchConsumer(srv.config.consume_dsn) as consumer:
        got = consumer.receive(n, timeout_s=5)
        while len(got) < n:
            got += consumer.receive(n - len(got), timeout_s=5)
        assert consumer.ack([key for key, _ in got]) == wire.Settled(n, [])


def test_credit_past_the_limit_garbage_credit_and_malformed_keys_are_answered_err_and_change_nothing(server, sockets):
    sock = dealer(sockets, server)
    for frames, code in (
        (wire.credit(10**12), "too-much-credit"),
        ([b"CREDIT", b"-5"], "bad-credit"),
        ([b"CREDIT", b"lots"], "bad-credit"),
        ([b"ACK", b"\xdd\xff\xff\xff\xff"], "too-many-keys"),
        ([b"NACK", b"\x81\xa1k\x01"], "bad-keys"),
        ([b"ACK", b"\x91\xc4\x41" + b"k" * 65], "bad-keys"),
        ([b"DRAIN"], "unknown-command"),
    ):
        sock.send_multipart(frames)
        reply = wire.parse_reply(recv(sock))
        assert getattr(reply, "code", None) == code, (frames, reply)
    stranger = sockets(zmq.DEALER, server.config.consume_dsn)
    stranger.send_multipart(wire.credit(5))
    assert wire.parse_reply(recv(stranger)).code == "hello-first"
    produce(server.receive, 2)
    assert nothing_within(sock, 200)  # (no credit was granted by any of it)
    honest_round_trip(server)


def test_credit_counts_what_the_consumer_holds(make_server, sockets):
    srv = make_server(limits=dataclasses.replace(DEFAULT_LIMITS, consume_max_credit=10))
    produce(srv.receive, 20)
    sock = dealer(sockets, srv)
    take(sock, 8)
    sock.send_multipart(wire.credit(3))  # (8 held + 3 > 10)
    assert wire.parse_reply(recv(sock)).code == "too-much-credit"
    sock.send_multipart(wire.credit(2))
    assert len(wire.parse_reply(recv(sock)).keys) == 2


def test_hellos_past_the_consumer_cap_evict_idle_ones_or_are_refused_and_an_honest_consumer_is_served(
    make_server, sockets
):
    srv = make_server(limits=dataclasses.replace(DEFAULT_LIMITS, consume_max_consumers=8))
    produce(srv.receive, 100)
    holders = []
    for _ in range(7):  # (each holds a delivery: none of them may be evicted)
        sock = dealer(sockets, srv)
        sock.send_multipart(wire.credit(1))
        assert len(wire.parse_reply(recv(sock)).keys) == 1
        holders.append(sock)
    for _ in range(40):  # idle ones come and go: each new one evicts the last
        dealer(sockets, srv).close(linger=0)
    honest_round_trip(srv)  # (the last idle one is evicted for it; its BYE leaves 7 known)
    eighth = dealer(sockets, srv)
    eighth.send_multipart(wire.credit(1))
    assert len(wire.parse_reply(recv(eighth)).keys) == 1  # (it holds: not evictable; 8 known)
    refused = sockets(zmq.DEALER, srv.config.consume_dsn)
    refused.send_multipart(wire.hello())
    reply = wire.parse_reply(recv(refused))
    assert getattr(reply, "code", None) == "too-many-consumers"
    assert srv.stats()["native_batch"]["consumers"] == 8


def test_an_ack_flood_of_unknown_keys_is_refused_and_the_server_keeps_serving(server, sockets):
    flood = dealer(sockets, server)
    keys = msgpack.packb([b"%016d|%032x" % (i, i) for i in range(1000)])
    for _ in range(300):
        flood.send_multipart([b"ACK", keys])
    honest_round_trip(server)
    # Every ACK read is answered with its 1,000 keys refused; while answers wait unread in pzq's backlog
    # (its pipe full), the flood's further commands are dropped unread (it is served nothing more).
    answers = 0
    while flood.poll(1000):
        reply = wire.parse_reply(flood.recv_multipart())
        assert reply.count == 0 and len(reply.refused) == 1000
        answers += 1
    assert 0 < answers <= 300
    assert server.stats()["native_batch"]["refused_keys_total"] >= answers * 1000


def test_ten_thousand_hellos_from_distinct_identities_keep_the_known_consumers_capped(store):
    from pzq.broker import Broker
    from pzq.gateways.native_consume import BatchConsumeGateway

    broker = Broker(store, ack_timeout_s=5.0)
    broker.produce_many("default", [[b"x"]] * 10, now_us=1)
    gateway = BatchConsumeGateway(broker, queue="default", ack_timeout_s=5.0)
    honest = gateway.received(b"honest", [b"HELLO"], now=0.0) + gateway.received(b"honest", [b"CREDIT", b"5"], now=0.0)
    assert [out.kind for out in honest] == [wire.HELLO]
    kinds = [gateway.received(b"peer-%d" % i, [b"HELLO"], now=1.0)[0].kind for i in range(10_000)]
    assert kinds == [wire.HELLO] * 10_000  # (each idle one without credit is evicted for the next)
    assert len(gateway.consumers) == DEFAULT_LIMITS.consume_max_consumers
    assert b"honest" in gateway.consumers  # (it has credit: never evicted)
    delivered = gateway.dispatch(now=Now(1.0, 2), most=100, blocked=lambda peer: False)
    assert [out.frames[0] for out in delivered] == [b"honest"] and len(delivered[0].refs) == 5


def test_consume_n_takes_exactly_n_so_none_is_dead_lettered_unseen(process_server):
    from click.testing import CliRunner

    from pzq.cli import cli

    srv = process_server("--max-deliveries", "1", ack_timeout="200ms")
    produce(srv.receive, 1000)
    args = ["consume", "-n", "2", "--send-dsn", srv.send, "--consume-dsn", srv.consume, "--timeout", "5s"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:2] == ["m0", "m1"]
    again = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert again.output.splitlines()[:2] == ["m2", "m3"]  # (the next consume begins where this one ended)
    wait_until(lambda: srv.stats()["queues"]["default"]["inflight"] == 0)
    figures = srv.stats()["queues"]["default"]
    assert (figures["depth"], figures["dead_letters"]) == (996, 0)


def test_a_consumer_whose_tcp_connection_closes_gives_back_what_it_held_at_once(make_server, sockets):
    srv = make_server(consume_dsn=free_tcp_endpoint()[0], ack_timeout=60.0)
    produce(srv.receive, 10)
    sock = dealer(sockets, srv)
    take(sock, 6)
    assert srv.stats()["queues"]["default"]["inflight"] == 6
    sock.close(linger=0)  # (no BYE: a crashed consumer)
    assert wait_until(lambda: srv.stats()["queues"]["default"]["inflight"] == 0, timeout_s=10)  # (not in 60 s)
    honest_round_trip(srv, 10)


def test_a_delivery_not_settled_within_the_ack_timeout_goes_back_and_counted_once_against_the_cap(make_server, sockets):
    srv = make_server(ack_timeout=0.3, max_deliveries=1)
    produce(srv.receive, 2)
    sock = dealer(sockets, srv)
    sock.send_multipart(wire.credit(1))
    first = wire.parse_reply(recv(sock))
    assert first.bodies == [[b"m0"]] and first.ack_timeout_us == 300_000
    assert wait_until(lambda: srv.stats()["queues"]["default"]["inflight"] == 0)  # (back after 0.3 s)
    sock.send_multipart(wire.credit(1))
    assert wire.parse_reply(recv(sock)).bodies == [[b"m1"]]  # (m0 was delivered its one time: dead letter)
    assert srv.stats()["queues"]["default"]["dead_letters"] == 1
    sock.send_multipart(wire.ack(first.keys))  # (a late ack of a dead letter: refused, nothing changes)
    assert wire.parse_reply(recv(sock)) == wire.Settled(0, first.keys)


def test_the_client_never_asks_for_more_than_it_may_hold_unacked(make_server):
    srv = make_server(limits=dataclasses.replace(DEFAULT_LIMITS, consume_max_credit=10))
    produce(srv.receive, 30)
    with client.BatchConsumer(srv.config.consume_dsn) as consumer:
        held = []
        while len(held) < 10:
            held += consumer.receive(4, timeout_s=5)  # (4 at a time, none acked: at most 10 in all)
        assert consumer.receive(4, timeout_s=0.3) == []  # (no ERR: it asked for nothing more)
        assert consumer.ack([key for key, _ in held]).count == 10
        assert len(consumer.receive(4, timeout_s=5)) > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkills_while_a_batched_consumer_acks_in_bursts_bring_back_no_settled_message_and_lose_none(
    process_server,
):
    # The ack-burst case of the crash tests, batched: SETTLED is answered after the commit, so what a
    # consumer was told is settled never comes back after a kill -9; what it was not told may or may not.
    srv = process_server()
    everything = {b"m%d" % i for i in range(3000)}
    produce(srv.receive, len(everything))
    settled: set[bytes] = set()
    unknown: set[bytes] = set()
    for _ in range(4):
        killer = threading.Timer(random.uniform(0.05, 0.4), srv.proc.send_signal, (signal.SIGKILL,))
        with client.BatchConsumer(srv.consume, hello_timeout_s=5) as consumer:
            killer.start()
            while srv.proc.poll() is None:
                try:
                    batch = consumer.receive(200, timeout_s=1)
                except ClientError:
                    break
                if not batch:
                    continue
                bodies = {body[0] for _, body in batch}
                try:
                    result = consumer.ack([key for key, _ in batch], timeout_s=2)
                except ClientError:  # (killed before it answered: these may be stored or gone)
                    unknown |= bodies
                    break
                assert result.refused == []
                settled |= bodies
        killer.join()
        srv.proc.wait(10)
        srv.start()
    rest: list[bytes] = []
    with client.BatchConsumer(srv.consume) as consumer:
        while batch := consumer.receive(500, timeout_s=2):
            rest += [body[0] for _, body in batch]
            consumer.ack([key for key, _ in batch])
    assert settled, "some bursts were settled before the kills"
    assert not settled & set(rest), "a message settled before a kill came back"
    assert everything - settled - unknown <= set(rest), "a message never settled was lost"


def test_consumers_that_never_read_their_delivers_wait_and_do_not_raise_the_alarm_that_refuses_producers(
    make_server, sockets
):
    srv = make_server(memory_high_water=8 << 20, memory_low_water=6 << 20)
    body = b"x" * (256 << 10)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[body]] * 60))
    hogs = []
    for _ in range(6):  # (they read their HELLO answer, then nothing: their pipes fill)
        hogs.append(hog(sockets, srv))
    assert wait_until(lambda: srv.stats()["native_batch"]["delivered_total"] >= 4)
    with client.Producer(srv.receive) as producer:
        for _ in range(20):  # (a turn after another: deliveries stop at the ceiling, never past the alarm)
            assert producer.produce_many([[b"honest"]])[0].ok
    memory = srv.stats()["memory"]
    assert memory["alarms_total"] == 0 and memory["counted_peak_bytes"] < 8 << 20


def test_a_server_on_an_ipc_send_socket_puts_the_batched_endpoint_beside_it_not_on_a_tcp_port(process_server):
    # Another process holding tcp://127.0.0.1:11134 (the default beside the default send socket) does not
    # stop a server whose send socket is an ipc file: its batched endpoint is an ipc file beside that one
    holder = zmq.Context.instance().socket(zmq.ROUTER)
    holder.linger = 0
    try:
        holder.bind("tcp://127.0.0.1:11134")
    except zmq.ZMQError:
        pass  # (something holds it already: the same situation)
    try:
        srv = process_server("--consume-dsn", "auto")
        beside = srv.send.rsplit("/", 1)[0] + "/consume"
        assert Path(beside.removeprefix("ipc://")).exists()
        produce(srv.receive, 3)
        with client.BatchConsumer(beside) as consumer:
            assert consumer.batched
            batch = consumer.receive(3, timeout_s=5)
            while len(batch) < 3:
                batch += consumer.receive(3 - len(batch), timeout_s=5)
            assert consumer.ack([key for key, _ in batch]).count == 3
    finally:
        holder.close(linger=0)


def test_consumers_that_never_read_stall_only_themselves_and_a_consumer_that_reads_drains_the_queue(
    make_server, sockets
):
    # (memory, not durability: 20 MB stored without an fsync for each of its commits)
    srv = make_server(memory_high_water=8 << 20, memory_low_water=6 << 20, ack_timeout=60.0, hard_sync=False)
    body = b"x" * (256 << 10)
    with client.Producer(srv.receive) as producer:
        for _ in range(8):  # (a few at a time: the producers' own bound is not what this test is about)
            assert all(r.ok for r in producer.produce_many([[body]] * 10))
    with client.BatchConsumer(srv.config.consume_dsn, prefetch=4) as polite:
        first = polite.receive(4, timeout_s=5)
        assert first and polite.ack([key for key, _ in first]).refused == []
        got = len(first)
        for _ in range(12):  # (they read their HELLO answer, then nothing: their pipes fill to the ceiling)
            hog(sockets, srv)
        assert wait_until(lambda: srv.stats()["memory"]["deliveries_bytes"] >= 5 << 20)
        # Until every message left is in flight (the hogs hold it, or it is on its way to the polite
        # consumer): a barrier the server's figures give, not a wait for nothing more to come.
        deadline = time.monotonic() + 30
        while (queue := srv.stats()["queues"]["default"])["depth"] > queue["inflight"]:
            assert time.monotonic() < deadline, f"the polite consumer stalled after {got}: {queue}"
            if batch := polite.receive(4, timeout_s=0.2):
                assert polite.ack([key for key, _ in batch]).refused == []
                got += len(batch)
        queue = srv.stats()["queues"]["default"]
        assert queue["depth"] == queue["inflight"] == 80 - got, f"the polite consumer stalled after {got}"
    assert got >= 40, got
    memory = srv.stats()["memory"]
    assert memory["alarms_total"] == 0 and memory["counted_peak_bytes"] < 8 << 20


def test_a_consumer_with_prefetch_keeps_that_much_credit_ahead_so_deliveries_flow_while_it_acks(server):
    produce(server.receive, 100)
    with client.BatchConsumer(server.config.consume_dsn, prefetch=20) as consumer:
        batch = consumer.receive(10, timeout_s=5)
        assert 0 < len(batch) <= 10
        # (10 asked for and 20 granted ahead: the server takes 30 for it, not one more)
        assert wait_until(lambda: server.stats()["queues"]["default"]["inflight"] == 30)
        assert consumer.ack([key for key, _ in batch]).refused == []
        got = len(batch)
        while got < 100:
            batch = consumer.receive(10, timeout_s=5)
            assert batch and consumer.ack([key for key, _ in batch]).refused == []
            got += len(batch)
        assert server.stats()["queues"]["default"]["depth"] == 0
    with pytest.raises(ValueError):
        client.BatchConsumer(server.config.consume_dsn, prefetch=-1)


def test_the_monitor_lists_a_batched_consumer_among_its_queues_consumers_with_what_it_holds(server, sockets):
    from pzq.clients.admin import admin_request

    produce(server.receive, 5)
    sock = dealer(sockets, server)
    take(sock, 3)
    [row] = wait_until(lambda: admin_request(server.monitor, "QUEUE default")["consumers"])
    assert (row["protocol"], row["held"], row["address"]) == ("native batch", 3, "")
    assert admin_request(server.monitor, "QUEUE default")["consumers_total"] == 1
