"""A hostile tenant against the permissions, over real sockets: a key limited to ``orders.*`` tries to
wedge the server or flood its log with requests it knows will be refused, and to keep or widen its
rights through weird names, reloads and reconnects. Each test is an attack that once worked."""

from __future__ import annotations

import logging

import pytest
import test_permissions_phpmq as php
from test_permissions_emqp import Peers, answer, refused, request
from test_permissions_mqks import NETWORKS, PAYROLL, is_error, mqks  # noqa: F401  (mqks: a fixture)
from test_permissions_mqks import ask as mqks_ask
from test_permissions_phpmq import phpmq  # noqa: F401  (a fixture)

from pzq.errors import ClientError

from conftest import free_tcp_endpoint, mqks_barrier, wait_until
from permission_keys import TENANTS, reload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def emqp(make_server, tenants):
    """start(permissions text) -> (server, peers): the eMQP gateway under CURVE with that file."""
    made: list[Peers] = []

    def start(text: str = TENANTS):
        tenants.write(text)
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back, unauthenticated="monitor", **tenants.config())
        peers = Peers(tenants, front, back, "")
        made.append(peers)
        return srv, peers

    yield start
    for peers in made:
        peers.close()


def test_a_huge_refused_queue_name_does_not_wedge_the_server_on_a_pattern_of_two_stars(emqp):
    # "*.*.eu" as a regular expression backtracks quadratically on a long name it does not match:
    # 60,000 dots took the loop about 10 s (a megabyte, about an hour), for one refused REQUEST.
    srv, peers = emqp('[keys.orders]\nproduce = ["orders.*", "*.*.eu"]\n')
    orders = peers.client("orders")
    request(orders, b"." * 60_000)
    m = request(orders, b"orders.jobs")
    assert answer(orders, m)[2] == b"ACK", "the next request was answered at once"
    assert srv.stats()["permissions"]["refused"] == {"orders": {"produce": 1}}


def test_a_refused_huge_queue_name_is_not_written_whole_to_the_log(emqp, caplog):
    srv, peers = emqp()
    orders = peers.client("orders")
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            m = request(orders, b"payroll" + b"x" * 500_000)
            assert "not permitted" in refused(answer(orders, m))
    lines = [r.getMessage() for r in caplog.records if "not-permitted" in r.getMessage()]
    assert lines, "the refusals were logged"
    assert max(map(len, lines)) < 1000, "each line names the queue by its start and its size"
    assert srv.stats()["permissions"]["refused_total"] == 5


def test_a_pattern_of_stars_matches_exactly_the_names_it_matched_as_a_plain_regular_expression():
    import random
    import re

    from pzq.permissions import Rights

    def plain(pattern: str, name: str) -> bool:
        return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), name, re.DOTALL) is not None

    rng = random.Random(30)
    for _ in range(5000):
        pattern = "".join(rng.choice("ab.*") for _ in range(rng.randint(1, 7)))
        name = "".join(rng.choice("ab.*\n") for _ in range(rng.randint(0, 9)))
        assert Rights({"consume": [pattern]}).may("consume", name) == plain(pattern, name), (pattern, name)


def test_a_flood_of_refused_mqks_publishes_costs_little_with_thousands_of_networks_in_the_file(make_server, tmp_path):
    # Each refusal looked its peer's network up again, one test per network: 20,000 networks made each
    # refused line cost about 6 ms of the loop (3,000 lines: 18 s), for any client of the raw port.
    # 4,000 here (about 3.6 s of the loop's CPU that way; 0.08 s now): reading 20,000 took 2-10 s.
    from pzq.clients.mqks import MqksClient

    networks = "".join(f'[networks."10.{i // 256}.{i % 256}.0/24"]\nproduce = ["x"]\n' for i in range(4_000))
    path = tmp_path / "permissions.toml"
    path.write_text('[default]\nproduce = ["default"]\nconsume = ["default"]\n' + networks)
    dsn, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=dsn, permissions=str(path))
    conn = MqksClient(dsn)
    try:
        assert mqks_barrier(conn) == []
        started = srv.cpu_s()  # (the loop's CPU, not the wall: a busy machine's waits are not this work)
        conn.sock.sendall(b"".join(b"r%d publish payroll.paid forged\n" % i for i in range(3000)))
        lines = mqks_barrier(conn)
        spent = srv.cpu_s() - started
    finally:
        conn.close()
    assert len(lines) == 3000 and all(" error " in line for line in lines)
    assert srv.stats()["permissions"]["refused"] == {"default": {"produce": 3000}}
    assert spent < 1, f"3,000 refused lines took {spent:.1f} s of the loop's CPU"


