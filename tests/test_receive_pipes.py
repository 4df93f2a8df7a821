"""Receiving pipes by bytes, not by the largest message (issue 39 item 2).

libzmq bounds a receiving pipe in messages (RCVHWM): pzq sizes it so that a pipe holds about
Limits.pipe_in_bytes (128 MiB; 64 before) of the largest message a producer may store. With the largest
message 16 MiB (the old default) a producer's pipe was 4 messages deep, and a 100-byte message paid for it
(legacy producers at half the rate of db15207). The default is 1 MiB now (NATS's and Kafka's): 127 deep. A message
over the limit, up to the old default, is still read to be answered with its protocol's "too large"
(libzmq cuts a peer off past its MAXMSGSIZE without a word), and is answered at once, never held.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import zmq
from unanswered import counting_unanswered

from pzq.clients import native as client
from pzq.clients.api import ApiClient, ApiError
from pzq.protocols import emqp
from pzq.protocols import native as wire

from conftest import free_tcp_endpoint, wait_until

MiB = 1 << 20
PRODUCERS, EACH, WINDOW = 64, 300, 100


def _rss_anon_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def _dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # (the window bounds what it sends: nothing waits in its own pipe)
    sock.connect(endpoint)
    return sock


def test_sixty_four_producers_of_100_byte_messages_at_once_are_all_stored_and_the_server_holds_little(
    process_server,
):
    # Each pipelines a window of 100 through its own connection, all at the same time; the server is a
    # real `pzq serve`. Every message is acked, every producer moves meanwhile (none waits for the others
    # to finish), nothing is counted near the memory bound and the server's anonymous memory hardly grows.
    receive, _ = free_tcp_endpoint()
    srv = process_server("--receive-dsn", receive)
    base_kib = _rss_anon_kib(srv.proc.pid)
    ctx = zmq.Context()
    socks = [_dealer(ctx, receive) for _ in range(PRODUCERS)]
    try:
        poller = zmq.Poller()
        for sock in socks:
            poller.register(sock, zmq.POLLIN)
        sent, acked = [0] * PRODUCERS, [0] * PRODUCERS
        body = os.urandom(100)
        index = {sock: i for i, sock in enumerate(socks)}

        def top_up(i: int) -> None:
            while sent[i] < EACH and sent[i] - acked[i] < WINDOW:
                socks[i].send_multipart(wire.produce(b"%d-%d" % (i, sent[i]), [body]))
                sent[i] += 1

        for i in range(PRODUCERS):
            top_up(i)
        peak_kib, slowest_at_half, deadline = base_kib, None, time.monotonic() + 120
        while sum(acked) < PRODUCERS * EACH:
            assert time.monotonic() < deadline, f"{sum(acked)} of {PRODUCERS * EACH} acked"
            for sock, _ in poller.poll(1000):
                i = index[sock]
                while sock.poll(0):
                    ack = wire.parse_produce_ack(sock.recv_multipart())
                    assert ack is not None and ack.ok, ack
                    acked[i] += 1
                top_up(i)
            peak_kib = max(peak_kib, _rss_anon_kib(srv.proc.pid))
            if slowest_at_half is None and sum(acked) >= PRODUCERS * EACH // 2:
                slowest_at_half = min(acked)
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()
    stats = srv.stats()
    assert stats["messages"] == PRODUCERS * EACH
    assert slowest_at_half is not None and slowest_at_half >= WINDOW // 2, "every producer moved meanwhile"
    memory = stats["memory"]
    assert memory["alarms_total"] == 0 and memory["counted_peak_bytes"] < 8 * MiB, memory
    # 64 pipes of up to 100 messages of 100 bytes: well under a MiB; the rest is the loop's own
    assert peak_kib - base_kib < 64 * 1024, f"RssAnon {base_kib} KiB at start, {peak_kib} KiB at most"


def test_a_producers_pipe_is_sized_by_the_largest_message_it_may_store(make_server):
    for size, depth in ((1 * MiB, 127), (16 * MiB, 7), (16 << 10, 1000)):
        srv = make_server(max_message_size=size)
        native = next(e for e in srv.server.endpoints if e.name == "native")
        assert native.receive.getsockopt(zmq.RCVHWM) == depth == native.depth, size
        # (read up to the old default however small the limit: a bigger message is answered, not cut off)
        assert native.receive.getsockopt(zmq.MAXMSGSIZE) >= max(size, 16 * MiB), size
        srv.stop()


def test_a_message_over_the_limit_is_answered_too_large_and_its_producer_goes_on(server):
    # 1 MiB by default: a client that sent 4 MiB before the upgrade is told so, its connection kept
    with client.Producer(server.receive) as producer:
        refused = producer.produce([os.urandom(4 * MiB)])
        assert not refused.ok and "too large" in refused.error.lower() and "1048576" in refused.error
        assert producer.produce([b"small"]).ok
        at_limit = producer.produce([os.urandom(MiB)])  # (the limit itself is accepted)
        assert at_limit.ok, at_limit.error
    assert server.stats()["messages"] == 2


def test_a_pipeline_of_messages_over_the_limit_is_answered_at_once_and_never_held(server):
    # Each is read to be answered: none waits for a turn of its own as a big message would, none is
    # held (counted in native_held), and another producer's message goes through meanwhile
    native = next(e for e in server.server.endpoints if e.name == "native")
    big = os.urandom(15 * MiB)
    with client.Producer(server.receive) as rogue, client.Producer(server.receive) as honest:
        for i in range(12):
            rogue.sock.send_multipart(wire.produce(b"big-%d" % i, [big]))
        assert honest.produce([b"honest"]).ok
        answers = []
        while len(answers) < 12:
            assert rogue.sock.poll(10_000), f"{len(answers)} of 12 answered"
            answers.append(wire.parse_produce_ack(rogue.sock.recv_multipart()))
            assert native.memory()["native_held"] == 0
    assert all(a is not None and not a.ok and "too large" in a.error.lower() for a in answers), answers
    assert server.stats()["messages"] == 1


def test_one_setting_restores_the_old_limit_of_16_mib(make_server):
    srv = make_server(max_message_size=16 * MiB)
    with client.Producer(srv.receive, timeout_s=30) as producer:
        assert producer.produce([os.urandom(15 * MiB)]).ok
    assert srv.stats()["messages"] == 1


def test_an_api_message_over_the_limit_is_answered_too_large_not_cut_off(make_server):
    srv = make_server(api_dsn=free_tcp_endpoint()[0])
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        with pytest.raises(ApiError) as refused:
            api.produce([("big", os.urandom(4 * MiB))])
        # (past --max-message-size + 1 MiB the request's arguments are refused as a whole, before decoding)
        assert refused.value.code in ("too-large", "bad-arguments") and str(4 * MiB) in str(refused.value)
        api.produce([("small", b"after")])  # (the same connection goes on)
    assert srv.stats()["messages"] == 1


def test_an_emqp_request_over_the_limit_gets_an_error_reply_not_a_cut_connection(make_server, sockets):
    front = free_tcp_endpoint()[0]
    srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=free_tcp_endpoint()[0])
    client_sock = sockets(zmq.DEALER, front)
    client_sock.send_multipart(emqp.request("big-1", "default", "", "x" * (4 * MiB)))
    assert client_sock.poll(10_000), "answered"
    answer = client_sock.recv_multipart()
    assert answer[2] == b"REPLY" and answer[-1] == b"big-1"
    assert json.loads(answer[-2])["error"].startswith(f"request refused: a frame of {4 * MiB} bytes is over")
    client_sock.send_multipart(emqp.request("small-1", "default", "", "ok"))  # (the same connection goes on)
    assert client_sock.poll(10_000)
    assert client_sock.recv_multipart()[2] == b"ACK"
    assert srv.stats()["messages"] == 1


def test_a_pipelining_producer_of_mid_sized_messages_gets_turns_of_2_mib_not_one_a_message(make_server):
    # With a deep pipe (127), each message that passed what a turn had left was held for a turn of its own
    # and the window read behind it held too: 60 x 256 KiB took a turn each, 12 MiB held, and the memory
    # alarm (8 MiB here) refused the rest. Now such a message waits for the next turn, and what waits
    # behind a held message is at most a turn's bytes.
    srv = make_server(memory_high_water=8 * MiB, memory_low_water=6 * MiB)
    turns = srv.server.turns
    with client.Producer(srv.receive) as producer:
        results = producer.produce_many([[os.urandom(256 << 10)]] * 60)
    assert all(r.ok for r in results), {r.error for r in results}
    assert srv.server.turns - turns < 40, "about 2 MiB a turn (8 messages), not one message a turn"
    memory = srv.stats()["memory"]
    assert memory["alarms_total"] == 0 and memory["counted_peak_bytes"] <= 2 * MiB + (256 << 10) + 4096, memory


def test_while_a_big_message_is_written_over_turns_other_producers_are_read_though_its_own_pile_up(tmp_path):
    # What waits behind a big message of its producer does not stop the reading (only what waits for
    # the next turn alone does): another producer's message is stored before the big one's last part
    from test_turn_budget import _producer, _turn_by_turn

    server, receive = _turn_by_turn(tmp_path, turn_write_bytes=1 << 20, body_chunk_bytes=256 << 10)
    big, small = _producer(receive), _producer(receive)
    try:
        big.send_multipart([b"big", b"", os.urandom(6 << 20)])  # (six turns of its own at least)
        for i in range(20):  # (4 MiB behind it: more than a turn's bytes)
            big.send_multipart([b"after-%d" % i, b"", os.urandom(200 << 10)])
        server._turn(0)
        small.send_multipart([b"honest", b"", b"x"])
        order = []
        for _ in range(60):
            server._turn(0)
            for sock in (small, big):
                while sock.poll(0):
                    order.append(wire.parse_produce_ack(sock.recv_multipart()))
            if len(order) == 22:
                break
        ids = [a.message_id for a in order if a is not None and a.ok]
        assert ids.index(b"honest") < ids.index(b"big"), ids
        assert [i for i in ids if i.startswith(b"after")] == [b"after-%d" % i for i in range(20)]
    finally:
        big.close(0)
        small.close(0)
        server.close()


def test_a_producer_that_reads_none_of_its_acks_parks_about_2_mib_of_them_then_its_messages_go_unstored(server):
    # (its acks echo its message ids, 1 KiB at most: with 10,000 unread in its pipe it parked 10 MiB in
    # libzmq that nothing counted, 30 such producers 326 MiB. Over ipc:// the kernel holds ~200 KiB more)
    ctx = zmq.Context.instance()
    deaf = ctx.socket(zmq.DEALER)
    deaf.setsockopt(zmq.LINGER, 0)
    deaf.setsockopt(zmq.SNDHWM, 0)
    deaf.setsockopt(zmq.RCVHWM, 1)
    deaf.connect(server.receive)
    try:
        native = next(e for e in server.server.endpoints if e.name == "native")
        unanswered = counting_unanswered(native)
        for i in range(8_000):
            deaf.send_multipart([b"%06d" % i + b"i" * (wire.MAX_ID - 6), b"", b"d"])
        depth = lambda: server.stats()["queues"]["default"]["depth"]  # noqa: E731
        wait_until(lambda: depth() + len(unanswered) == 8_000, timeout_s=30)  # (each stored or discarded)
        stored = depth()
        assert 2_000 <= stored <= 4_000, f"{stored} stored: ~2 MiB of acks of 1 KiB ids, a turn's and the kernel's"
        for answered in range(stored):
            assert deaf.poll(10_000), f"{answered} of {stored} acked"
            assert deaf.recv_multipart()[1] == b"1"
        assert not deaf.poll(0), "every message stored is acked once its producer reads, once"
        deaf.send_multipart([b"after", b"", b"d"])
        assert deaf.poll(5000) and deaf.recv_multipart()[:2] == [b"after", b"1"], "and it is served again"
    finally:
        deaf.close(0)
