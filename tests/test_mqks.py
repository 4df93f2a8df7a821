"""The MQKS gateway over real TCP: a transcript per action, the seed's hello world, framing, bad lines,
durability across kill -9, and MQKS next to the other protocols on the same queues."""

from __future__ import annotations

import logging
import re
import signal
import socket

import pytest
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients import native as client
from pzq.clients.mqks import MqksClient
from pzq.config import Limits
from pzq.errors import ClientError

from conftest import free_tcp_endpoint, mqks_barrier, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def mqks_server(make_server):
    endpoint, _ = free_tcp_endpoint()
    return make_server(mqks_dsn=endpoint)


@pytest.fixture
def connect(mqks_server):
    made: list[MqksClient] = []

    def make() -> MqksClient:
        conn = MqksClient(mqks_server.config.mqks_dsn)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        conn.close()


@pytest.fixture
def mqks_with(make_server):
    """mqks_with(limits) -> (a server on those limits, a connect() whose clients close after the test)."""
    made: list[MqksClient] = []

    def make(limits: Limits):
        server = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=limits)

        def connect() -> MqksClient:
            made.append(MqksClient(server.config.mqks_dsn))
            return made[-1]

        return server, connect

    yield make
    for conn in made:
        conn.close()


def talk(conn: MqksClient, line: str, *expected: str) -> None:
    """Send ``line``; exactly ``expected`` comes back, in order, and nothing more."""
    conn.send(line)
    got = [conn.read_line() for _ in expected]
    assert got == list(expected)
    assert mqks_barrier(conn) == []


def consumers(server) -> int:
    return server.stats()["mqks"]["consumers"]


def test_the_seed_hello_world_works_as_written(mqks_server, connect):
    alice, bob, charlie, dave = connect(), connect(), connect(), connect()
    alice.send("Alice consume greetings hi hello")
    bob.send("Bob consume greetings hi hello")
    charlie.send("Charlie consume greetings-and-byes hi hello bye good-bye")
    wait_until(lambda: consumers(mqks_server) == 3)
    dave.send("Dave publish hello world")
    assert charlie.read_line() == "Charlie ok Dave event=hello world"
    got = mqks_barrier(alice) + mqks_barrier(bob)
    assert got in (["Alice ok Dave event=hello world"], ["Bob ok Dave event=hello world"])
    assert mqks_barrier(dave) == []


def test_ping_answers_with_its_data(connect):
    talk(connect(), "pg1 ping service1", "pg1 ok service1")


def test_publish_answers_only_when_asked_to_confirm_and_copies_to_every_bound_queue(connect):
    a, b, p = connect(), connect(), connect()
    talk(a, "ca consume --confirm qa e1", "ca ok ")
    talk(b, "cb consume --confirm qb e1 e2", "cb ok ")
    talk(p, "m1 publish e1 d1")
    talk(p, "m2 publish --confirm e1 d 2", "m2 ok ")
    talk(p, "m3 publish --confirm nobody-listens d3", "m3 ok ")
    assert [a.read_line(), a.read_line()] == ["ca ok m1 event=e1 d1", "ca ok m2 event=e1 d 2"]
    assert [b.read_line(), b.read_line()] == ["cb ok m1 event=e1 d1", "cb ok m2 event=e1 d 2"]


def test_consume_replaces_adds_or_keeps_bindings_and_tells_the_other_consumers(connect):
    c1, c2 = connect(), connect()
    talk(c1, "c1 consume --confirm q1 e1 e2 --manual-ack", "c1 ok ")
    talk(c2, "c2 consume --confirm q1", "c2 ok ")  # no events: keeps e1 e2, nothing changed
    assert mqks_barrier(c1) == []
    # Replacing the events: every other consumer hears of it (c2 shares c3's connection), c3 does not.
    talk(c2, "c3 consume --confirm q1 e3", "c2 ok --update q1 e3", "c3 ok ")
    assert c1.read_line() == "c1 ok --update q1 e3 --manual-ack"
    # Adding events: the consumer that added them hears of it too.
    talk(
        c1,
        "c4 consume q1 --add e4 --delete-queue-when-unused=5",
        "c1 ok --update q1 e3 e4 --delete-queue-when-unused=5.0 --manual-ack",
        "c4 ok --update q1 e3 e4 --delete-queue-when-unused=5.0",
    )
    assert sorted([c2.read_line(), c2.read_line()]) == [
        "c2 ok --update q1 e3 e4 --delete-queue-when-unused=5.0",
        "c3 ok --update q1 e3 e4 --delete-queue-when-unused=5.0",
    ]


