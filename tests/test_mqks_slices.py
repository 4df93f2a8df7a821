"""MQKS requests whose work grows with the data, cut into slices that fit the turn (issue 39): a publish
to many queues, a big publish, a change of thousands of events, and the notices of a queue with many
consumers; each answered after its last slice, the connection's later lines after it, other connections
served between, and what a connection is sent charged to it until its peer has it."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

from pzq.broker import Broker
from pzq.clients.mqks import MqksClient
from pzq.clock import Now
from pzq.config import DEFAULT_LIMITS, Limits
from pzq.endpoints.base import TurnBudget
from pzq.endpoints.unread import Unread
from pzq.gateways.contract import Send
from pzq.gateways.mqks import MqksGateway
from pzq.store import Store
from pzq.store.bindings import Bindings

from conftest import free_tcp_endpoint

KIB = 1 << 10


def gateway_on(store: Store, **changes) -> MqksGateway:
    limits = dataclasses.replace(DEFAULT_LIMITS, **changes)
    broker = Broker(store, ack_timeout_s=60, limits=limits)
    return MqksGateway(
        broker,
        Bindings(store),
        max_line=1 << 22,
        window=100,
        drop_queue=broker.drop_queue,
        error_id=lambda: "E",
        limits=limits,
    )


def turn(gateway: MqksGateway, limits: Limits, *, fail: bool = False) -> list[Send]:
    """One server turn of the gateway: serve within the turn's budget, dispatch, commit (or roll back),
    flush (charging what leaves to its connection, as the endpoint does)."""
    budget = TurnBudget(time.monotonic() + 3600, limits.turn_write_bytes, limits.turn_records)
    now = Now.read()  # (one a turn, as the server's loop reads it)
    out = gateway.serve(now=now, budget=budget)
    out += gateway.dispatch(now=now)
    store = gateway.broker.store
    if fail:
        store.abort()
        gateway.broker.rolled_back()
        gateway.recover()
        out = gateway.rolled_back(out)
    else:
        store.commit()
    for conn in {send.peer for send in out}:
        gateway.piped(conn, [send for send in out if send.peer == conn], 0)
    gateway.flushed()
    return out


def lines_to(out: list[Send], conn: bytes) -> list[bytes]:
    return [line for send in out if send.peer == conn for line in send.frames[1].splitlines()]


def stored(gateway: MqksGateway, prefix: str) -> int:
    return sum(info.count for info in gateway.broker.store.queues() if info.name.startswith(prefix))


def test_a_fanout_past_the_turn_is_written_a_slice_a_turn_and_answered_after_its_last(store):
    limits = dataclasses.replace(DEFAULT_LIMITS, turn_write_bytes=64 * KIB)
    gateway = gateway_on(store, turn_write_bytes=64 * KIB)
    for conn in (b"a", b"b"):
        gateway.connected(conn)
    gateway.keep(b"a", b"".join(b"r%d rebind --confirm fan%d ev\n" % (i, i) for i in range(10)))
    turn(gateway, limits)
    data = b"d" * (32 * KIB)
    gateway.keep(b"a", b"p1 publish --confirm ev " + data + b"\nafter ping after\n")
    gateway.keep(b"b", b"other ping other\n")
    answers: list[bytes] = []
    counts = []
    for _ in range(20):
        out = turn(gateway, limits)
        assert b"other ok other" in lines_to(out, b"b") or counts, "another connection is served in the first turn"
        answers += lines_to(out, b"a")
        counts.append(stored(gateway, "fan"))
        if b"after ok after" in answers:
            break
    assert answers == [b"p1 ok ", b"after ok after"], "confirmed once, after its copies, and the next line after it"
    assert counts[-1] == 10 and len(counts) >= 5, f"10 copies of 32 KiB over turns of 64 KiB: {counts}"
    assert all(b - a <= 3 for a, b in zip([0, *counts], counts, strict=False)), f"a turn's bytes a turn: {counts}"
    assert counts[counts.index(10) :] == [10] * len(counts[counts.index(10) :])
    message = gateway.broker.take("fan3", 1, "reader", now=Now(0.0, 1))[0]
    assert message.frames == [data] and message.meta == {"mqks": ["p1", "ev"]}


def test_a_big_publish_is_stored_in_parts_and_a_line_that_is_not_utf8_stores_nothing(store):
    limits = dataclasses.replace(DEFAULT_LIMITS, body_chunk_bytes=16 * KIB, turn_write_bytes=32 * KIB)
    gateway = gateway_on(store, body_chunk_bytes=16 * KIB, turn_write_bytes=32 * KIB)
    gateway.connected(b"a")
    gateway.keep(b"a", b"r1 rebind --confirm big ev\n")
    turn(gateway, limits)
    data = bytes(range(32, 127)) * 2000  # (190 KB: a line past 64 KiB, its data never decoded whole)
    gateway.keep(b"a", b"p1 publish --confirm ev " + data + b"\n")
    answers, turns = [], 0
    while not answers and turns < 40:
        answers += lines_to(turn(gateway, limits), b"a")
        turns += 1
        assert stored(gateway, "big") == (1 if answers else 0), "stored with its last part, not before"
    assert answers == [b"p1 ok "] and turns >= 190_000 // (32 * KIB)
    (message,) = gateway.broker.take("big", 1, "reader", now=Now(0.0, 1))
    assert message.frames == [data] and message.body is not None, "its body in chunks"
    bad = b"x" * 100_000 + "é".encode()[:1]  # (cut in the middle of a character, at the end)
    gateway.keep(b"a", b"p2 publish --confirm ev " + bad + b"\n")
    out = []
    for _ in range(10):
        out += lines_to(turn(gateway, limits), b"a")
    assert out == [b"p2 error E"] and stored(gateway, "big") == 1, "refused before any copy"


def test_a_fanout_goes_on_to_its_end_when_its_connection_closes_and_one_of_a_failed_turn_is_not_confirmed(store):
    limits = dataclasses.replace(DEFAULT_LIMITS, turn_write_bytes=64 * KIB)
    gateway = gateway_on(store, turn_write_bytes=64 * KIB)
    gateway.connected(b"a")
    gateway.keep(b"a", b"".join(b"r%d rebind --confirm fan%d ev\n" % (i, i) for i in range(10)))
    turn(gateway, limits)
    gateway.keep(b"a", b"p1 publish --confirm ev " + b"d" * (32 * KIB) + b"\n")
    turn(gateway, limits)
    gateway.disconnected(b"a")  # (it sent all of it: the rest is stored all the same)
    for _ in range(10):
        assert turn(gateway, limits) == []
    assert stored(gateway, "fan") == 10
    gateway.connected(b"b")
    gateway.keep(b"b", b"p2 publish --confirm ev " + b"e" * (32 * KIB) + b"\nafter ping x\n")
    first = turn(gateway, limits)
    assert lines_to(first, b"b") == []
    rolled = turn(gateway, limits, fail=True)
    assert lines_to(rolled, b"b") == [b"p2 error E"], "a rolled-back slice: an error, not a confirm"
    assert lines_to(turn(gateway, limits), b"b") == [b"after ok x"], "and its connection's next line goes on"


def test_notices_are_made_as_they_are_sent_once_per_consumer_within_its_connections_share(store):
    share = 64 * KIB
    limits = dataclasses.replace(DEFAULT_LIMITS, delivery_share=share)
    gateway = gateway_on(store, delivery_share=share)
    for conn in (b"many", b"adder"):
        gateway.connected(conn)
    events = b" ".join(b"event.%05d" % i for i in range(997))  # (12 KB a notice)
    gateway.keep(b"many", b"c0 consume --confirm q " + events + b"\n")
    gateway.keep(b"many", b"".join(b"c%d consume --confirm q\n" % i for i in range(1, 50)))
    turn(gateway, limits)
    assert len(gateway.consumers) == 50
    gateway.keep(b"adder", b"".join(b"x%d rebind --confirm q --add x%d\n" % (i, i) for i in range(3)))
    out = turn(gateway, limits)
    assert lines_to(out, b"adder") == [b"x0 ok ", b"x1 ok ", b"x2 ok "], "the changes are confirmed at once"
    made = lines_to(out, b"many")
    for _ in range(5):  # (its peer reads nothing: no room, nothing more is made)
        made += lines_to(turn(gateway, limits), b"many")
    assert 0 < sum(map(len, made)) <= share + 13 * KIB, "notices up to its share (and one), no more"
    assert gateway.broker.accounts.held(("mqks", b"many"), gateway.broker.inflight) >= sum(map(len, made))
    gateway.keep(b"many", b"pg ping last\n")
    for _ in range(60):  # its peer reads: what it was sent is acknowledged, the rest comes
        gateway.unpiped(b"many", share)
        made += lines_to(turn(gateway, limits), b"many")
    last: dict[bytes, bytes] = {}
    count: dict[bytes, int] = {}
    for line in made:
        if b" --update " in line:
            last[line.split(b" ")[0]] = line
            count[line.split(b" ")[0]] = count.get(line.split(b" ")[0], 0) + 1
    assert sorted(last) == sorted(b"c%d" % i for i in range(50)), "every consumer told"
    assert all(line.endswith(b" x0 x1 x2") for line in last.values()), "at last with the events as they are"
    assert max(count.values()) <= 3 and sum(count.values()) < 100, "one a change at most, most of them folded"
    assert made[-1] == b"pg ok last", "its line answered after the notices it was due before"


def _tcp_pair(rcvbuf: int) -> tuple[socket.socket, socket.socket]:
    """A loopback TCP connection: (our end, a peer whose receive buffer is ``rcvbuf``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # (before connecting: the window it offers)
    peer.connect(listener.getsockname())
    ours, _ = listener.accept()
    listener.close()
    return ours, peer


def test_bytes_sent_stay_charged_until_the_peers_tcp_acknowledged_them():
    ours, peer = _tcp_pair(4 * KIB)
    ours.setblocking(False)
    unread = Unread()
    unread.opened(b"c", ours.fileno())
    sent = 0
    try:
        while sent < 4 << 20:
            sent += ours.send(b"x" * (64 * KIB))
    except BlockingIOError:
        pass
    unread.sent(b"c", sent, charged=sent)
    back, over = unread.read_back(limit=sent // 2)
    held = unread.charged(b"c")
    assert held == sent and back == [] and over == [b"c"], "a peer that reads nothing acknowledged little"
    got = 0
    peer.settimeout(10)
    while got < sent:
        got += len(peer.recv(1 << 20))
    deadline = time.monotonic() + 10
    while unread.pending:
        back, over = unread.read_back(limit=sent)
        assert time.monotonic() < deadline, "its acknowledgement never came"
    assert unread.charged(b"c") == 0
    ours.close()
    peer.close()


def test_a_connection_that_stops_reading_is_charged_what_waits_for_it_and_gets_the_rest_once_it_reads(make_server):
    limits = dataclasses.replace(DEFAULT_LIMITS, delivery_share=256 * KIB)
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=limits)
    port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KIB)
    slow.connect(("127.0.0.1", port))
    events = b" ".join(b"event.%05d" % i for i in range(1_997))  # (a notice of 24 KB)
    slow.sendall(b"c0 consume --confirm q " + events + b"\n" + b"".join(b"c%d consume q\n" % i for i in range(1, 100)))
    with MqksClient(srv.config.mqks_dsn) as adder:
        deadline = time.monotonic() + 10
        while srv.stats()["mqks"]["consumers"] < 100:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for i in range(3):
            adder.send(f"x{i} rebind --confirm q --add x{i}")
            assert adder.read_line() == f"x{i} ok "
        time.sleep(0.5)  # (what it may be sent is sent; it reads nothing)
        memory = srv.stats()["memory"]
        assert 0 < memory["delivery_piped_bytes"] <= 256 * KIB + 25 * KIB, memory
        slow.settimeout(10)
        data, told = b"", set()
        while len(told) < 100:
            data += slow.recv(1 << 20)
            *whole, data = data.split(b"\n")
            told |= {line.split(b" ")[0] for line in whole if line.endswith(b" x0 x1 x2")}
        deadline = time.monotonic() + 10
        while srv.stats()["memory"]["delivery_piped_bytes"]:
            assert time.monotonic() < deadline, "what it read stayed charged"
            time.sleep(0.02)
    slow.close()


