"""Reads through the API against a real server over ipc: FETCH pipelined by the client
(``ApiClient.fetch_pages``: every leased message once and in lease order, whatever cuts replies short or
refuses the requests in flight), and read-only replies that make no turn commit."""

from __future__ import annotations

import pytest

from pzq.clients.api import ApiClient, ApiError
from pzq.config import Limits

pytestmark = pytest.mark.timeout(60)


def leased(srv, queue: str, n: int, attempt_s: float = 5.0) -> ApiClient:
    api = ApiClient(srv.config.api_dsn, timeout_s=20, attempt_s=attempt_s)
    for i in range(0, n, 1000):
        api.produce([(queue, b"m%d" % j) for j in range(i, min(n, i + 1000))])
    end = 0
    while end < n:
        end = api.lease(queue, "g", end, n - end)[1]
    return api


def flat(pages) -> list[list]:
    return [message for messages, _ in pages for message in messages]


def test_pipelined_fetches_return_every_leased_message_once_in_lease_order(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with leased(srv, "q", 1000) as api:
        pages = list(api.fetch_pages("q", "g", 0, 1000, page=64, depth=2))
        assert flat(pages) == api.fetch("q", "g", 0, 1000)[0]
        assert [m[0] for m in flat(pages)] == list(range(1000)) and len(pages) == 16
        assert flat(api.fetch_pages("q", "g", 10, 11, page=64)) == api.fetch("q", "g", 10, 11)[0]
        assert list(api.fetch_pages("q", "g", 5, 5, page=64)) == []


def test_replies_cut_short_are_completed_before_the_pages_already_in_flight(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=Limits(api_reply_bytes=10))  # one message a reply
    with leased(srv, "q", 200) as api:
        before = api_requests(srv)
        pages = list(api.fetch_pages("q", "g", 0, 200, page=50, depth=2))
        messages = flat(pages)
        assert [m[0] for m in messages] == list(range(200))
        assert [m[4] for m in messages] == [b"m%d" % i for i in range(200)]
        assert len(pages) > 4 and api_requests(srv) - before == len(pages)  # (each rest asked for once)


def test_fetches_refused_busy_in_flight_are_asked_again_and_nothing_is_lost(make_server, tmp_path):
    # A share of unread replies of one big reply: a second FETCH in flight finds no room (ERR busy)
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=Limits(memory_peer_share=(1 << 20) + (100 << 10)))
    with leased(srv, "q", 3000) as api:
        messages = flat(api.fetch_pages("q", "g", 0, 3000, page=100, depth=2))
        assert [m[0] for m in messages] == list(range(3000))
        assert stats(srv)["memory"]["big_replies_refused_total"] > 0


def test_a_client_with_more_in_flight_than_the_server_keeps_unread_still_reads_everything(make_server, tmp_path):
    # Past Limits.api_replies_unread the server answers this client nothing until it reads its replies:
    # the requests it dropped go unanswered, and the client asks again, one at a time, after attempt_s.
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with leased(srv, "q", 2000, attempt_s=0.3) as api:
        messages = flat(api.fetch_pages("q", "g", 0, 2000, page=100, depth=8))
        assert [m[0] for m in messages] == list(range(2000))


def test_a_range_past_the_leases_is_an_error_not_an_empty_page(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with leased(srv, "q", 100) as api, pytest.raises(ApiError, match="bad-range"):
        list(api.fetch_pages("q", "g", 50, 150, page=20, depth=3))


def stats(srv) -> dict:
    from pzq.clients import native as client

    return client.stats(srv.config.monitor_dsn)


def api_requests(srv) -> int:
    return int(stats(srv)["api"]["requests"])


def test_fetches_while_acknowledged_messages_are_deleted_wait_for_no_commit_but_a_lease_does(make_server, tmp_path):
    # A long --commit-interval: what no reply waits for (the deletions of an ACK_UPTO) gathers that long.
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", commit_interval=30.0, limits=Limits(lease_work_per_turn=100))
    with leased(srv, "acked", 3000) as api:
        reader = leased(srv, "read", 2000)
        try:
            api.ack_upto("acked", "g", 3000)  # (its reply waits for the commit of the new base)
            syncs = stats(srv)["syncs"]
            messages = flat(reader.fetch_pages("read", "g", 0, 2000, page=50))
            assert [m[0] for m in messages] == list(range(2000))
            assert stats(srv)["syncs"] == syncs  # 40 FETCHes, deletions pending between them: no commit
            assert api.info("acked")["depth"] < 3000  # (the deletions went on meanwhile, uncommitted)
            reader.produce([("read", b"more")])
            syncs = stats(srv)["syncs"]
            assert reader.lease("read", "g", 2000, 10)[1] == 2001
            assert stats(srv)["syncs"] == syncs + 1  # a lease's reply leaves after its commit
        finally:
            reader.close()


def test_a_lease_with_durable_0_is_answered_before_any_commit_and_a_durable_lease_from_its_offset_commits_it(
    make_server, tmp_path
):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", commit_interval=30.0)  # (nothing commits by the clock)
    with ApiClient(srv.config.api_dsn, timeout_s=20) as api:
        api.produce([("q", b"m%d" % i) for i in range(100)])
        api.lease("q", "g", 0, 1)  # (the group exists, durably)
        syncs = stats(srv)["syncs"]
        assert api.lease("q", "g", 1, 49, durable=False) == (0, 50)
        assert api.lease("q", "g", 50, 30, durable=False) == (0, 80)
        assert stats(srv)["syncs"] == syncs  # answered without an fsync
        assert api.lease("q", "g", 0, 80) == (0, 80)  # the same leases, nothing more taken
        assert stats(srv)["syncs"] == syncs + 1  # ... answered after the commit that made them durable
        assert len(api.fetch("q", "g", 0, 80)[0]) == 80


@pytest.mark.parametrize("durable", ["no", -1, 1.5, True])
def test_a_lease_whose_durable_is_not_a_whole_number_is_refused_and_leases_nothing(make_server, tmp_path, durable):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with ApiClient(srv.config.api_dsn, timeout_s=20) as api:
        api.produce([("q", b"m")])
        with pytest.raises(ApiError) as refused:
            api.call("LEASE", queue="q", group="g", after=0, max=1, durable=durable)
        assert refused.value.code == "bad-arguments"
        assert api.offsets("q", "g") == (0, 0)
