"""The legacy send socket's pool of delivery bytes (pzq/gateways/native_pool.py, issue 39): one share for
every consumer behind the DEALER, and stale copies released once the connections that may hold them have
shown they moved past them (or closed). First the rules on a real broker and store, the connections'
streams given as their sockets would tell them; then real sockets against a server in a thread: a consumer
that reads nothing beside one that reads, a consumer that reads and never acks, and ipc://, where nothing
can be watched.
"""

from __future__ import annotations

import time

import zmq

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.gateways.native import SEND, NativeGateway
from pzq.gateways.native_pool import IDLE_AFTER_S, OVERHEAD, Sample
from pzq.protocols import native
from pzq.store import Store

from conftest import free_tcp_endpoint, wait_until

T0 = 1_700_000_000_000_000
KB = b"x" * 1000
POOL = 10_500  # bytes: ten deliveries of KB and a part of the eleventh


def make(store: Store, **limits) -> NativeGateway:
    values = {"native_send_pool": POOL, "native_send_check_s": 1.0, **limits}
    broker = Broker(store, ack_timeout_s=2.0, limits=Limits(**values))
    store.queue("q")
    return NativeGateway(
        broker, queue="q", max_message_size=1 << 20, max_inflight=1000, ack_timeout_s=2.0, limits=Limits(**values)
    )


def fill(gateway: NativeGateway, n: int) -> None:
    for _ in range(n):
        gateway.broker.produce("q", [KB], now_us=T0)
    gateway.broker.store.commit()


def dispatch(gateway: NativeGateway, now: float) -> list:
    return gateway.dispatch(now=Now(now, T0))


def acked(gateway: NativeGateway, sends: list, now: float) -> None:
    answers = [native.consumer_ack(send.frames[0], True) for send in sends]
    gateway.received_many(SEND, answers, now=Now(now, T0))


def charged(gateway: NativeGateway) -> int:
    return gateway.pool.charged()


def test_the_send_socket_hands_out_its_pool_and_one_message_more_then_nothing_until_an_ack(store):
    gateway = make(store)
    fill(gateway, 30)
    first = dispatch(gateway, 0.0)
    assert len(first) == 11 and charged(gateway) == 11_000, "ten fill the pool, the eleventh is the one more"
    assert dispatch(gateway, 0.0) == [] and not gateway.would_send(0.0)
    acked(gateway, first[:2], 0.01)
    assert gateway.would_send(0.01)
    assert len(dispatch(gateway, 0.01)) == 2, "1,500 bytes of room: one, and the one more"


def test_a_timed_out_copy_stays_charged_until_the_connections_move_past_it(store):
    gateway = make(store)
    fill(gateway, 30)
    held = dispatch(gateway, 0.0)
    gateway.broker.expire(2.5)  # (every delivery timed out: each may still sit in a pipe that is not read)
    assert charged(gateway) == 11_000 and dispatch(gateway, 2.5) == []
    pool = gateway.pool
    # A connection that is idle, one that has got far, one that has not: the epoch waits for the third
    streams = {5: Sample(1_000, 0, 2.5), 6: Sample(50_000, 70_000, 2.5), 7: Sample(9_000, 4_000, 2.5)}
    assert pool.look_due(2.5)
    pool.look(2.5, streams, closable=True)
    assert len(pool.closed) == 1 and charged(gateway) == 11_000, "closed at a checkpoint, not passed"
    pipe = pool.pipe_messages * (1000 + OVERHEAD)
    later = 2.5 + IDLE_AFTER_S
    moved = {5: Sample(1_000, 0, later), 6: Sample(50_000 + 70_000 + pipe, 10, later), 7: Sample(9_500, 3_500, later)}
    pool.look(later, moved, closable=True)
    assert charged(gateway) == 11_000, "the third connection may still hold a copy in its pipe"
    pool.look(later + 1, {**moved, 7: Sample(9_500, 0, later + 1)}, closable=True)
    assert charged(gateway) == 0, "every connection moved past the checkpoint: the copies are gone"
    assert len(dispatch(gateway, later + 1)) == 11
    assert held  # (the first copies were never answered: at-least-once, they are delivered again)