def test_pipelined_lines_are_answered_up_to_the_connections_share_and_the_rest_once_its_peer_has_those(store):
    share = 64 * KIB
    limits = dataclasses.replace(DEFAULT_LIMITS, delivery_share=share)
    gateway = gateway_on(store, delivery_share=share)
    gateway.connected(b"deaf")
    gateway.keep(b"deaf", b"".join(b"p%04d ping %s\n" % (i, b"y" * 1000) for i in range(1000)))  # (1 MB of answers)
    answered = []
    for _ in range(5):  # (its peer acknowledges nothing)
        answered += lines_to(turn(gateway, limits), b"deaf")
    assert 0 < sum(map(len, answered)) <= share + 1100, "answers up to its share (and one), however many turns"
    assert gateway.stats()["lines_waiting"] == 1000 - len(answered), "the rest wait, counted in its input"
    for _ in range(40):  # its peer reads: what it was sent is acknowledged, the rest is answered, in order
        gateway.unpiped(b"deaf", share)
        answered += lines_to(turn(gateway, limits), b"deaf")
    assert answered == [b"p%04d ok %s" % (i, b"y" * 1000) for i in range(1000)]


def test_a_connection_past_the_ceiling_is_answered_once_it_holds_no_answer_and_another_is_answered_meanwhile(store):
    limits = DEFAULT_LIMITS
    gateway = gateway_on(store)
    for conn in (b"a", b"b"):
        gateway.connected(conn)
    gateway.broker.accounts.bank(others=10 << 20, ceiling=8 << 20, high_water=64 << 20)  # (the memory bound full)
    gateway.keep(b"a", b"a1 ping x\na2 ping y\n")
    assert lines_to(turn(gateway, limits), b"a") == [b"a1 ok x"], "one answer while it holds none"
    gateway.keep(b"b", b"b1 ping z\n")
    assert lines_to(turn(gateway, limits), b"b") == [b"b1 ok z"], "another connection holding none is answered"
    assert lines_to(turn(gateway, limits), b"a") == [], "none more while its answer is unacknowledged"
    gateway.unpiped(b"a", 100)
    assert lines_to(turn(gateway, limits), b"a") == [b"a2 ok y"]


