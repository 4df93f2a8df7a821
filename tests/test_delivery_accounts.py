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
    account = broker.account("pub")
    account.charge(3000)
    assert charged(broker, "pub") == 3000 == account.held() and broker.accounts.total(broker.inflight) == 3000
    assert broker.accounts.room("pub", broker.inflight) == SHARE - 3000
    account.charge(2000)
    assert broker.accounts.room("pub", broker.inflight) == 0
    readiness = broker.readiness
    account.charge(-3000)
    assert broker.readiness > readiness, "a payer refused for want of room is told it has some"
    account.charge(-2000)
    assert charged(broker, "pub") == 0 and broker.accounts.total(broker.inflight) == 0
    assert "pub" not in broker.accounts._piped, "a client's identity is not remembered once it holds nothing"


def test_bytes_in_a_payers_pipe_count_in_its_share_until_its_peer_has_them_or_it_is_gone(broker):
    fill(broker, 20)
    broker.account("c").charge(3500)  # (replies and notices handed to libzmq for its connection)
    assert charged(broker, "c") == 3500 and broker.accounts.total(broker.inflight) == 3500
    assert broker.account("c").may_hand(500) and not broker.account("c").may_hand(700)
    assert len(take(broker)) == 1, "its share holds one delivery more (and that is all)"
    assert take(broker) == []
    before = broker.readiness
    broker.account("c").charge(-3500)  # (its peer's TCP acknowledged them)
    assert charged(broker, "c") == 1000 and broker.readiness > before, "room again: takers are told"
    assert len(take(broker)) == 4
    broker.account("c").charge(2000)
    broker.payer_gone("c")
    assert broker.accounts.stats(broker.inflight)["delivery_piped_bytes"] == 0, "gone with its connection"


def test_a_notice_counts_what_was_made_for_its_payer_this_turn_and_waits_for_memory_as_a_take_does(broker):
    account = broker.account("c")
    account.charge(2000)
    assert account.may_hand(1000) and not account.may_hand(1000, unsent=1500), "made this turn counts"
    broker.accounts.bank(others=0, ceiling=3500, high_water=8000)
    assert account.may_hand(1000) and not account.may_hand(1000, unsent=600), "and it counts under the ceiling"
    readiness = broker.readiness
    account.charge(-1000)
    assert broker.readiness > readiness, "one refused for want of memory is told when there is room"
    assert broker.account("quiet").may_hand(10_000), "one that holds nothing may have one, whatever its size"


def test_one_gone_returns_what_a_connection_held_and_lets_go_of_everything_charged_to_it(broker):
    fill(broker, 20)
    assert len(take(broker, "c", n=2)) == 2
    broker.account("c").charge(500)  # (an answer in its pipe)
    broker.account("p").charge(700)  # (a payer that holds no delivery: a pool's epoch, a publisher)
    assert broker.gone("c") == 2 and broker.ready_count("q") == 20
    assert broker.gone("p") == 0
    assert broker.account("c").held() == broker.account("p").held() == 0
    assert broker.accounts.total(broker.inflight) == 0


def test_a_delivery_given_its_own_deadline_stays_charged_to_its_payer(broker):
    fill(broker, 2)
    message = take(broker, "w", n=1, payer="client")[0]
    ref = (message.qid, message.seq)
    broker.deliveries.hold(ref, "w", 1234.5)  # (eMQP's timeout:N)
    assert broker.deliveries.deadline_of("w")(ref) == 1234.5 and broker.deliveries.holder(ref) == "w"
    assert broker.account("client").in_flight() == 1000, "its bytes are still its payer's"
    assert broker.expire(1234.0) == 0 and broker.expire(1235.0) == 1
    assert broker.account("client").in_flight() == 0
