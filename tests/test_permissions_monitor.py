"""Permissions on the monitor socket's admin requests, over real sockets with CURVE keys: PEEK, DEAD and
DEADLETTERS need the consume right on their queue (they show bodies), PURGE, DELETEDEAD and REQUEUE the
manage right, PUBLISH the produce right; the figures (MONITOR, STATS, QUEUE, CLIENTS) are anyone's on
the socket. A refusal is one ``error: not permitted: ...`` line, changes nothing, and is counted."""

from __future__ import annotations

import json
import time

import pytest
import zmq

from pzq.clients import native as client
from pzq.clients.admin import AdminRefused, admin_request
from pzq.config import Limits
from pzq.curve import secure_client
from pzq.store import Store

from conftest import wait_until
from permission_keys import ORDERS_PRODUCE_ONLY, reload

pytestmark = pytest.mark.timeout(60)

SEEDED = 3  # ready messages and dead letters each seeded queue holds


def seed(database, queues: tuple[str, ...]) -> None:
    """Queues with ready messages and dead letters, written before the server opens the store."""
    store = Store(database, max_size=64 << 20)
    try:
        for name in queues:
            store.catalog.name_queue(name)
            for i in range(SEEDED):
                store.put(name, [b"%s dead %d" % (name.encode(), i)], now_us=1 + i)
            for i in range(SEEDED):
                dying = store.put(name, [b"%s died %d" % (name.encode(), i)], now_us=10 + i)
                assert store.dead_letters.add(dying, "max-deliveries", now_us=20 + i)
        store.commit()
    finally:
        store.close()


@pytest.fixture
def tenants_server(make_server, tenants, tmp_path):
    """A server with CURVE on every socket (the monitor's too) and the tenants' permissions, whose
    queues ``orders.x`` and ``payroll`` each hold SEEDED ready messages and SEEDED dead letters."""
    seed(tmp_path / "db", ("orders.x", "payroll"))
    return make_server(queue="orders.x", consume_dsn="", **tenants.config())


def ask(srv, tenants, name: str, *words: str, body: bytes | None = None):
    """``name``'s request to the monitor, with its own CURVE key."""
    return admin_request(srv.monitor, words, body, timeout_s=10, curve=tenants.curve(name))


def refused(srv, tenants, name: str, *words: str, body: bytes | None = None) -> str:
    """The one ``error:`` line a request must get."""
    with pytest.raises(AdminRefused) as caught:
        ask(srv, tenants, name, *words, body=body)
    assert caught.value.reply.startswith("error: not permitted: ") and caught.value.reply.count("\n") == 1
    return str(caught.value)


def stats(srv, tenants) -> dict:
    """STATS, asked with the stranger's key: a key without a single right sees the figures."""
    return client.stats(srv.monitor, timeout_s=10, curve=tenants.curve("stranger"))


def figures(srv, tenants, queue: str) -> tuple[int, int]:
    q = stats(srv, tenants)["queues"][queue]
    return q["depth"], q["dead_letters"]


# Each admin request that names a queue, the right it needs, and its words on queue Q
REQUESTS = [
    ("consume", "PEEK", ("PEEK", "Q")),
    ("consume", "DEAD", ("DEAD", "Q")),
    ("consume", "DEADLETTERS", ("DEADLETTERS", "Q")),
    ("manage", "PURGE", ("PURGE", "Q")),
    ("manage", "DELETEDEAD", ("DELETEDEAD", "Q", "all")),
    ("manage", "REQUEUE", ("REQUEUE", "Q", "all")),
    ("produce", "PUBLISH", ("PUBLISH", "Q")),
    ("manage", "CREATE", ("CREATE", "Q")),
    ("manage", "DELETE", ("DELETE", "Q")),
]


def words_on(words: tuple[str, ...], queue: str) -> tuple[str, ...]:
    return tuple(queue if w == "Q" else w for w in words)