def test_a_peer_gets_the_most_specific_network_holding_it_whatever_the_versions_and_prefixes_listed():
    import ipaddress
    import random

    from pzq.permissions import NOTHING, Rules

    rng = random.Random(30)
    networks = []
    for i in range(300):
        if i % 2:
            text = f"10.{rng.randint(0, 3)}.{rng.randint(0, 3)}.{rng.randint(0, 255)}/{rng.randint(0, 32)}"
        else:
            text = f"fd00::{rng.randint(0, 3):x}:{rng.randint(0, 65535):x}/{rng.randint(0, 128)}"
        network = ipaddress.ip_network(text, strict=False)
        networks.append((network, f"network {network} #{i}", NOTHING))
    rules = Rules("test", NOTHING, {}, networks)

    def one_by_one(ip) -> str:  # what the rules mean: the first of the most specific first
        return next((label for n, label, _ in rules.networks if n.version == ip.version and ip in n), "default")

    for _ in range(2000):  # (6,000 addresses, v4 and v6, against 300 networks in a few /16s)
        v4 = f"10.{rng.randint(0, 3)}.{rng.randint(0, 3)}.{rng.randint(0, 255)}"
        v6 = f"fd00::{rng.randint(0, 3):x}:{rng.randint(0, 65535):x}"
        for address, ip in ((f"{v4}:5", v4), (f"[::ffff:{v4}]:5", v4), (f"[{v6}]:5", v6)):
            assert rules.for_address(address)[0] == one_by_one(ipaddress.ip_address(ip)), address


def test_a_refusal_does_not_echo_a_huge_queue_name_back_to_the_client(emqp):
    # Each refusing REPLY held the whole name: a client that sends REQUESTs naming a megabyte queue and
    # never reads made the server hold up to a thousand such replies (SNDHWM) per connection, in memory.
    srv, peers = emqp()
    orders = peers.client("orders")
    m = request(orders, b"payroll" + b"x" * 500_000)
    frames = answer(orders, m)
    assert "not permitted" in refused(frames)
    assert sum(map(len, frames)) < 1000, "the refusal names the queue by its start and its size"
    assert "payrollxxx" in refused(frames)


def test_a_network_that_lost_an_event_stops_reading_it_through_a_queue_it_bound_it_to(mqks):  # noqa: F811
    # Binding needs consume on the event; but a binding made while allowed kept copying the event into
    # the network's own queue after a SIGHUP took the right away, to the open consumer and to a new one.
    srv, connect, path = mqks
    path.write_text(NETWORKS.replace('consume = ["orders.*"]', 'consume = ["orders.*", "payroll.paid"]'))
    reload(srv)
    spy = connect()
    assert mqks_ask(spy, "c1 consume --confirm orders.spy payroll.paid") == ["c1 ok "]
    path.write_text(NETWORKS)
    reload(srv)
    payroll = connect(PAYROLL)
    assert mqks_ask(payroll, "p1 publish --confirm payroll.paid salaries") == ["p1 ok "]
    with pytest.raises(ClientError, match="closed"):  # (cut off at the SIGHUP, not handed payroll's event)
        spy.read_line()
    again = connect()
    assert is_error(mqks_ask(again, "c2 consume --confirm orders.spy"), "c2"), "its queue reads payroll.paid"
    assert is_error(mqks_ask(again, "c3 consume --confirm orders.spy --add orders.created"), "c3")
    assert mqks_barrier(again) == []
    assert srv.stats()["permissions"]["refused"] == {"network 127.0.0.0/8": {"consume": 2}}


