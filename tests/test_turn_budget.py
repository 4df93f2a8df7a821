"""One turn budget (issue 26, item 1 and 2): the loop's work outside the commit stops between requests
once the turn's clock or bytes are spent, the rest goes first next turn (round-robin), and a message
bigger than what a turn may still let in waits for a turn of its own. Budgets of zero make every turn
serve one request, so these tests see the order of turns, never the clock."""

from __future__ import annotations

import dataclasses
import itertools
import json
import socket

import zmq

from pzq.broker import Broker
from pzq.clients import native as client
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS
from pzq.endpoints.base import Sockets, TurnBudget
from pzq.endpoints.stream import StreamEndpoint
from pzq.gateways.phpmq import PhpmqGateway
from pzq.protocols import native as wire
from pzq.protocols import phpmq
from pzq.server import Server

from conftest import free_tcp_endpoint, make_config, wait_until

ZERO = dataclasses.replace(DEFAULT_LIMITS, turn_budget_s=0.0)


def _producer(endpoint: str, **options: int) -> zmq.Socket:
    """A raw producer's DEALER, closed at linger 0, connected to ``endpoint``."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for name, value in options.items():
        sock.setsockopt(getattr(zmq, name), value)
    sock.connect(endpoint)
    return sock


def flooding(srv, n: int) -> zmq.Socket:
    """A producer that has sent ``n`` messages at once, once the server has begun to read them."""
    flood = _producer(srv.receive)
    for i in range(n):
        flood.send_multipart(wire.produce(b"%d" % i, [b"flood"]))
    assert flood.poll(5000), "the flood is being read"
    return flood


_inproc = itertools.count()


def test_a_budget_serves_the_first_request_of_a_turn_whatever_it_is_and_stops_after():
    budget = TurnBudget.start(0.0, 100)
    assert not budget.spent(), "nothing served yet: the first request always goes through"
    budget.take(10)
    assert budget.spent(), "the clock is over"
    roomy = TurnBudget.start(3600.0, 100)
    roomy.take(60)
    assert not roomy.spent() and roomy.left() > 0
    roomy.take(60)
    assert roomy.spent() and roomy.let_in == 120, "the turn's bytes are over"


def test_a_server_with_a_zero_turn_budget_stores_and_delivers_everything_once_and_in_order(make_server):
    srv = make_server(limits=ZERO, ack_timeout=30.0, hard_sync=False)  # (turns, not durability: no fsync a turn)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([[b"m%d" % i] for i in range(300)], window=50))
    turns = srv.server.turns
    assert turns >= 300, f"one request a turn at most: 300 produced in {turns} turns"
    got = []
    with client.Consumer(srv.send) as consumer:
        for _ in range(300):
            delivery = consumer.receive(timeout_s=5)
            assert delivery is not None, f"only {len(got)} of 300 delivered"
            got.append(delivery.body[0])
            consumer.ack(delivery)
        assert consumer.receive(timeout_s=0.2) is None, "nothing is delivered twice"
    assert got == [b"m%d" % i for i in range(300)]
    # (acks get no answer: the last ones may still wait their turns when the consumer is done)
    stats = wait_until(lambda: (s := client.stats(srv.monitor))["acked_total"] == 300 and s, timeout_s=30)
    assert stats["produced_total"] == 300


def test_a_flood_of_one_producer_under_a_zero_budget_leaves_the_monitor_served_within_a_few_turns(tmp_path):
    # (turn by turn: counted over a threaded server, the turns also counted the monitor client's connect,
    # which a busy machine stretched past 40 of the flood's turns)
    server, receive = _turn_by_turn(tmp_path, turn_budget_s=0.0)
    flood, monitor = _producer(receive, SNDHWM=0), _producer(server.config.monitor_dsn)
    try:
        for i in range(3000):
            flood.send_multipart(wire.produce(b"%d" % i, [b"flood"]))
        server._turn(0)  # (the flood is being read)
        monitor.send_multipart([b"", b"STATS"])
        turns = 0
        while not monitor.poll(0):
            turns += 1
            assert turns <= 40, "the monitor waited more than 40 turns"
            server._turn(0)
        # Without the round-robin, the producer's read (the first task) would spend every turn's
        # budget and the monitor would wait for the whole flood: one message a turn, 3000 turns.
        stats = json.loads(monitor.recv_multipart()[-1])
        assert 0 < stats["produced_total"] < 3000, f"answered after {turns} turns, not before the flood was read"
    finally:
        flood.close(0)
        monitor.close(0)
        server.close()


def test_a_consumer_is_given_a_delivery_within_a_few_turns_beside_a_producer_flood(make_server):
    srv = make_server(limits=ZERO, ack_timeout=30.0, hard_sync=False)  # (turns, not durability: no fsync a turn)
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"first"]).ok
    flood = flooding(srv, 3000)
    try:
        with client.Consumer(srv.send) as consumer:
            delivery = consumer.receive(timeout_s=5)
            assert delivery is not None and delivery.body == [b"first"]
            consumer.ack(delivery)
        assert client.stats(srv.monitor)["produced_total"] < 3001, "delivered while the flood was still read"
    finally:
        flood.close(0)


def _turn_by_turn(tmp_path, **limits) -> tuple[Server, str]:
    """A started server whose turns the test runs itself (``_turn``), on inproc endpoints: a message sent
    on inproc is in the server's pipe when send returns, so the order of turns is the test's."""
    n = next(_inproc)
    receive = f"inproc://budget-receive-{n}"
    cfg = make_config(
        tmp_path,
        receive_dsn=receive,
        send_dsn=f"inproc://budget-send-{n}",
        monitor_dsn=f"inproc://budget-monitor-{n}",
        limits=dataclasses.replace(DEFAULT_LIMITS, **limits),
        max_message_size=16 << 20,  # (big bodies: the default before 1 MiB)
    )
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    return server, receive


def _acks(sock: zmq.Socket) -> list[bytes]:
    """The message ids of every ack waiting on a producer's socket."""
    ids = []
    while sock.poll(0):
        ack = wire.parse_produce_ack(sock.recv_multipart())
        assert ack is not None and ack.ok
        ids.append(ack.message_id)
    return ids


