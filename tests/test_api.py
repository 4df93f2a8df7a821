"""The API endpoint of a real server: leases, fetches, acks, snapshots and batch produce over ZeroMQ."""

from __future__ import annotations

import signal

import msgpack
import pytest
import zmq

from pzq.clients import native as client
from pzq.clients.api import ApiClient, ApiError
from pzq.config import Limits

from conftest import recv, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api_server(make_server, tmp_path):
    return make_server(api_dsn=f"ipc://{tmp_path}/api")


@pytest.fixture
def api(api_server):
    with ApiClient(api_server.config.api_dsn, timeout_s=10) as c:
        yield c


def fill(api: ApiClient, queue: str, n: int, prefix: bytes = b"m") -> None:
    api.produce([(queue, prefix + b"%d" % i) for i in range(n)])


def test_produced_messages_are_stored_and_a_repeated_key_stores_nothing(api):
    assert api.produce([("q", b"a"), ("r", b"b")], key="k") == {"count": 2, "duplicate": False}
    assert api.produce([("q", b"a"), ("r", b"b")], key="k") == {"count": 2, "duplicate": True}
    assert api.info("q")["depth"] == 1 and api.info("r")["depth"] == 1


def test_an_empty_or_oversized_body_is_refused_and_nothing_of_the_request_is_stored(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", max_message_size=1024)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        with pytest.raises(ApiError, match="empty-message"):
            api.produce([("q", b"ok"), ("q", b"")])
        with pytest.raises(ApiError, match="too-large"):
            api.produce([("q", b"ok"), ("q", b"x" * 1025)])
        assert api.info("q")["depth"] == 0


def test_a_full_store_refuses_the_whole_request_and_keeps_serving(make_server, tmp_path):
    # (a limit, not durability, is tested: no fsync per request)
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", max_store_size=1 << 20, hard_sync=False)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.produce([("q", b"x" * 1000)] * 500)
        with pytest.raises(ApiError, match="queue-full"):
            api.produce([("q", b"x" * 1000)] * 1000)
        assert api.info("q")["depth"] == 500


def test_a_produce_refused_as_full_remembers_no_key_so_its_retry_is_stored(make_server, tmp_path):
    # (a limit, not durability, is tested: no fsync per request)
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", max_store_size=1 << 20, hard_sync=False)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.produce([("q", b"x" * 1000)] * 900)
        with pytest.raises(ApiError, match="queue-full"):
            api.produce([("q", b"y" * 1000)] * 200, key="batch-1")
        assert api.lease("q", "g", 0, 900) == (0, 900)  # a full store still drains
        assert api.ack_upto("q", "g", 900) == 900
        assert api.produce([("q", b"y" * 1000)] * 200, key="batch-1") == {"count": 200, "duplicate": False}
        assert api.info("q")["depth"] == 200


def test_dedup_keys_count_toward_the_store_limit(make_server, tmp_path):
    # (a limit, not durability, is tested: no fsync per request)
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", max_store_size=1 << 20, hard_sync=False)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        produced = 0
        with pytest.raises(ApiError, match="queue-full"):
            for i in range(20_000):  # each key outlives its message (the dedup window)
                api.produce([("q", b"m")], key="k" * 200 + str(i))
                api.lease("q", "g", produced, 1)
                api.ack_upto("q", "g", produced + 1)
                produced += 1
        assert 1_000 < produced < 20_000
        assert api.info("q")["depth"] == 0


def test_a_snapshot_reads_every_stored_message_and_changes_nothing(api):
    fill(api, "q", 25)
    info = api.info("q")
    seen, after = [], info["first"]
    while after < info["next"]:
        rows, after = api.snapshot("q", after, info["next"], limit=10)
        seen += rows
    assert [row[4] for row in seen] == [b"m%d" % i for i in range(25)]
    assert {row[3] for row in seen} == {0}
    assert api.info("q") == info


def test_the_lease_cycle_over_the_wire_reads_replays_and_acknowledges(api):
    fill(api, "q", 10)
    assert api.offsets("q", "g") == (0, 0)
    assert api.lease("q", "g", 0, 6) == (0, 6)
    first, gone = api.fetch("q", "g", 0, 6)
    assert gone == 0 and [row[4] for row in first] == [b"m%d" % i for i in range(6)]
    assert api.fetch("q", "g", 0, 6) == (first, 0)
    assert api.ack_upto("q", "g", 6) == 6
    assert api.info("q")["depth"] == 4
    assert api.lease("q", "g", 6, 100) == (6, 10)


def test_native_consumers_do_not_get_leased_messages_but_get_the_rest(api, sockets):
    fill(api, "default", 4)
    api.lease("default", "g", 0, 3)
    consumer = client.Consumer(api.endpoint.replace("/api", "/send"))
    try:
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None and delivery.body == [b"m3"]
        consumer.ack(delivery)
        # A barrier, not a quiet wait: a message produced now reaches this (only) consumer through the
        # same ordered pipe as anything the server meant to hand it before.
        api.produce([("default", b"marker")])
        delivery = consumer.receive(timeout_s=5)
        assert delivery is not None and delivery.body == [b"marker"], "a leased message went to a consumer"
    finally:
        consumer.close()


def test_refusals_name_their_reason(api):
    with pytest.raises(ApiError) as info:
        api.fetch("q", "g", 0, 5)
    assert info.value.code == "bad-range"
    with pytest.raises(ApiError, match="unknown-command"):
        api.call("EVAL", code="1+1")


def test_garbage_gets_an_error_reply_or_is_dropped_and_the_server_keeps_answering(api_server, api, sockets):
    raw = sockets(zmq.DEALER, api_server.config.api_dsn)
    raw.send_multipart([b"no delimiter"])
    raw.send_multipart([b"", b"1", b"LEASE", b"\xc1\xc1"])
    reply = recv(raw)
    assert reply[:3] == [b"", b"1", b"ERR"] and msgpack.unpackb(reply[3])["code"] == "bad-arguments"
    assert api.info("q")["depth"] == 0


@pytest.mark.parametrize(
    "command, args",
    [
        ("SNAPSHOT", {"queue": "q", "after": 2**64 - 1, "before": 2**64 - 1, "limit": 10}),
        ("PRODUCE", {"messages": [["q", b"x"]], "key": "k" * 600}),
        ("OFFSETS", {"queue": "q", "group": "g" * 600}),
        ("PRODUCE", {"messages": [["q" * 300, b"x"]]}),
    ],
)
def test_hostile_arguments_are_refused_without_undoing_anyone_elses_work(api_server, api, sockets, command, args):
    raw = sockets(zmq.DEALER, api_server.config.api_dsn)
    raw.send_multipart([b"", b"1", b"PRODUCE", msgpack.packb({"messages": [["q", b"kept"]], "key": "a"})])
    raw.send_multipart([b"", b"2", command.encode(), msgpack.packb(args)])
    replies = {frames[1]: frames[2] for frames in (recv(raw), recv(raw))}
    assert replies == {b"1": b"OK", b"2": b"ERR"}
    assert api.info("q")["depth"] == 1


def test_leases_and_acks_survive_sigkill_and_stay_away_from_native_consumers(process_server, tmp_path):
    endpoint = f"ipc://{tmp_path}/api"
    srv = process_server("--api-dsn", endpoint)
    with ApiClient(endpoint, timeout_s=20) as api:
        fill(api, "default", 10)
        api.lease("default", "g", 0, 6)
        api.ack_upto("default", "g", 2)
        before = api.fetch("default", "g", 2, 6)
        srv.restart(signal.SIGKILL)
        assert api.offsets("default", "g") == (2, 6)
        assert api.fetch("default", "g", 2, 6) == before
        consumer = client.Consumer(srv.send)
        try:
            got = []
            while (delivery := consumer.receive(timeout_s=1)) is not None:
                got.append(delivery.body[0])
                consumer.ack(delivery)
            assert got == [b"m6", b"m7", b"m8", b"m9"]
        finally:
            consumer.close()
        assert wait_until(lambda: api.info("default")["depth"] == 4)


def test_a_client_call_survives_a_server_restart_in_the_middle(process_server, tmp_path):
    endpoint = f"ipc://{tmp_path}/api"
    srv = process_server("--api-dsn", endpoint)
    with ApiClient(endpoint, timeout_s=30, attempt_s=0.5) as api:
        fill(api, "q", 3)
        srv.stop(signal.SIGKILL)
        srv.start()
        assert api.info("q")["depth"] == 3


def test_the_monitor_reports_api_figures_and_groups(api_server, api):
    fill(api, "q", 3)
    api.lease("q", "g", 0, 2)
    stats = api_server.stats()
    assert stats["api"]["groups"]["q/g"] == {"base": 0, "end": 2, "held": 2}


def test_the_monitor_text_shows_the_api_lines(api_server, api):
    fill(api, "q", 1)
    api.lease("q", "g", 0, 1)
    text = client.monitor_request(api_server.monitor)
    assert "api.groups.q/g.held: 1" in text.splitlines()


def test_a_repeated_key_with_other_messages_is_stored_too_never_dropped(api):
    api.produce([("q", b"a")], key="chunk-0")
    assert api.produce([("q", b"b")], key="chunk-0")["duplicate"] is False
    assert api.produce([("q", b"a")], key="chunk-0")["duplicate"] is True
    assert api.produce([("q", b"b")], key="chunk-0")["duplicate"] is True
    assert api.info("q")["depth"] == 2


def test_a_key_reused_after_the_dedup_window_is_remembered_again(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", api_dedup_window=0.2)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.produce([("q", b"a")], key="k")
        wait_until(lambda: api.produce([("q", b"a")], key="k")["duplicate"] is False, timeout_s=5, interval_s=0.1)
        depth = api.info("q")["depth"]
        assert api.produce([("q", b"a")], key="k")["duplicate"] is True
        assert api.info("q")["depth"] == depth


def test_big_fetches_come_in_several_replies_and_the_client_joins_them(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=Limits(api_reply_bytes=10))
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        fetch_in_several_replies(api)


def fetch_in_several_replies(api: ApiClient) -> None:
    fill(api, "q", 7)
    api.lease("q", "g", 0, 7)
    raw = api.call("FETCH", queue="q", group="g", lo=0, hi=7)
    assert raw["next"] < 7
    messages, gone = api.fetch("q", "g", 0, 7)
    assert [m[4] for m in messages] == [b"m%d" % i for i in range(7)] and gone == 0
    rows, after = api.snapshot("q", 0, 100, limit=100)
    assert len(rows) < 7 and after == rows[-1][0] + 1


def test_dedup_keys_are_bounded_and_an_empty_produce_remembers_none(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=Limits(max_dedup_keys=2))
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        for i in range(5):
            assert api.produce([], key=f"empty-{i}")["count"] == 0  # remembers nothing
        api.produce([("q", b"a")], key="k1")
        api.produce([("q", b"b")], key="k2")
        with pytest.raises(ApiError, match="too-many-keys"):
            api.produce([("q", b"c")], key="k3")
        assert api.produce([("q", b"a")], key="k1")["duplicate"] is True  # a known key still works
        for i in range(10):  # one key reused with other messages is still one key, not ten
            api.produce([("q", b"again %d" % i)], key="k2")
        with pytest.raises(ApiError, match="too-many-keys"):
            api.produce([("q", b"c")], key="k3")
    assert srv.stats()["queues"]["q"]["depth"] == 12
    api_gateway = next(e for e in srv.server.endpoints if e.name == "api").gateway
    assert len(api_gateway._keys_by_age) == 2, "memory holds one entry per key"