def test_a_phpmq_consumer_that_moved_to_another_queue_gives_back_what_it_holds_of_one_it_lost(phpmq):  # noqa: F811
    # A SIGHUP closed only connections whose current queue was lost: one that consumed orders.eu, then
    # asked for orders.us, kept holding orders.eu's message from its consumers after losing orders.eu.
    srv, connect, _, path = phpmq
    producer, consumer = connect(), connect()
    producer.send(php.SEND, (php.QUEUE, b"orders.eu"), (php.CONTENT, b"held"))
    consumer.send(php.CONSUME, (php.QUEUE, b"orders.eu"), (php.COUNT, b"1"))
    assert consumer.read()[php.CONTENT] == b"held"
    consumer.send(php.CONSUME, (php.QUEUE, b"orders.us"), (php.COUNT, b"1"))
    wait_until(lambda: srv.stats()["phpmq"]["received_total"] == 3)
    path.write_text(php.NETWORKS.replace('consume = ["orders.*"]', 'consume = ["orders.us"]'))
    reload(srv)
    assert consumer.closed(), "the connection holding a message of a queue it lost was left open"
    wait_until(lambda: srv.stats()["queues"]["orders.eu"]["inflight"] == 0)


def test_reloading_a_file_of_thousands_of_keys_compiles_no_regular_expression_for_names_and_prefixes(
    tmp_path, monkeypatch
):
    # Each key's patterns were compiled at every read: 10,000 keys held the loop 1.1 s per SIGHUP.
    import re
    import types

    import pzq.permissions
    from pzq.permissions import CONSUME, PRODUCE, Permissions

    compiled = []

    def counting(pattern, flags=0):  # (re.compile itself, counted)
        compiled.append(pattern)
        return re.compile(pattern, flags)

    path = tmp_path / "permissions.toml"
    path.write_text(
        "".join(f'[keys.k{i}]\nproduce = ["q{i}.*", "q{i}"]\nconsume = ["*.x{i}.*"]\n' for i in range(2000))
    )
    permissions = Permissions(str(path), required=True)
    monkeypatch.setattr(pzq.permissions, "re", types.SimpleNamespace(**{**vars(re), "compile": counting}))
    assert permissions.reload()
    rules = permissions.rules
    assert all(rules.keys[f"k{i}"].may(PRODUCE, f"q{i}.eu") for i in range(2000))
    assert compiled == [], "names and prefixes are matched without a regular expression"
    assert rules.keys["k7"].may(CONSUME, "a.x7.b") and not rules.keys["k7"].may(CONSUME, "a.x8.b")
    assert len(compiled) == 1, "a pattern with a star inside is compiled once, at its first check"


def test_a_network_written_as_ipv4_mapped_ipv6_holds_the_ipv4_peers_it_names(make_server, tmp_path):
    # Peers on a dual-stack listener arrive as ::ffff:a.b.c.d and are looked up as IPv4: a network
    # written in that form held none of them, which then got [default]'s rights instead of its own.
    from pzq.clients.mqks import MqksClient

    path = tmp_path / "permissions.toml"
    path.write_text(
        '[default]\nproduce = ["*"]\nconsume = ["*"]\n\n[networks."::ffff:127.0.0.0/104"]\nproduce = ["orders.*"]\n'
    )
    dsn, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=dsn, permissions=str(path))
    conn = MqksClient(dsn)
    try:
        assert is_error(mqks_ask(conn, "x1 publish --confirm payroll.paid forged"), "x1")
        assert mqks_ask(conn, "p1 publish --confirm orders.created fine") == ["p1 ok "]
    finally:
        conn.close()
    assert srv.stats()["permissions"]["refused"] == {"network 127.0.0.0/8": {"produce": 1}}