def test_a_connection_that_pipelines_lines_and_reads_nothing_holds_its_share_of_answers_then_is_closed(make_server):
    limits = dataclasses.replace(DEFAULT_LIMITS, delivery_share=64 * KIB)
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=limits)
    port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
    deaf = socket.socket()
    deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KIB)
    deaf.connect(("127.0.0.1", port))
    done = threading.Event()

    def write() -> None:  # (answers of 1 KB: 8 MB of them, far past its share; its lines past its input's)
        try:
            for i in range(8_000):
                deaf.sendall(b"p%06d ping %s\n" % (i, b"y" * 1000))
        except OSError:
            pass  # (closed)
        done.set()

    # The most its answers were charged, seen where they are charged (sampled from here, a connection
    # closed within half a second was missed on a busy machine: most stayed 0)
    accounts, most = srv.server.broker.accounts, [0]
    hold = accounts.hold

    def held(payer, size: int) -> None:
        hold(payer, size)
        most[0] = max(most[0], accounts.piped_total)

    accounts.hold = held
    threading.Thread(target=write, daemon=True).start()
    deadline = time.monotonic() + 30
    while not done.is_set() or srv.stats()["mqks"]["connections"]:
        assert time.monotonic() < deadline, "still open, or still read"
        time.sleep(0.02)
    assert 0 < most[0] <= 64 * KIB + 2 * KIB, "answers it left unread stop at its share"
    memory = srv.stats()["memory"]
    assert memory["delivery_piped_bytes"] == 0 and memory["alarms_total"] == 0, "what it was charged went with it"
    deaf.close()
    with MqksClient(srv.config.mqks_dsn) as other:
        other.send("pg ping fine")
        assert other.read_line() == "pg ok fine"


