"""The byte account of deliveries (pzq/broker/accounts.py) on a real broker and store: what a payer is
handed stops at its share, and bytes handed out stay charged until they are known to be gone."""

from __future__ import annotations

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.config import Limits

T0 = 1_700_000_000_000_000
KB = b"x" * 1000
SHARE = 4096


@pytest.fixture
def broker(store):
    return Broker(store, ack_timeout_s=10.0, limits=Limits(delivery_share=SHARE))


def fill(broker: Broker, n: int, queue: str = "q") -> None:
    for _ in range(n):
        broker.produce(queue, [KB], now_us=T0)
    broker.store.commit()


def take(broker: Broker, consumer: str = "c", n: int = 100, now: float = 0.0, payer=None) -> list:
    return broker.take("q", n, consumer, now=Now(now, T0), payer=payer)


def charged(broker: Broker, payer) -> int:
    return broker.accounts.held(payer, broker.inflight)


def test_a_payer_is_handed_its_share_and_one_message_more_then_nothing(broker):
    fill(broker, 20)
    first = take(broker)
    assert len(first) == 5 and charged(broker, "c") == 5000  # (4 fit its share; the fifth is the one more)
    assert take(broker) == []
    assert broker.ready_count("q") == 15


def test_a_payer_that_holds_nothing_gets_a_message_bigger_than_its_share(broker):
    broker.produce("q", [b"y" * (3 * SHARE)], now_us=T0)
    assert len(take(broker)) == 1


def test_an_ack_releases_the_bytes_and_the_payer_is_handed_more(broker):
    fill(broker, 20)
    held = take(broker)
    readiness = broker.readiness
    assert broker.ack((held[0].qid, held[0].seq), by="c")
    assert broker.readiness > readiness, "a payer refused for want of room is told it has some"
    assert charged(broker, "c") == 4000
    assert len(take(broker)) == 1


def test_a_timed_out_copy_stays_charged_until_a_late_answer(broker):
    fill(broker, 20)
    held = take(broker)
    assert broker.expire(now=11.0) == 5
    assert charged(broker, "c") == 5000, "a copy that only timed out may still sit in the payer's pipe"
    assert take(broker, "c", now=11.0) == [], "nothing more for a payer whose copies were never read"
    assert [m.seq for m in take(broker, "other", now=11.0)] == [m.seq for m in held]  # (delivered again)
    assert broker.ack((held[0].qid, held[0].seq), by="c")  # a late answer: that copy was read
    assert charged(broker, "c") == 4000


def test_a_timed_out_copy_stays_charged_when_another_consumer_settles_the_message(broker):
    fill(broker, 20)
    held = take(broker)
    broker.expire(now=11.0)
    again = take(broker, "other", now=11.0)
    assert [m.seq for m in again] == [m.seq for m in held]
    assert broker.ack_many([(m.qid, m.seq) for m in again[:3]], by="other") == []
    assert broker.ack((again[3].qid, again[3].seq), by="other") and broker.nack(
        (again[4].qid, again[4].seq), by="other"
    )
    # (its copies were never read: they may still sit in its pipe, whoever read the message since; a PHPMQ
    # consumer that never reads was handed more each time a reader acked what timed out)
    assert charged(broker, "c") == 5000 and take(broker, "c", now=11.0) == []
    broker.payer_gone("c")
    assert charged(broker, "c") == 0


def test_a_payers_end_takes_its_stale_copies_with_it(broker):
    fill(broker, 20)
    take(broker, payer="conn")
    broker.expire(now=11.0)
    assert charged(broker, "conn") == 5000
    broker.payer_gone("conn")
    assert charged(broker, "conn") == 0
    assert broker.accounts.total(broker.inflight) == 0


def test_a_delivery_that_never_left_is_not_charged(broker):
    fill(broker, 3)
    held = take(broker)
    for message in held:
        broker.undeliver((message.qid, message.seq))
    assert charged(broker, "c") == 0


def test_a_consumer_cancelled_on_a_connection_leaves_its_copies_charged_to_the_connection(broker):
    fill(broker, 3)
    take(broker, "consumer-1", payer="conn")
    broker.consumer_gone("consumer-1")
    assert charged(broker, "conn") == 3000  # (its connection is open: the lines may still be in its pipe)
    assert broker.ready_count("q") == 3


def test_a_rolled_back_turn_gives_back_exactly_the_bytes_it_charged(broker):
    fill(broker, 6)
    take(broker, n=2)
    broker.store.commit()
    broker.turn_begins()
    take(broker, n=2)
    assert charged(broker, "c") == 4000
    broker.store.abort()
    broker.rolled_back()
    assert charged(broker, "c") == 0  # (a holder not kept on rollback: its deliveries are forgotten)
    assert broker.accounts.total(broker.inflight) == 0


def test_deliveries_stop_at_the_ceiling_and_past_the_high_water_mark_even_one_is_refused(broker):
    fill(broker, 20)
    broker.accounts.bank(others=0, ceiling=2500, high_water=3000)
    assert len(take(broker, "a")) == 3  # (two fit under the ceiling, and its one more)
    assert len(take(broker, "b")) == 1  # one that holds nothing still gets one, under the high-water mark
    broker.accounts.bank(others=3000 + broker.accounts.slack, ceiling=2500, high_water=3000)
    assert take(broker, "c") == []
    assert broker.accounts.refused_total >= 1


def test_bytes_charged_outside_deliveries_fill_the_payers_share_until_libzmq_frees_them(broker):
    fill(broker, 20)
    record = broker.accounts.charge("pub", 3000)
    assert charged(broker, "pub") == 3000 and broker.accounts.total(broker.inflight) == 3000
    assert broker.accounts.room("pub", broker.inflight) == SHARE - 3000
    more = broker.accounts.charge("pub", 2000)
    assert broker.accounts.room("pub", broker.inflight) == 0
    readiness = broker.readiness
    broker.discharged("pub", record, 3000)
    assert broker.readiness > readiness, "a payer refused for want of room is told it has some"
    broker.discharged("pub", more, 2000)
    assert charged(broker, "pub") == 0 and broker.accounts.total(broker.inflight) == 0
    assert "pub" not in broker.accounts._stale, "a client's identity is not remembered once it holds nothing"


def test_bytes_in_a_payers_pipe_count_in_its_share_until_its_peer_has_them_or_it_is_gone(broker):
    fill(broker, 20)
    broker.piped("c", 3500)  # (replies and notices handed to libzmq for its connection)
    assert charged(broker, "c") == 3500 and broker.accounts.total(broker.inflight) == 3500
    assert broker.accounts.may_hand("c", 500, broker.inflight) and not broker.accounts.may_hand(
        "c", 700, broker.inflight
    )
    assert len(take(broker)) == 1, "its share holds one delivery more (and that is all)"
    assert take(broker) == []
    before = broker.readiness
    broker.unpiped("c", 3500)  # (its peer's TCP acknowledged them)
    assert charged(broker, "c") == 1000 and broker.readiness > before, "room again: takers are told"
    assert len(take(broker)) == 4
    broker.piped("c", 2000)
    broker.payer_gone("c")
    assert broker.accounts.stats(broker.inflight)["delivery_piped_bytes"] == 0, "gone with its connection"
