"""Permissions on the API endpoint, over real CURVE sockets with the API client: PRODUCE needs the
produce right on every message's queue (one refused refuses the whole request), OFFSETS, LEASE, FETCH,
ACK_UPTO, SNAPSHOT and INFO the consume right on their queue; a refusal is ``ERR not-permitted``, changes
nothing and is counted; a SIGHUP that narrows a key cuts its open connection's rights at once."""

from __future__ import annotations

import pytest

from pzq.clients.api import ApiClient, ApiError

from conftest import free_tcp_endpoint, wait_until
from permission_keys import ORDERS_PRODUCE_ONLY, reload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api(make_server, tenants):
    """(server, client(name)): the API endpoint under CURVE, with the tenants' permissions file."""
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(api_dsn=endpoint, unauthenticated="monitor", **tenants.config())
    made: list[ApiClient] = []

    def client(name: str) -> ApiClient:
        made.append(ApiClient(endpoint, timeout_s=10, curve=tenants.curve(name)))
        return made[-1]

    yield srv, client
    for c in made:
        c.close()


def refused(call, *args, **kwargs) -> str:
    """The detail of the ``not-permitted`` error ``call`` gets (any other outcome fails the test)."""
    with pytest.raises(ApiError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == "not-permitted", caught.value
    return caught.value.detail


def test_a_key_may_produce_lease_fetch_acknowledge_and_read_its_own_queues(api):
    srv, client = api
    orders = client("orders")
    assert orders.produce([("orders.a", b"1"), ("orders.b", b"2"), ("orders.a", b"3")])["count"] == 3
    assert orders.offsets("orders.a", "billing") == (0, 0)
    assert orders.lease("orders.a", "billing", 0, 10) == (0, 2)
    rows, gone = orders.fetch("orders.a", "billing", 0, 2)
    assert [row[-1] for row in rows] == [b"1", b"3"] and gone == 0
    assert orders.ack_upto("orders.a", "billing", 2) == 2
    assert orders.info("orders.b")["depth"] == 1
    rows, _ = orders.snapshot("orders.b", 0, 10)
    assert [row[-1] for row in rows] == [b"2"]
    assert srv.stats()["permissions"]["refused_total"] == 0


def test_a_produce_naming_one_queue_the_key_may_not_produce_to_is_refused_whole(api):
    srv, client = api
    orders = client("orders")
    batch = [("orders.a", b"1"), ("payroll", b"forged"), ("orders.a", b"2")]
    detail = refused(orders.produce, batch, key="batch-1")
    assert detail == "PRODUCE refused: this client may not produce to 'payroll'"
    queues = srv.stats()["queues"]
    assert "orders.a" not in queues and "payroll" not in queues, "nothing stored, no queue made"
    # Its dedup key was not remembered either: the same key with allowed messages is stored.
    assert orders.produce([("orders.a", b"1")], key="batch-1") == {"count": 1, "duplicate": False}
    stranger = client("stranger")  # no section of its own, and no [default]: nothing
    refused(stranger.produce, [("orders.a", b"x")])
    stats = srv.stats()
    assert stats["queues"]["orders.a"]["depth"] == 1
    assert stats["permissions"]["refused"] == {"orders": {"produce": 1}, "stranger": {"produce": 1}}


def test_a_key_can_neither_read_nor_lease_nor_settle_another_tenants_queue(api):
    srv, client = api
    payroll = client("payroll")
    payroll.produce([("payroll", b"salary %d" % i) for i in range(3)])
    assert payroll.lease("payroll", "pay", 0, 2) == (0, 2)
    before = srv.stats()
    orders = client("orders")
    for command, args in (
        ("OFFSETS", {"group": "pay"}),
        ("LEASE", {"group": "pay", "after": 0, "max": 3}),
        ("LEASE", {"group": "orders-own", "after": 0, "max": 3}),  # (a group of its own on that queue)
        ("FETCH", {"group": "pay", "lo": 0, "hi": 2}),
        ("ACK_UPTO", {"group": "pay", "upto": 2}),
        ("INFO", {}),
        ("SNAPSHOT", {"after": 0, "before": 10, "limit": 10}),
    ):
        detail = refused(orders.call, command, queue="payroll", **args)
        assert detail == f"{command} refused: this client may not consume from 'payroll'"
    after = srv.stats()
    moving = ("oldest_age_s", "in_per_s", "out_per_s")  # (the clock moves on)
    still = {k: v for k, v in after["queues"]["payroll"].items() if k not in moving}
    assert still == {k: v for k, v in before["queues"]["payroll"].items() if k not in moving}, "depth, leases"
    assert after["api"]["groups"] == before["api"]["groups"] == {"payroll/pay": {"base": 0, "end": 2, "held": 2}}
    assert after["permissions"]["refused"] == {"orders": {"consume": 7}}
    rows, _ = payroll.fetch("payroll", "pay", 0, 2)
    assert [row[-1] for row in rows] == [b"salary 0", b"salary 1"], "payroll's lease is intact"
    assert payroll.ack_upto("payroll", "pay", 2) == 2


def test_a_sighup_that_narrows_a_key_cuts_its_open_connection_and_gives_its_leases_back(api, tenants):
    srv, client = api
    orders = client("orders")
    orders.produce([("orders.a", b"1"), ("orders.a", b"2")])
    assert orders.lease("orders.a", "billing", 0, 2) == (0, 2)
    payroll = client("payroll")
    # orders keeps producing only; payroll may now read orders.a (an auditor), and gets what orders held.
    tenants.write(ORDERS_PRODUCE_ONLY.replace('consume = ["payroll"]', 'consume = ["payroll", "orders.a"]'))
    reload(srv)
    # The same connection: every consuming call is refused from now on; producing still is its right.
    refused(orders.fetch, "orders.a", "billing", 0, 2)
    refused(orders.ack_upto, "orders.a", "billing", 2)
    refused(orders.lease, "orders.a", "billing", 2, 10)
    assert orders.produce([("orders.a", b"3")])["count"] == 1
    # Its group's leases went back to the queue at once, rather than after --lease-timeout.
    wait_until(lambda: srv.stats()["api"]["groups"]["orders.a/billing"]["held"] == 0)
    assert payroll.lease("orders.a", "audit", 0, 10) == (0, 3)
    rows, _ = payroll.fetch("orders.a", "audit", 0, 3)
    assert sorted((row[-1], row[3]) for row in rows) == [(b"1", 2), (b"2", 2), (b"3", 1)], "(body, deliveries)"
    stats = srv.stats()
    assert stats["queues"]["orders.a"]["depth"] == 3, "nothing was acknowledged"
    assert stats["permissions"]["refused"] == {"orders": {"consume": 3}}


def test_a_sighup_that_changes_nothing_for_a_key_leaves_its_leases_alone(api, tenants):
    srv, client = api
    orders = client("orders")
    orders.produce([("orders.a", b"1"), ("orders.a", b"2")])
    assert orders.lease("orders.a", "billing", 0, 2) == (0, 2)
    tenants.write(tenants.permissions.read_text() + '\n[keys.auditor]\nconsume = ["*"]\n')
    reload(srv)
    rows, _ = orders.fetch("orders.a", "billing", 0, 2)
    assert [row[-1] for row in rows] == [b"1", b"2"]
    srv.stats()  # (a turn later than the FETCH's: what a SIGHUP gave back would have gone by now)
    assert srv.stats()["api"]["groups"]["orders.a/billing"] == {"base": 0, "end": 2, "held": 2}


def test_a_client_without_a_key_gets_the_default_rights(make_server, tmp_path):
    rules = tmp_path / "permissions.toml"  # (no CURVE: every client is keyless, and [default] is what it may do)
    rules.write_text('[default]\nproduce = ["default", "public.*"]\nconsume = ["default", "public.*"]\n')
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(api_dsn=endpoint, permissions=str(rules))
    with ApiClient(endpoint, timeout_s=10) as anyone:
        assert anyone.produce([("public.news", b"hello")])["count"] == 1
        assert anyone.snapshot("public.news", 0, 10)[0][0][-1] == b"hello"
        refused(anyone.produce, [("public.news", b"x"), ("payroll", b"forged")])
        refused(anyone.info, "payroll")
    stats = srv.stats()
    assert stats["queues"]["public.news"]["depth"] == 1 and "payroll" not in stats["queues"]
    assert stats["permissions"]["refused"] == {"anonymous": {"consume": 1, "produce": 1}}