def test_a_closed_connection_or_one_that_took_its_descriptor_passes_the_epoch(store):
    gateway = make(store)
    fill(gateway, 30)
    dispatch(gateway, 0.0)
    gateway.broker.expire(2.5)
    pool = gateway.pool
    pool.look(2.5, {5: Sample(1_000, 500, 2.5), 6: Sample(80_000, 500, 2.5)}, closable=True)
    pool.look(3.0, {6: Sample(10, 500, 3.0)}, closable=True)  # (5 closed; 6 is another connection now)
    assert charged(gateway) == 0


def test_an_epoch_passes_only_once_none_of_its_deliveries_is_in_flight(store):
    gateway = make(store)
    fill(gateway, 30)
    first = dispatch(gateway, 0.0)
    acked(gateway, first[:1], 0.01)
    gateway.broker.take_back_many([first[1].token], by="native")  # (one copy taken back: stale)
    pool = gateway.pool
    pool.look(0.1, {}, closable=True)
    assert len(pool.closed) == 1
    pool.look(1.5, {}, closable=True)
    assert charged(gateway) == 9_000 + 1_000, "the others are still in flight (a later timeout would be stale again)"
    acked(gateway, first[2:], 1.6)
    pool.look(1.7, {}, closable=True)
    assert charged(gateway) == 0 and pool.passed_total == 1


def test_without_watched_connections_an_epoch_passes_an_ack_timeout_after_its_checkpoint(store):
    gateway = make(store)
    fill(gateway, 30)
    dispatch(gateway, 0.0)
    gateway.broker.expire(2.5)
    pool = gateway.pool
    pool.look(2.5, None, closable=True)
    pool.look(4.0, None, closable=True)
    assert charged(gateway) == 11_000
    pool.look(4.6, None, closable=True)
    assert charged(gateway) == 0


def test_no_epoch_is_closed_while_deliveries_wait_for_the_socket(store):
    gateway = make(store)
    fill(gateway, 30)
    dispatch(gateway, 0.0)
    gateway.broker.expire(2.5)
    gateway.pool.look(2.5, {}, closable=False)
    assert gateway.pool.closed == [], "a delivery not yet handed to libzmq would be sent after the checkpoint"


def test_a_lone_prompt_consumer_never_makes_the_pool_watch_anything(store):
    gateway = make(store)
    fill(gateway, 100)
    now = 0.0
    for _ in range(10):
        acked(gateway, dispatch(gateway, now), now + 0.001)
        now += 0.5
        assert not gateway.pool.look_due(now)


def test_the_send_sockets_pipe_holds_half_the_pool_of_the_largest_message_but_never_fewer_than_the_floor():
    limits = DEFAULT_LIMITS
    assert limits.send_pipe_messages(16 << 20) == limits.native_send_pipe_floor == 16
    assert limits.send_pipe_messages(64 << 10) == 512
    assert limits.send_pipe_messages(100) == 1000
    for size in (1 << 20, 64 << 10):  # (messages up to ~1.9 MiB: a pipe that is not read holds under half)
        assert (limits.send_pipe_messages(size) + 1) * size <= limits.native_send_pool // 2 + 2 * size


# -- real sockets ---------------------------------------------------------------------------------------


def consumer(endpoint: str, **options) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.linger = 0
    for name, value in options.items():
        setattr(sock, name, value)
    sock.connect(endpoint)
    return sock


def produce(srv, count: int, body: bytes) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(srv.receive)
    try:
        for i in range(count):
            sock.send_multipart([b"%d" % i, b"", body])
        for _ in range(count):
            assert sock.poll(10_000), "every message is acked"
            assert sock.recv_multipart()[1] == b"1"
    finally:
        sock.close(0)


def read_and_ack(sock: zmq.Socket, *, ack: bool = True) -> int:
    got = 0
    while sock.poll(0):
        frames = sock.recv_multipart()
        got += 1
        if ack:
            sock.send_multipart([frames[0], frames[1], b"1"])
    return got


def native_figures(srv) -> dict:
    return srv.stats()["native"]


BODY = b"b" * (64 << 10)
SMALL_POOL = Limits(
    native_send_pool=1 << 20, native_send_pipe_floor=4, native_send_stall_s=0.6, native_send_check_s=0.1
)


def depth(srv) -> int:
    return srv.stats()["queues"][srv.config.queue]["depth"]