def test_a_network_that_may_only_consume_a_queue_cannot_have_it_deleted_when_unused(mqks):  # noqa: F811
    # --delete-queue-when-unused deletes the queue and what it holds once its consumers are gone: a
    # delete_queue by another name, which a network allowed only to read the queue could ask for.
    srv, connect, path = mqks
    path.write_text(NETWORKS.replace('manage = ["orders.*"]', 'manage = ["orders.own"]'))
    reload(srv)
    owner, reader = connect(), connect()
    assert mqks_ask(owner, "o1 consume --confirm orders.audit orders.created") == ["o1 ok "]
    assert mqks_ask(owner, "o2 delete_consumer --confirm o1") == ["o2 ok "]
    assert mqks_ask(owner, "p1 publish --confirm orders.created kept") == ["p1 ok "]
    assert is_error(mqks_ask(reader, "r1 consume --confirm orders.audit --delete-queue-when-unused=0"), "r1")
    reader.close()
    assert mqks_ask(owner, "o3 consume --confirm orders.own --delete-queue-when-unused=0") == ["o3 ok "]
    assert srv.stats()["queues"]["orders.audit"]["depth"] == 1, "the queue and its message stay"
    assert srv.stats()["permissions"]["refused"] == {"network 127.0.0.0/8": {"manage": 1}}


def test_a_file_that_is_not_utf8_or_nested_too_deep_is_refused_at_start_and_kept_out_at_a_reload(tmp_path, caplog):
    # tomllib raised UnicodeDecodeError, which is no ConfigError: a traceback at start-up, and at a
    # SIGHUP the rest of the permissions' reload (the cut-off of keys a renamed key file took) skipped.
    from pzq.errors import ConfigError
    from pzq.permissions import CONSUME, Permissions

    path = tmp_path / "permissions.toml"
    path.write_bytes(b'[default]\nconsume = ["caf\xe9"]\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        Permissions(str(path), required=True)
    path.write_text('[default]\nconsume = ["orders.*"]\n')
    permissions = Permissions(str(path), required=True)
    path.write_bytes(b'[default]\nconsume = ["*", "caf\xe9"]\n')
    with caplog.at_level(logging.ERROR):
        assert not permissions.reload()
    assert "not UTF-8" in caplog.text
    assert permissions.allows_key(None, CONSUME, "orders.eu") and not permissions.allows_key(None, CONSUME, "payroll")
    path.write_text("[default]\nconsume = " + "[" * 100_000 + "]" * 100_000 + "\n")  # (RecursionError)
    with caplog.at_level(logging.ERROR):
        assert not permissions.reload()
    assert "nested too deeply" in caplog.text


def test_a_phpmq_connection_naming_thousands_of_queues_while_holding_a_message_keeps_little(phpmq):  # noqa: F811
    # What a connection may still hold is remembered by the queues it was handed messages of, not by
    # every name a CONSUME gave: those are the client's to choose, as many as it likes.
    srv, connect, _, _ = phpmq
    producer, consumer = connect(), connect()
    producer.send(php.SEND, (php.QUEUE, b"orders.eu"), (php.CONTENT, b"held"))
    consumer.send(php.CONSUME, (php.QUEUE, b"orders.eu"), (php.COUNT, b"1"))
    assert consumer.read()[php.CONTENT] == b"held"
    consumer.sock.sendall(
        b"".join(php.encode(php.CONSUME, [(php.QUEUE, b"orders.%d" % i), (php.COUNT, b"1")]) for i in range(5000))
    )
    wait_until(lambda: srv.stats()["phpmq"]["received_total"] == 5002)
    (gateway,) = [e.gateway for e in srv.server.endpoints if getattr(e, "name", "") == "phpmq"]
    assert max(len(s.consumed) for s in gateway.sessions.values()) == 1