def test_a_long_line_of_an_action_that_takes_a_few_ids_is_refused_before_it_is_parsed(store):
    gateway = gateway_on(store)
    gateway.connected(b"a")
    gateway.keep(b"a", b"pg1 ping " + b"z" * (100 * KIB) + b"\nack1 ack c1 " + b"m" * (100 * KIB) + b"\npg2 ping ok\n")
    assert lines_to(turn(gateway, DEFAULT_LIMITS), b"a") == [b"pg1 error E", b"ack1 error E", b"pg2 ok ok"]


def test_a_change_of_thousands_of_events_is_indexed_over_slices_and_one_stored_before_a_rollback_is_kept(store):
    limits = dataclasses.replace(DEFAULT_LIMITS, turn_records=1)  # (one slice a turn)
    gateway = gateway_on(store, turn_records=1)
    gateway.connected(b"a")
    old = b" ".join(b"old.%d" % i for i in range(5_000))
    new = b" ".join(b"new.%d" % i for i in range(5_000))
    gateway.keep(b"a", b"r1 rebind --confirm q " + old + b"\n")
    answers = []
    while not answers:
        answers += lines_to(turn(gateway, limits), b"a")
    gateway.keep(b"a", b"r2 rebind --confirm q " + new + b"\n")
    assert lines_to(turn(gateway, limits), b"a") == [], "stored, not yet indexed: not answered"
    index = gateway.bindings
    assert list(index.get("q").events) == sorted(new.decode().split()) and index.indexing("q")
    routed = {event for event in ("old.1", "old.4999", "new.1", "new.4999") if index.queues_for(event)}
    assert routed and routed != {"new.1", "new.4999"}, "some events route as before meanwhile"
    assert lines_to(turn(gateway, limits, fail=True), b"a") == [b"r2 ok "], "stored in an earlier turn: kept"
    assert not index.indexing("q") and index.queues_for("new.4999") == ("q",) and index.queues_for("old.1") == ()