def test_a_key_limited_to_orders_is_refused_every_admin_request_on_payroll_and_nothing_changes(tenants_server, tenants):
    srv = tenants_server
    for right, command, words in REQUESTS:
        body = b"forged" if command == "PUBLISH" else None
        text = refused(srv, tenants, "orders", *words_on(words, "payroll"), body=body)
        assert text == f"not permitted: orders has no {right} right on queue 'payroll' ({command})"
    assert figures(srv, tenants, "payroll") == (SEEDED, SEEDED), "nothing purged, deleted, requeued or added"
    peeked = ask(srv, tenants, "payroll", "PEEK", "payroll", "10")["messages"]
    assert len(peeked) == SEEDED, "the owner's messages are all there"
    refusals = stats(srv, tenants)["permissions"]
    assert refusals["refused"]["orders"] == {"consume": 3, "manage": 5, "produce": 1}
    assert refusals["refused_total"] == 9


def test_a_key_limited_to_orders_may_do_every_admin_request_on_orders_x(tenants_server, tenants):
    srv = tenants_server
    assert len(ask(srv, tenants, "orders", "PEEK", "orders.x")["messages"]) == SEEDED
    letters = ask(srv, tenants, "orders", "DEAD", "orders.x")["letters"]
    assert len(letters) == SEEDED
    assert len(ask(srv, tenants, "orders", "DEADLETTERS", "orders.x")) == SEEDED
    assert ask(srv, tenants, "orders", "REQUEUE", "orders.x", letters[0]["id"])["requeued"] == 1
    assert ask(srv, tenants, "orders", "DELETEDEAD", "orders.x", letters[1]["id"]) == {"deleted": 1, "left": 1}
    assert figures(srv, tenants, "orders.x") == (SEEDED + 1, SEEDED - 2)
    assert ask(srv, tenants, "orders", "PURGE", "orders.x") == {"purged": SEEDED + 1, "more": False}
    assert ask(srv, tenants, "orders", "PUBLISH", "orders.x", body=b"new order")["queue"] == "orders.x"
    assert figures(srv, tenants, "orders.x") == (1, SEEDED - 2)
    assert ask(srv, tenants, "orders", "CREATE", "orders.new")["created"] is True
    assert ask(srv, tenants, "orders", "DELETE", "orders.new")["deleted"] == "orders.new"
    assert stats(srv, tenants)["permissions"]["refused_total"] == 0


def test_the_figures_are_answered_to_any_key_let_onto_the_socket(tenants_server, tenants):
    srv = tenants_server
    for name in ("orders", "stranger"):
        assert ask(srv, tenants, name, "QUEUE", "payroll")["figures"]["depth"] == SEEDED
        assert "tables" in ask(srv, tenants, name, "CLIENTS")
        assert "payroll" in client.stats(srv.monitor, curve=tenants.curve(name))["queues"]
        text = client.monitor_request(srv.monitor, "MONITOR", curve=tenants.curve(name))
        assert "queue.payroll.depth: 3" in text
    assert stats(srv, tenants)["permissions"]["refused_total"] == 0


def test_a_key_without_a_section_gets_the_default_which_here_is_nothing(tenants_server, tenants):
    srv = tenants_server
    text = refused(srv, tenants, "stranger", "PEEK", "orders.x")
    assert text == "not permitted: stranger has no consume right on queue 'orders.x' (PEEK)"
    tenants.write('[default]\nconsume = ["orders.*"]\n')
    reload(srv)
    assert len(ask(srv, tenants, "stranger", "PEEK", "orders.x")["messages"]) == SEEDED
    refused(srv, tenants, "stranger", "PURGE", "orders.x")


def test_a_sighup_that_narrows_a_key_refuses_its_next_request_on_the_same_socket(tenants_server, tenants, sockets):
    srv = tenants_server
    sock = sockets(zmq.REQ, None)
    secure_client(sock, *tenants.curve("orders"))
    sock.connect(srv.monitor)

    def on_open_socket(*words: str) -> str:
        sock.send_string(" ".join(words))
        assert sock.poll(10_000), "the monitor answered"
        return sock.recv_string()

    assert on_open_socket("PEEK", "orders.x").startswith("{")
    tenants.write(ORDERS_PRODUCE_ONLY)
    reload(srv)
    assert on_open_socket("PEEK", "orders.x").startswith("error: not permitted: orders has no consume right")
    assert on_open_socket("PURGE", "orders.x").startswith("error: not permitted: orders has no manage right")
    assert figures(srv, tenants, "orders.x") == (SEEDED, SEEDED)


