"""The monitor's admin writes over a real server on real sockets: PURGE of a queue bigger than a share
(answered after the first, the rest over turns, what is in flight kept), DELETEDEAD and REQUEUE of one
dead letter or a capped "all", PUBLISH of a message a consumer then gets; each logged with who asked,
and each refusal one error line (an unknown queue, a bad id, a full store, a body past the limit)."""

from __future__ import annotations

import logging

import pytest

from pzq.clients import native as client
from pzq.clients.admin import AdminRefused
from pzq.config import Limits

from admin_asks import ask, produce, refusal
from conftest import wait_until

pytestmark = pytest.mark.timeout(120)


def dead_letters(srv, count: int) -> None:
    """``count`` messages of "default" dead the way a user meets them: delivered once, never acked, and
    out of deliveries (--max-deliveries 1) when they come back."""
    produce(srv, [b"dead %d" % i for i in range(count)])
    with client.Consumer(srv.send) as consumer:
        for _ in range(count):
            assert consumer.receive(timeout_s=5) is not None
        assert wait_until(lambda: srv.stats()["queues"]["default"]["dead_letters"] == count, timeout_s=60)


def test_purge_answers_after_the_first_share_and_deletes_the_rest_over_turns_keeping_what_is_in_flight(
    make_server, caplog
):
    srv = make_server(ack_timeout=60.0, max_inflight=10, limits=Limits(admin_purge_share=100))
    produce(srv, [b"m%d" % i for i in range(1000)])
    with client.Consumer(srv.send) as consumer:
        held = consumer.receive(timeout_s=5)  # in flight, unacknowledged, while the purge runs
        assert held is not None
        with caplog.at_level(logging.INFO, logger="pzq.admin"):
            answer = ask(srv, "PURGE", "default")
            inflight = srv.stats()["messages_inflight"]
            assert answer["more"] is True and 100 - inflight <= answer["purged"] <= 100
            assert wait_until(lambda: srv.stats()["queues"]["default"]["depth"] == inflight, timeout_s=20)
            assert wait_until(lambda: "the purge of queue 'default' is done" in caplog.text)
        assert "purged" in caplog.text and "(by anonymous)" in caplog.text
        consumer.ack(held)
        assert wait_until(lambda: srv.stats()["messages"] == inflight - 1, timeout_s=10)
    assert ask(srv, "PURGE", "default") == {"purged": 0, "more": False}
    assert refusal(srv, "PURGE", "nope") == "there is no queue 'nope'"
    assert refusal(srv, "PURGE").startswith("usage: PURGE")


def test_deletedead_deletes_one_dead_letter_by_id_then_all_the_rest(make_server, caplog):
    srv = make_server(max_deliveries=1, ack_timeout=0.2)
    dead_letters(srv, 3)
    first = ask(srv, "DEAD", "default")["letters"][0]["id"]
    with caplog.at_level(logging.INFO, logger="pzq.admin"):
        assert ask(srv, "DELETEDEAD", "default", first) == {"deleted": 1, "left": 2}
    assert "deleted 1 dead letter(s) of queue 'default' (by anonymous)" in caplog.text
    assert ask(srv, "DELETEDEAD", "default", first) == {"deleted": 0, "left": 2}  # (gone already)
    assert ask(srv, "DELETEDEAD", "default", "all") == {"deleted": 2, "left": 0}
    assert srv.stats()["queues"]["default"]["dead_letters"] == 0
    assert refusal(srv, "DELETEDEAD", "nope", "all") == "there is no queue 'nope'"
    assert "is not a dead letter id of queue 'default'" in refusal(srv, "DELETEDEAD", "default", "x" * 500)
    assert refusal(srv, "DELETEDEAD", "default").startswith("usage: DELETEDEAD")


def test_deletedead_and_requeue_of_all_move_at_most_1000_a_request(make_server):
    srv = make_server(max_deliveries=1, ack_timeout=0.2)
    dead_letters(srv, 2100)
    requeued = ask(srv, "REQUEUE", "default", "all")
    assert requeued["requeued"] == 1000 and len(requeued["ids"]) == 1000 and requeued["left"] == 1100
    assert ask(srv, "DELETEDEAD", "default", "all") == {"deleted": 1000, "left": 100}
    assert ask(srv, "DELETEDEAD", "default", "all") == {"deleted": 100, "left": 0}
    figures = srv.stats()["queues"]["default"]
    assert (figures["dead_letters"], figures["depth"]) == (0, 1000)


def test_a_published_message_is_stored_and_a_native_consumer_gets_it(server, caplog):
    produce(server, [b"first"])
    with caplog.at_level(logging.INFO, logger="pzq.admin"):
        answer = ask(server, "PUBLISH", "default", body=b"\x00hello \xff binary")
    assert answer["queue"] == "default" and answer["id"]
    assert f"published {answer['id']} (15 bytes) to queue 'default' (by anonymous)" in caplog.text
    assert ask(server, "PUBLISH", "default", body=b"")["id"] != answer["id"]  # (an empty body is a body)
    with client.Consumer(server.send) as consumer:
        got = [consumer.receive(timeout_s=5) for _ in range(3)]
    assert [d.body for d in got if d is not None] == [[b"first"], [b"\x00hello \xff binary"], [b""]]
    assert refusal(server, "PUBLISH", "nope", body=b"x") == "there is no queue 'nope'"
    assert refusal(server, "PUBLISH", body=b"x").startswith("usage: PUBLISH")


def test_publish_is_refused_as_a_producer_is_when_the_store_is_full_or_the_body_too_big(make_server):
    srv = make_server(max_store_size=1 << 20, max_message_size=200_000)
    assert "more than --max-message-size 200000" in refusal(srv, "PUBLISH", "default", body=b"x" * 200_001)
    with pytest.raises(AdminRefused) as full:
        for _ in range(30):
            ask(srv, "PUBLISH", "default", body=b"x" * 150_000)
    assert str(full.value).startswith("the message was refused: queue full")
    assert 0 < srv.stats()["queues"]["default"]["depth"] < 30
    assert srv.stats()["refused_full_total"] >= 1
