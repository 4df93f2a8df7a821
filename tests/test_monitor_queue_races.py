"""CREATE, DELETE and ROUTES against an unlucky operator and a hostile client, over a real server on real
sockets: a queue deleted while a native consumer or a Spark group holds its messages, the server's own
``--queue`` deleted and made again, big ROUTES answers asked for and never read."""

from __future__ import annotations

import pytest
from test_monitor_admin_hostile import flooding

from pzq.clients import native as client
from pzq.clients.mqks import MqksClient
from pzq.endpoints.monitor import MonitorEndpoint

from admin_asks import ask, produce
from conftest import free_tcp_endpoint, wait_until

pytestmark = pytest.mark.timeout(120)


def test_the_servers_own_queue_made_again_by_a_produce_after_a_delete_is_explicit_so_it_never_expires(make_server):
    srv = make_server()
    produce(srv, [b"one", b"two"])
    answer = ask(srv, "DELETE", "default")
    assert answer["messages"] == 2
    assert "default" not in srv.stats()["queues"]  # (gone, as the operator asked, until something uses it)
    produce(srv, [b"after"])
    info = srv.server.store.queue("default", create=False)
    assert info is not None and not info.implicit, "the --queue of the server is the operator's, not a client's"
    with client.Consumer(srv.send) as consumer:
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None and delivery.body == [b"after"]


def test_an_ack_of_a_delivery_of_a_deleted_queue_touches_nothing_of_the_queue_made_again_under_its_name(make_server):
    srv = make_server(ack_timeout=30.0)
    produce(srv, [b"old"])
    with client.Consumer(srv.send) as consumer:
        held = consumer.receive(timeout_s=5)
        assert held is not None and held.body == [b"old"]
        assert ask(srv, "DELETE", "default")["messages"] == 1
        produce(srv, [b"new"])
        consumer.ack(held)  # (of the queue that went: nothing of the new one may go with it)
        fresh = consumer.receive(timeout_s=5)
        assert fresh is not None and fresh.body == [b"new"]
        consumer.ack(fresh)
    stats = srv.stats()
    assert stats["queues"]["default"]["depth"] == 0 and stats["messages_inflight"] == 0


def test_a_spark_group_leasing_a_deleted_queue_gets_an_api_error_and_leases_the_queue_made_again_from_its_start(
    make_server, tmp_path
):
    from pzq.clients.api import ApiClient, ApiError

    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    produce(srv, [b"m%d" % i for i in range(10)])
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        base, end = api.lease("default", "billing", 0, 3)
        assert ask(srv, "DELETE", "default")["messages"] == 10
        outcomes = []
        calls = (lambda: api.fetch("default", "billing", base, end), lambda: api.ack_upto("default", "billing", end))
        for call in calls:
            try:
                outcomes.append(call())
            except ApiError as exc:
                outcomes.append(exc.code)
        produce(srv, [b"new"])
        lo, hi = api.offsets("default", "billing")
        base2, end2 = api.lease("default", "billing", lo, 10)
        messages, _ = api.fetch("default", "billing", base2, end2)
        assert [m[-1] for m in messages] == [b"new"], (outcomes, lo, hi, base2, end2)
        api.ack_upto("default", "billing", end2)
    assert wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == 0)
    assert srv.stats()["messages_inflight"] == 0


def test_a_flood_of_big_routes_answers_never_read_is_refused_busy_before_it_raises_the_memory_alarm(make_server):
    """ROUTES of an event 300 queues of 250-byte names are bound to is a 77 KB answer: past the 64 KiB a
    page may take without asking the memory bound, as QUEUE, PEEK, DEAD and CLIENTS pages do."""
    mqks, _ = free_tcp_endpoint()
    srv = make_server(mqks_dsn=mqks, max_queues=100_000, memory_high_water=8 << 20, memory_low_water=6 << 20)
    with MqksClient(mqks, timeout_s=30) as mq:
        for i in range(300):
            mq.consume(f"{i:03d}".ljust(250, "q"), ["e"])
        assert ask(srv, "ROUTES", "e")["total"] == 300
        with flooding(srv.monitor, b"ROUTES e") as sent:
            assert wait_until(lambda: sent[0] > 2000, timeout_s=30)
            alarm = srv.server.alarm
            monitor = next(e for e in srv.server.endpoints if isinstance(e, MonitorEndpoint))
            assert wait_until(lambda: monitor.busy_total > 0 or alarm.raised_total > 0, timeout_s=30)
            produce(srv, [b"honest"])  # (before: "queue full: memory alarm", the monitor's backlogs past 8 MiB)
    assert srv.server.alarm.raised_total == 0


def test_the_servers_own_queue_is_made_again_when_clients_queues_took_all_their_room(make_server, tmp_path):
    from pzq.clients.api import ApiClient, ApiError

    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", max_queues=100)
    made = 0
    for i in range(200):  # (a connection each: one's share of 100 queues is one)
        with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
            try:
                api.produce([(f"tenant.{i}", b"m")])
                made += 1
            except ApiError:
                break
    assert made >= 80, "the clients' queues took their room"
    assert ask(srv, "DELETE", "default")["messages"] == 0
    produce(srv, [b"after"])  # (before: refused, queue full, the name a client's queue past the clients' room)
    assert srv.stats()["queues"]["default"]["depth"] == 1