def test_a_queue_name_of_any_bytes_is_refused_cleanly_and_the_server_goes_on(tenants_server, tenants, sockets):
    srv = tenants_server
    long_name = "payroll" + "x" * 3000
    text = refused(srv, tenants, "orders", "PURGE", long_name)
    assert text.startswith("not permitted: orders has no manage right on queue 'payroll") and len(text) < 400
    for words in (["PEEK", "pay\u00e9roll"], ["DEAD", "payroll\u0000"], ["REQUEUE", "*", "all"]):
        refused(srv, tenants, "orders", *words)
    started = time.monotonic()
    assert figures(srv, tenants, "payroll") == (SEEDED, SEEDED) and time.monotonic() - started < 10


def test_a_sighup_that_takes_the_manage_right_stops_that_keys_purge_under_way(make_server, tenants, tmp_path, caplog):
    store = Store(tmp_path / "db", max_size=256 << 20)
    try:
        store.catalog.name_queue("orders.x")
        assert store.put_many("orders.x", [[b"m"]] * 10_000, now_us=1) == 10_000
        store.commit()
    finally:
        store.close()
    # (a message a turn: the purge takes thousands of turns, each with its commit)
    srv = make_server(queue="orders.x", consume_dsn="", limits=Limits(admin_purge_share=1), **tenants.config())
    assert ask(srv, tenants, "orders", "PURGE", "orders.x") == {"purged": 1, "more": True}
    tenants.write(ORDERS_PRODUCE_ONLY)
    reload(srv)
    assert wait_until(lambda: "the purge of queue 'orders.x' stopped: orders lost its manage right" in caplog.text)
    left = figures(srv, tenants, "orders.x")[0]
    assert 0 < left < 10_000
    assert not srv.server.admin.purging("orders.x")
    assert figures(srv, tenants, "orders.x")[0] == left, "not a message more was purged"


def test_a_dealer_that_pipelines_refused_and_allowed_requests_is_answered_each_in_its_order(
    tenants_server, tenants, sockets
):
    srv = tenants_server
    dealer = sockets(zmq.DEALER, None)
    secure_client(dealer, *tenants.curve("orders"))
    dealer.connect(srv.monitor)
    asked = [
        [b"", b"PUBLISH payroll", b"forged"],
        [b"", b"PEEK orders.x"],
        [b"", b"PURGE payroll"],
        [b"", b"PUBLISH orders.x", b"an order"],
        [b"", b"DEADLETTERS payroll"],
    ]
    for frames in asked:
        dealer.send_multipart(frames)
    answers = []
    for _ in asked:
        assert dealer.poll(10_000), "every request is answered"
        answers.append(dealer.recv_multipart()[-1].decode())
    kinds = ["refused" if a.startswith("error: not permitted") else next(iter(json.loads(a))) for a in answers]
    assert kinds == ["refused", "queue", "refused", "id", "refused"], answers
    assert "(PUBLISH)" in answers[0] and "(PURGE)" in answers[2] and "(DEADLETTERS)" in answers[4]
    assert figures(srv, tenants, "payroll") == (SEEDED, SEEDED)
    assert figures(srv, tenants, "orders.x") == (SEEDED + 1, SEEDED)


def test_a_client_without_a_key_on_an_unauthenticated_monitor_gets_the_default(make_server, tenants, tmp_path):
    seed(tmp_path / "db", ("orders.x", "payroll"))
    tenants.write('[default]\nconsume = ["payroll"]\n\n[keys.orders]\nmanage = ["*"]\n')
    srv = make_server(queue="orders.x", consume_dsn="", unauthenticated="monitor", **tenants.config())
    assert len(admin_request(srv.monitor, "PEEK payroll", timeout_s=10)["messages"]) == SEEDED
    with pytest.raises(AdminRefused) as caught:
        admin_request(srv.monitor, "PURGE payroll", timeout_s=10)
    said = "not permitted: a client without a CURVE key has no manage right on queue 'payroll' (PURGE)"
    assert str(caught.value) == said
    assert srv.stats()["permissions"]["refused"] == {"anonymous": {"manage": 1}}
    assert srv.stats()["queues"]["payroll"]["depth"] == SEEDED