def _turns_until_acked(server: Server, producer: zmq.Socket, count: int) -> tuple[list[bytes], list[int]]:
    """Turns until ``count`` acks came: the acks in order, and the messages each commit stored (acks
    of consecutive commits may leave together: docs/semantics.md, "One sync a commit")."""
    acked: list[bytes] = []
    commits: list[int] = []
    stored = server.stats()["messages"]
    for _ in range(30):
        server._turn(0)
        if (now := server.stats()["messages"]) != stored:
            commits.append(now - stored)
            stored = now
        acked += _acks(producer)
        if len(acked) == count:
            break
    return acked, commits


def test_a_small_producers_ack_waits_for_at_most_one_big_commit_of_another_producer(tmp_path):
    server, receive = _turn_by_turn(tmp_path, turn_write_bytes=1 << 20)
    big, small = _producer(receive), _producer(receive)
    try:
        body = b"x" * (1 << 20)
        for i in range(4):
            big.send_multipart(wire.produce(b"b%d" % i, [body]))
        small.send_multipart(wire.produce(b"s", [b"small"]))
        big_acked: list[bytes] = []
        for _ in range(30):
            server._turn(0)
            big_acked += _acks(big)
            if _acks(small) == [b"s"]:
                break
        else:
            raise AssertionError("the small producer was never acked")
        # Each turn lets in at most one big message, and none after a small one: the small message is
        # committed either alone or behind the one big message read before it. Without the byte budget,
        # all five would share one commit (4 MiB is within one socket's 8 MiB share).
        assert len(big_acked) <= 1, f"the small ack came after {len(big_acked)} big commits"
        for _ in range(30):
            server._turn(0)
            big_acked += _acks(big)
            if len(big_acked) == 4:
                break
        assert sorted(big_acked) == [b"b0", b"b1", b"b2", b"b3"], "every big message stored, each once"
        assert server.stats()["messages"] == 5
    finally:
        big.close(0)
        small.close(0)
        server.close()


def test_a_message_bigger_than_a_turns_bytes_is_committed_in_a_turn_of_its_own(tmp_path):
    server, receive = _turn_by_turn(tmp_path, turn_write_bytes=1000)
    producer = _producer(receive)
    try:
        producer.send_multipart(wire.produce(b"a", [b"small"]))
        producer.send_multipart(wire.produce(b"b", [b"y" * 5000]))
        producer.send_multipart(wire.produce(b"c", [b"small"]))
        acked, commits = _turns_until_acked(server, producer, 3)
        assert acked == [b"a", b"b", b"c"]
        assert commits == [1, 1, 1], "in order, the big one alone"
    finally:
        producer.close(0)
        server.close()