def test_a_consumer_that_reads_nothing_holds_its_pipe_the_reader_gets_the_rest_and_the_deaf_one_is_cut(make_server):
    srv = make_server(send_dsn=free_tcp_endpoint()[0], ack_timeout=0.2, max_message_size=65536, limits=SMALL_POOL)
    deaf = consumer(srv.send, rcvhwm=1, rcvbuf=4096)
    reader = consumer(srv.send)
    try:
        wait_until(lambda: srv.stats()["connections"]["open"] >= 2)
        produce(srv, 200, BODY)
        most, deadline = 0, time.monotonic() + 20
        while depth(srv) and time.monotonic() < deadline:
            reader.poll(50)
            read_and_ack(reader)
            most = max(most, native_figures(srv)["send_pool_bytes"])
        assert depth(srv) == 0, "the reader is handed every message, those the deaf one held after their timeout"
        assert most <= (1 << 20) + len(BODY) + 4096, "the pool's bytes and one message, at most"
        wait_until(lambda: native_figures(srv)["send_stalled_cut_total"] >= 1, timeout_s=10)
        wait_until(lambda: native_figures(srv)["send_pool_bytes"] == 0, timeout_s=10)
    finally:
        deaf.close(0)
        reader.close(0)


def test_a_consumer_that_reads_and_never_acks_does_not_take_the_pool_for_good(make_server):
    srv = make_server(send_dsn=free_tcp_endpoint()[0], ack_timeout=0.1, max_message_size=65536, limits=SMALL_POOL)
    hoarder = consumer(srv.send)
    try:
        wait_until(lambda: srv.stats()["connections"]["open"] >= 1)
        produce(srv, 60, BODY)
        wait_until(lambda: read_and_ack(hoarder, ack=False) == 0 and native_figures(srv)["send_pool_bytes"] > 0)
        reader = consumer(srv.send)
        try:
            deadline = time.monotonic() + 20
            while depth(srv) and time.monotonic() < deadline:
                reader.poll(50)
                read_and_ack(reader)
                read_and_ack(hoarder, ack=False)
            assert depth(srv) == 0, "what the hoarder read and never acked is released as it reads, and redelivered"
            assert native_figures(srv)["send_stalled_cut_total"] == 0, "a consumer that reads is never cut"
        finally:
            reader.close(0)
    finally:
        hoarder.close(0)


def test_over_ipc_a_consumer_that_never_acks_is_released_by_time(make_server):
    srv = make_server(ack_timeout=0.1, max_message_size=65536, limits=SMALL_POOL)  # (ipc: no socket monitor)
    hoarder = consumer(srv.send)
    reader = None
    try:
        produce(srv, 40, BODY)
        wait_until(lambda: read_and_ack(hoarder, ack=False) == 0 and native_figures(srv)["send_pool_bytes"] > 0)
        reader = consumer(srv.send)
        deadline = time.monotonic() + 20
        while depth(srv) and time.monotonic() < deadline:
            reader.poll(50)
            read_and_ack(reader)
            read_and_ack(hoarder, ack=False)
        assert depth(srv) == 0
    finally:
        hoarder.close(0)
        if reader is not None:
            reader.close(0)


def test_a_consumer_answer_past_its_bound_cuts_that_consumer_off_unread_and_the_others_are_served(make_server):
    from pzq.endpoints.native import ANSWER_FRAME

    srv = make_server(send_dsn=free_tcp_endpoint()[0])
    reader = consumer(srv.send)
    # (libzmq holds a frame whole before pzq sees it: with no bound a 500 MB "ack" cost the server 848 MiB)
    hostile = zmq.Context.instance().socket(zmq.DEALER)
    hostile.linger = 0
    mon = hostile.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        hostile.connect(srv.send)
        hostile.send_multipart([b"0000000000000001|" + b"0" * 32, b"1" * (ANSWER_FRAME + 1)])
        assert mon.poll(5000), "the connection of a consumer sending a frame past the bound is ended"
        produce(srv, 1, b"after")
        assert reader.poll(5000) and reader.recv_multipart()[-1] == b"after"
    finally:
        hostile.disable_monitor()
        mon.close(0)
        hostile.close(0)
        reader.close(0)