def test_rebind_replaces_removes_by_name_and_by_mask_then_adds(connect):
    c = connect()
    talk(c, "c1 consume --confirm q1 e0", "c1 ok ")
    talk(c, "rb1 rebind q1 e3 e4 e5.id1.a1 e5.id2.a2", "c1 ok --update q1 e3 e4 e5.id1.a1 e5.id2.a2")
    talk(
        c,
        "rb2 rebind --confirm q1 --remove e3 --add e6 e7",
        "c1 ok --update q1 e4 e5.id1.a1 e5.id2.a2 e6 e7",
        "rb2 ok ",
    )
    talk(c, "rb3 rebind q1 --remove-mask e5.*.a1 e5.*.a2 --add e8", "c1 ok --update q1 e4 e6 e7 e8")
    talk(c, "rb4 rebind --confirm q1 --add e8", "rb4 ok ")  # no change, no notice
    p = connect()
    talk(p, "m1 publish --confirm e5.id1.a1 gone", "m1 ok ")
    talk(p, "m2 publish --confirm e8 kept", "m2 ok ")
    assert c.read_line() == "c1 ok m2 event=e8 kept"


def test_ack_and_reject_one_or_all_with_retry_counts(connect):
    c, p = connect(), connect()
    talk(c, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    p.send("m1 publish e1 one")
    p.send("m2 publish e1 two")
    assert [c.read_line(), c.read_line()] == ["c1 ok m1 event=e1 one", "c1 ok m2 event=e1 two"]
    talk(c, "rj1 reject c1 m1", "c1 ok m1 event=e1,retry=1 one")  # back at the end, retry raised
    talk(
        c, "rj2 reject --confirm c1 --all", "rj2 ok ", "c1 ok m2 event=e1,retry=1 two", "c1 ok m1 event=e1,retry=2 one"
    )
    talk(c, "a1 ack --confirm c1 m2", "a1 ok ")
    talk(c, "a2 ack --confirm c1 --all", "a2 ok ")
    c.send("a3 ack c1 m9")  # nothing held under that id
    assert re.fullmatch(r"a3 error [0-9a-f]{24}", c.read_line())


def test_errors_are_answered_with_an_id_that_the_log_explains(connect, caplog):
    c = connect()
    with caplog.at_level(logging.WARNING, logger="pzq.input"):
        for line in (
            "x1 blabla 123",
            "ev1 _eval len(state.queues)",
            "a1 ack nobody m1",
            "x2 consume",
            "dc1 delete_consumer nobody",
            "dq1 delete_queue never-made",
        ):
            c.send(line)
            answer = c.read_line()
            match = re.fullmatch(r"(\S+) error ([0-9a-f]{24})", answer or "")
            assert match and match.group(1) == line.split()[0], answer
            assert match.group(2) in caplog.text
    talk(c, "pg2 ping still-alive", "pg2 ok still-alive")


def test_delete_consumer_returns_what_it_held_to_the_queue_with_retry_raised(connect):
    c1, c2, p = connect(), connect(), connect()
    talk(c1, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    talk(p, "m1 publish --confirm e1 work", "m1 ok ")
    assert c1.read_line() == "c1 ok m1 event=e1 work"
    talk(c1, "dc1 delete_consumer --confirm c1", "dc1 ok ")
    c2.send("c2 consume --confirm q1 --manual-ack")
    assert {c2.read_line(), c2.read_line()} == {"c2 ok ", "c2 ok m1 event=e1,retry=1 work"}


def test_a_disconnect_returns_unacked_messages_and_an_ack_timeout_redelivers(make_server):
    endpoint, _ = free_tcp_endpoint()
    make_server(mqks_dsn=endpoint, ack_timeout=0.2)  # (not the tests' 1 s: waited out in full)
    c1, p = MqksClient(endpoint), MqksClient(endpoint)
    talk(c1, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    talk(p, "m1 publish --confirm e1 work", "m1 ok ")
    assert c1.read_line() == "c1 ok m1 event=e1 work"
    assert c1.read_line(3.0) == "c1 ok m1 event=e1,retry=1 work"  # its ack timeout
    c1.close()
    c2 = MqksClient(endpoint)
    c2.send("c2 consume --confirm q1 --manual-ack")
    lines = sorted([c2.read_line(), c2.read_line()])
    assert lines[0] == "c2 ok " and (again := re.fullmatch(r"c2 ok m1 event=e1,retry=(\d+) work", lines[1]))
    assert int(again[1]) >= 2  # (2, unless a busy machine let c1's ack timeout pass again before it closed)
    for conn in (p, c2):
        conn.close()


def test_auto_ack_consumers_get_each_message_once_and_it_leaves_the_store(mqks_server, connect):
    c, p = connect(), connect()
    talk(c, "c1 consume --confirm q1 e1", "c1 ok ")
    talk(p, "m1 publish --confirm e1 once", "m1 ok ")
    assert c.read_line() == "c1 ok m1 event=e1 once"
    wait_until(lambda: mqks_server.stats()["queues"]["q1"]["depth"] == 0)


def test_competing_consumers_share_a_queue(make_server):
    endpoint, _ = free_tcp_endpoint()
    make_server(mqks_dsn=endpoint, ack_timeout=30.0)  # no redelivery while the test reads slowly
    c1, c2, p = MqksClient(endpoint), MqksClient(endpoint), MqksClient(endpoint)
    talk(c1, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    talk(c2, "c2 consume --confirm q1 --manual-ack", "c2 ok ")
    for i in range(20):
        p.send(f"m{i} publish e1 d{i}")
    got: dict[str, set[str]] = {"c1": set(), "c2": set()}
    while len(got["c1"] | got["c2"]) < 20:
        for name, conn in (("c1", c1), ("c2", c2)):
            line = conn.read_line(0.05)
            if line is not None:
                msg_id = line.split()[2]
                got[name].add(msg_id)
                conn.send(f"a-{msg_id} ack {name} {msg_id}")
    assert len(got["c1"]) == len(got["c2"]) == 10 and not got["c1"] & got["c2"]
    for conn in (c1, c2, p):
        conn.close()


def test_delete_queue_unbinds_tells_its_consumers_and_drops_its_messages(mqks_server, connect):
    c, p = connect(), connect()
    talk(c, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    talk(p, "m1 publish --confirm e1 x", "m1 ok ")
    assert c.read_line() == "c1 ok m1 event=e1 x"
    talk(p, "dq1 delete_queue --confirm q1", "dq1 ok ")
    assert c.read_line() == "c1 ok --update q1"
    talk(p, "m2 publish --confirm e1 y", "m2 ok ")
    assert mqks_barrier(c) == []
    assert "q1" not in mqks_server.stats()["queues"]


def test_a_queue_unused_for_its_seconds_is_deleted(mqks_server, connect):
    c = connect()
    talk(c, "c1 consume --confirm q1 e1 --delete-queue-when-unused=1", "c1 ok ")
    c.send("dc1 delete_consumer --confirm c1")
    assert c.read_line() == "dc1 ok "
    assert "q1" in mqks_server.stats()["queues"]
    wait_until(lambda: "q1" not in mqks_server.stats()["queues"], timeout_s=5)


def test_lines_may_arrive_in_fragments_or_several_at_once(connect):
    c = connect()
    for byte in b"pg1 ping one\n":
        c.sock.sendall(bytes([byte]))
    assert c.read_line() == "pg1 ok one"
    c.sock.sendall(b"pg2 ping two\npg3 ping three\r\npg4 pi")
    c.sock.sendall(b"ng four\n")
    assert [c.read_line() for _ in range(3)] == ["pg2 ok two", "pg3 ok three", "pg4 ok four"]


def test_bad_bytes_get_errors_and_an_endless_line_closes_only_that_connection(make_server):
    endpoint, addr = free_tcp_endpoint()
    make_server(mqks_dsn=endpoint, max_message_size=1024)
    with MqksClient(endpoint) as c, MqksClient(endpoint) as other:
        c.sock.sendall(b"x1 publish e1 \xff\xfe\n")
        assert re.fullmatch(r"x1 error [0-9a-f]{24}", c.read_line())
        c.sock.sendall(b"x\t2 ping\n")
        assert re.fullmatch(r"- error [0-9a-f]{24}", c.read_line())
        c.sock.sendall(b"x3 publish e1 " + b"y" * 10_000)  # no newline: the stream cannot be framed
        with pytest.raises(ClientError, match="closed|failed"):
            while c.read_line(2.0) is not None:
                pass
            pytest.fail("the connection stayed open")
        talk(other, "pg1 ping fine", "pg1 ok fine")


def test_bindings_settings_messages_and_retries_survive_kill_9(process_server, tmp_path):
    endpoint, _ = free_tcp_endpoint()
    srv = process_server("--mqks-dsn", endpoint)
    with MqksClient(endpoint) as c:
        talk(c, "c1 consume --confirm q1 e1 e2 --delete-queue-when-unused=600 --manual-ack", "c1 ok ")
        talk(c, "m1 publish --confirm e1 first", "m1 ok ", "c1 ok m1 event=e1 first")
        talk(c, "rj1 reject --confirm c1 m1", "rj1 ok ", "c1 ok m1 event=e1,retry=1 first")
        talk(c, "dc1 delete_consumer --confirm c1", "dc1 ok ")
        talk(c, "m2 publish --confirm e2 second", "m2 ok ")
    srv.restart(signal.SIGKILL)
    with MqksClient(endpoint) as c:
        talk(
            c,
            "c2 consume --confirm q1 --add e3 --manual-ack",
            "c2 ok --update q1 e1 e2 e3 --delete-queue-when-unused=600.0 --manual-ack",
            "c2 ok ",
            "c2 ok m1 event=e1,retry=2 first",
            "c2 ok m2 event=e2 second",
        )


def test_mqks_and_native_clients_share_queues_both_ways(make_server, tmp_path):
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=endpoint)
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"from ", b"native\nline"]).ok
    with MqksClient(endpoint) as c:
        c.send("c1 consume --confirm default ev --manual-ack")
        lines = {c.read_line(), c.read_line()}
        assert "c1 ok " in lines
        (line,) = lines - {"c1 ok "}
        assert re.fullmatch(r"c1 ok [0-9a-f]{32} event=default from native\\nline", line)
        c.ack("c1", line.split()[2], confirm=True)
        talk(c, "dc1 delete_consumer --confirm c1", "dc1 ok ")
        talk(c, "m1 publish --confirm ev to native", "m1 ok ")
    with client.Consumer(srv.send) as consumer:
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None and delivery.body == [b"to native"]
        consumer.ack(delivery)


def test_the_cli_publishes_and_consumes(mqks_server):
    dsn = mqks_server.config.mqks_dsn
    runner = CliRunner()
    with MqksClient(dsn) as binder:
        consumer = binder.consume("cliq", ["cli-event"])  # bind the queue, then let the CLI consume it
        binder.send(f"dc1 delete_consumer --confirm {consumer}")
        assert binder.wait_ok("dc1") == ""
    result = runner.invoke(cli, ["mqks", "publish", "--mqks-dsn", dsn, "cli-event", "hello", "there"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["mqks", "consume", "--mqks-dsn", dsn, "-n", "1", "cliq"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split("\t")[1:] == ["cli-event", "0", "hello there"]
    assert mqks_server.stats()["queues"]["cliq"]["depth"] == 0


def test_the_seed_example_over_a_plain_socket_returns_nothing_for_unconfirmed_requests(mqks_server):
    with socket.create_connection(("127.0.0.1", int(mqks_server.config.mqks_dsn.rsplit(":", 1)[1])), timeout=2) as s:
        s.sendall(b"c1 consume q1 e1\nm1 publish e9 nobody\npg1 ping done\n")
        s.settimeout(5)
        assert s.recv(100) == b"pg1 ok done\n"


def test_a_hostile_remove_mask_does_not_stall_the_server(connect):
    c, other = connect(), connect()
    talk(c, "c1 consume --confirm q1 " + "a" * 60 + ".b", "c1 ok ")
    c.send("rb1 rebind --confirm q1 --remove-mask " + "*a" * 40 + "*c.b")
    talk(other, "pg1 ping quick", "pg1 ok quick")
    assert c.read_line() == "rb1 ok "


def test_messages_with_the_same_id_are_acked_one_at_a_time(mqks_server, connect):
    c, p = connect(), connect()
    talk(c, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    talk(p, "same publish --confirm e1 first", "same ok ")
    talk(p, "same publish --confirm e1 second", "same ok ")
    assert [c.read_line(), c.read_line()] == ["c1 ok same event=e1 first", "c1 ok same event=e1 second"]
    talk(c, "a1 ack --confirm c1 same", "a1 ok ")
    assert mqks_server.stats()["queues"]["q1"]["depth"] == 1
    talk(c, "a2 ack --confirm c1 same", "a2 ok ")
    assert mqks_server.stats()["queues"]["q1"]["depth"] == 0


def test_a_rolled_back_turn_confirms_nothing_it_did_not_store(mqks_server, connect, monkeypatch):
    from pzq.errors import StoreError

    c = connect()
    talk(c, "c1 consume --confirm q1 e1 --manual-ack", "c1 ok ")
    broker = mqks_server.server.broker
    real = broker.produce
    monkeypatch.setattr(broker, "produce", lambda *a, **k: (_ for _ in ()).throw(StoreError("disk on fire")))
    c.send("m1 publish --confirm e1 lost")
    assert re.fullmatch(r"m1 error [0-9a-f]{24}", c.read_line())
    monkeypatch.setattr(broker, "produce", real)
    talk(c, "m2 publish --confirm e1 kept", "m2 ok ", "c1 ok m2 event=e1 kept")


def test_a_client_that_reads_late_still_gets_every_answer(connect):
    c = connect()
    c.sock.sendall(b"".join(b"p%d ping x\n" % i for i in range(20_000)))
    answers = [c.read_line(10) for _ in range(20_000)]
    assert answers[0] == "p0 ok x" and answers[-1] == "p19999 ok x" and None not in answers


def test_the_cli_takes_only_what_it_prints(mqks_server):
    dsn = mqks_server.config.mqks_dsn
    with MqksClient(dsn) as mq:
        consumer = mq.consume("few", ["few-event"])
        mq.send(f"dc1 delete_consumer --confirm {consumer}")
        mq.wait_ok("dc1")
        for i in range(5):
            mq.publish("few-event", f"m{i}")
    result = CliRunner().invoke(cli, ["mqks", "consume", "--mqks-dsn", dsn, "-n", "1", "few"])
    assert result.exit_code == 0, result.output
    assert mqks_server.stats()["queues"]["few"]["depth"] == 4
    with MqksClient(dsn) as mq:
        mq.consume("few", manual_ack=True)
        assert {mq.receive().retry for _ in range(4)} == {0}


def test_an_unused_queue_goes_even_when_no_client_is_connected(mqks_server):
    with MqksClient(mqks_server.config.mqks_dsn) as c:
        c.consume("brief", ["x"], manual_ack=True)
        c.send("u1 consume --confirm brief --delete-queue-when-unused=0.2")
        c.wait_ok("u1")
    wait_until(lambda: "brief" not in mqks_server.stats()["queues"], timeout_s=5)


@pytest.mark.parametrize("allow, admitted", [("10.0.0.0/8", False), ("10.0.0.0/8, 127.0.0.1", True)])
def test_the_ip_allow_list_admits_or_disconnects_a_client(make_server, allow, admitted):
    endpoint, _ = free_tcp_endpoint()
    make_server(mqks_dsn=endpoint, allow_ips=allow)
    with MqksClient(endpoint) as c:
        c.send("pg1 ping hello")
        if admitted:
            assert c.read_line() == "pg1 ok hello"
        else:
            # (closed, or reset: the kernel answers with a reset when the server closes a connection
            # whose ping it had not read)
            with pytest.raises(Exception, match="closed|reset by peer"):
                c.read_line()


def test_one_connection_holds_at_most_max_consumers_and_a_prefetch_of_at_most_max_prefetch(mqks_with):
    _, connect = mqks_with(Limits(mqks_max_consumers=3))
    c = connect()
    for i in range(3):
        talk(c, f"c{i} consume --confirm q{i} e", f"c{i} ok ")
    c.send("c9 consume --confirm q9 e")
    assert re.fullmatch(r"c9 error [0-9a-f]{24}", c.read_line() or "")
    talk(c, "c0 consume --confirm q0 e2", "c0 ok ")  # the same id again replaces itself: allowed
    c.send("c8 consume --confirm q8 e --manual-ack --prefetch=10001")
    assert re.fullmatch(r"c8 error [0-9a-f]{24}", c.read_line() or "")


def test_one_connection_holds_at_most_max_unacked_and_what_it_held_goes_back_over_several_turns(mqks_with):
    _, connect = mqks_with(Limits(mqks_max_unacked_per_conn=30, mqks_put_back_per_turn=7))
    greedy, honest, producer = connect(), connect(), connect()
    for i in range(3):
        talk(greedy, f"c{i} consume --confirm q e --manual-ack --prefetch=25", f"c{i} ok ")
    for i in range(50):
        producer.send(f"p{i} publish e m{i}")
    got = [greedy.read_line() for _ in range(30)]
    assert all(re.fullmatch(r"c[012] ok p\d+ event=e m\d+", line or "") for line in got), got
    assert mqks_barrier(producer) == []  # every publish read, and the turns that read them over
    assert mqks_barrier(greedy) == [], "30 unacked in all, whatever the consumers' prefetch"
    greedy.close()  # 30 held: put back 7 per turn, none lost
    honest.send("h consume --confirm q e")
    assert honest.read_line() == "h ok "
    bodies = set()
    while len(bodies) < 50:
        line = honest.read_line(5)
        assert line is not None, f"only {len(bodies)} of 50 came back"
        bodies.add(line.split()[-1])
    assert bodies == {f"m{i}" for i in range(50)}


def test_consumers_and_bindings_of_all_connections_together_are_bounded(mqks_with):
    # (share_part=1: one connection may hold the whole pool here; tests/test_client_shares.py tests shares)
    mqks_server, connect = mqks_with(Limits(mqks_max_all_consumers=2, mqks_max_bindings=3, share_part=1))
    a, b = connect(), connect()
    talk(a, "c1 consume --confirm q1 e1 e2", "c1 ok ")
    talk(b, "c2 consume --confirm q2 e3", "c2 ok ")
    b.send("c3 consume --confirm q3 e4")  # a third consumer in all
    assert re.fullmatch(r"c3 error [0-9a-f]{24}", b.read_line() or "")
    b.send("r1 rebind --confirm q2 e3 e5")  # a fourth binding in all
    assert re.fullmatch(r"r1 error [0-9a-f]{24}", b.read_line() or "")
    talk(b, "r2 rebind --confirm q2 e5", "c2 ok --update q2 e5", "r2 ok ")  # a swap keeps the total
    assert mqks_server.stats()["mqks"]["bindings"] == 3