def test_a_small_message_read_after_a_big_one_first_in_a_turn_is_committed_before_it(tmp_path):
    # A hostile producer's big message may come first out of the ROUTER's fair queue: it is held for a turn
    # of its own and the small message behind it (another producer's) is committed first, not after it.
    server, receive = _turn_by_turn(tmp_path, turn_write_bytes=1 << 20)
    big, small = _producer(receive, SNDHWM=0), _producer(receive, SNDHWM=0)
    try:
        body = b"x" * ((1 << 20) + 1)
        for i in range(6):  # pipelined: more than the turns may hold (HELD_BIG), waiting in the pipe
            big.send_multipart(wire.produce(b"b%d" % i, [body]))
        small.send_multipart(wire.produce(b"s0", [b"small"]))
        per_turn, sent = [], 0
        for _ in range(40):
            server._turn(0)
            acked = _acks(big) + _acks(small)
            per_turn.append(acked)
            if any(a.startswith(b"s") for a in acked) and sent < 4:
                sent += 1  # the honest producer sends its next one when its last is acked (window 1)
                small.send_multipart(wire.produce(b"s%d" % sent, [b"small"]))
            if sum(map(len, per_turn)) == 11:
                break
        flat = [a for acked in per_turn for a in acked]
        assert sorted(flat) == sorted([b"b%d" % i for i in range(6)] + [b"s%d" % i for i in range(5)])
        assert flat[0] == b"s0", f"the small message was committed after a big one: {per_turn}"
        assert all(len([a for a in acked if a.startswith(b"b")]) <= 1 for acked in per_turn), "one big a turn"
        # Each small message, sent after the last was acked, waits for at most one big commit
        waits, bigs = [], 0
        for acked in per_turn:
            bigs += sum(1 for a in acked if a.startswith(b"b"))
            if any(a.startswith(b"s") for a in acked):
                waits.append(bigs)
                bigs = 0
        assert max(waits) <= 1, f"big commits before each small ack: {waits}"
        assert [a for a in flat if a.startswith(b"b")] == [b"b%d" % i for i in range(6)], "in order"
    finally:
        big.close(0)
        small.close(0)
        server.close()


def test_a_producers_messages_after_its_held_big_one_keep_their_order_behind_it(tmp_path):
    server, receive = _turn_by_turn(tmp_path, turn_write_bytes=1000)
    producer = _producer(receive)
    try:
        for mid, body in ((b"a", b"y" * 5000), (b"b", b"small"), (b"c", b"y" * 5000), (b"d", b"small")):
            producer.send_multipart(wire.produce(mid, [body]))
        acked, commits = _turns_until_acked(server, producer, 4)
        assert acked == [b"a", b"b", b"c", b"d"]
        stored_after = set(itertools.accumulate(commits))  # (stored in order: a, b, c, d)
        assert {1, 2, 3} <= stored_after, f"each big one alone: messages a commit {commits}"
    finally:
        producer.close(0)
        server.close()


def test_a_read_of_many_tiny_phpmq_sends_draws_each_message_on_the_turns_records(store, tmp_path):
    dsn, addr = free_tcp_endpoint()
    ctx = zmq.Context()
    binder = Sockets(ctx)
    try:
        gateway = PhpmqGateway(Broker(store, ack_timeout_s=5.0), max_content=1 << 20)
        endpoint = StreamEndpoint("phpmq", dsn, gateway, make_config(tmp_path, phpmq_dsn=dsn), binder)
        send = [(phpmq.QUEUE, b"q"), (phpmq.CONTENT, b"tiny")]
        poller = zmq.Poller()
        poller.register(endpoint.sock, zmq.POLLIN)
        taken = 0

        def read() -> bool:
            nonlocal taken
            endpoint.budget = budget = TurnBudget(float("inf"), 1 << 40, 1 << 40)
            endpoint.read(dict(poller.poll(100)), Now(0.0, 0))
            taken += (1 << 40) - budget.records_left
            return gateway.received_total == 300

        with socket.create_connection(addr, timeout=5) as raw:
            raw.sendall(phpmq.encode(phpmq.SEND, send) * 300)  # (a STREAM read of 8 KiB holds over a hundred)
            assert wait_until(read, timeout_s=10)
        assert taken >= 300, f"{taken} records drawn for 300 messages"
    finally:
        binder.close()
        ctx.term()
