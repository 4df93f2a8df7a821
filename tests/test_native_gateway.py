"""The native PZQ rules without a socket: NativeGateway fed frames, on a real store and an injected clock.

What the server loop does around a turn is done here by hand: the gateway's sends are what would leave
after the commit; a failed turn is ``store.abort()``, ``broker.reset()``, ``gateway.recover()`` and then
``gateway.rolled_back(...)``, in the order the server calls them.
"""

from __future__ import annotations

import msgpack
import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.credit import HOARD
from pzq.errors import StoreError
from pzq.gateways.contract import FramesGateway, Send
from pzq.gateways.native import CONSUMER, RECEIVE, SEND, NativeGateway, ref_of_key
from pzq.protocols import native
from pzq.store import Store

T0 = 1_700_000_000_000_000  # a wall-clock µs timestamp
TIMEOUT_US = 5_000_000


def make(store: Store, *, max_inflight: int = 10) -> NativeGateway:
    broker = Broker(store, ack_timeout_s=TIMEOUT_US / 1e6)
    store.queue("q")
    return NativeGateway(
        broker, queue="q", max_message_size=1 << 20, max_inflight=max_inflight, ack_timeout_s=TIMEOUT_US / 1e6
    )


@pytest.fixture
def gateway(store) -> NativeGateway:
    return make(store)


def produced(peer: bytes, message_id: bytes, *body: bytes) -> list[bytes]:
    """A producer's message as the receive ROUTER reads it (routing frame first)."""
    return [peer, *native.produce(message_id, body)]


def acks(sends: list[Send]) -> list[tuple[bytes, bytes, bool, str]]:
    """(peer, message id, stored, error) of each producer ack, in order."""
    out = []
    for send in sends:
        assert send.socket == RECEIVE
        ack = native.parse_produce_ack(send.frames[1:])
        assert ack is not None
        out.append((send.peer, ack.message_id, ack.ok, ack.error))
    return out


def bodies(store: Store) -> list[list[bytes]]:
    return [m.frames for m in store.scan("q")]


def answer(gateway: NativeGateway, delivery: Send, ok: bool = True, *, now: float = 0.0) -> None:
    assert gateway.received_many(SEND, [native.consumer_ack(delivery.frames[0], ok)], now=Now(now, T0)) == []


def someone_else_stores_the_seq_after_next(store: Store) -> None:
    """Make the store's second write of queue ``q`` fail as it would with a second writer on the file
    (a real StoreError, raised by the store itself, which rolls the turn back)."""
    from pzq.store.layout import KEY as _KEY

    info = store.queue("q")
    store.commit()
    txn = store.env.write()  # (committed without the store's knowledge, as another process would)
    txn.put(_KEY.pack(info.qid, info.next_seq + 1), msgpack.packb([5, 0, [b"theirs"]]), db=store._messages_db)
    store.env.commit()


def test_the_native_gateway_offers_the_frames_contract(gateway):
    assert isinstance(gateway, FramesGateway)


def test_a_producer_run_is_stored_in_order_and_acked_in_order(gateway, store):
    run = [produced(b"p1", b"m1", b"a"), produced(b"p2", b"m2", b"b", b"b2"), produced(b"p1", b"m3", b"c")]
    sent = gateway.received_many(RECEIVE, run, now=Now(0.0, T0))
    assert acks(sent) == [(b"p1", b"m1", True, ""), (b"p2", b"m2", True, ""), (b"p1", b"m3", True, "")]
    assert bodies(store) == [[b"a"], [b"b", b"b2"], [b"c"]]
    assert store.dirty, "stored in the turn: the acks leave only once the loop has committed it"


def test_one_message_is_a_run_of_one(gateway, store):
    sent = gateway.received(RECEIVE, produced(b"p", b"m", b"x"), now=Now(0.0, T0), user=None)
    assert acks(sent) == [(b"p", b"m", True, "")]


def test_a_rejected_message_in_the_middle_of_a_run_is_answered_in_its_place(gateway, store):
    run = [
        produced(b"p", b"m1", b"a"),
        [b"p", b"m2", b"no delimiter"],
        [b"p"],  # (no id frame: nobody to answer)
        [b"p", b"m3", b""],  # a delimiter and no body
        produced(b"p", b"m4", b"d"),
    ]
    sent = gateway.received_many(RECEIVE, run, now=Now(0.0, T0))
    assert acks(sent) == [
        (b"p", b"m1", True, ""),
        (b"p", b"m2", False, native.NO_DELIMITER),
        (b"p", b"m3", False, native.EMPTY_MESSAGE),
        (b"p", b"m4", True, ""),
    ]
    assert bodies(store) == [[b"a"], [b"d"]]


def test_a_run_past_the_store_limit_is_stored_as_a_prefix_and_the_rest_hears_queue_full(tmp_path):
    store = Store(tmp_path / "small", max_size=8192)
    try:
        gateway = make(store)
        run = [produced(b"p", b"m%d" % i, b"x" * 500) for i in range(40)]
        said = acks(gateway.received_many(RECEIVE, run, now=Now(0.0, T0)))
        stored = [ok for _, _, ok, _ in said]
        n = stored.count(True)
        assert 0 < n < 40 and stored == [True] * n + [False] * (40 - n), "a prefix is stored, the rest refused"
        assert {error for _, _, ok, error in said if not ok} == {native.QUEUE_FULL}
        assert [mid for _, mid, _, _ in said] == [b"m%d" % i for i in range(40)]
        assert len(bodies(store)) == n
    finally:
        store.close()


def test_a_rolled_back_turn_answers_store_failed_and_confirms_nothing(gateway, store):
    someone_else_stores_the_seq_after_next(store)
    first = gateway.received_many(RECEIVE, [produced(b"p1", b"m1", b"a")], now=Now(0.0, T0))
    assert acks(first) == [(b"p1", b"m1", True, "")]
    with pytest.raises(StoreError):
        gateway.received_many(
            RECEIVE,
            [produced(b"p2", b"m2", b"b"), [b"p2", b"m3", b"bad"], produced(b"p1", b"m4", b"c")],
            now=Now(0.0, T0),
        )
    store.abort()
    gateway.broker.reset()
    gateway.recover()
    said = acks(gateway.rolled_back(first))
    assert said == [
        (b"p1", b"m1", False, native.STORE_FAILED),
        (b"p2", b"m2", False, native.STORE_FAILED),
        (b"p2", b"m3", False, native.NO_DELIMITER),
        (b"p1", b"m4", False, native.STORE_FAILED),
    ]
    assert store.queue("q").count == 0 and not {b"a", b"b", b"c"} & {f for m in bodies(store) for f in m}, (
        "nothing of the turn was stored"
    )
    assert gateway.rolled_back([]) == [], "what was owed is said once"


def test_deliveries_of_a_rolled_back_turn_are_dropped(gateway, store):
    gateway.broker.produce("q", [b"a"], now_us=T0)
    [delivery] = gateway.dispatch(now=Now(0.0, T0))
    assert gateway.rolled_back([delivery]) == []


def test_a_delivery_carries_the_pzq_frames_and_no_routing_frame(gateway):
    message = gateway.broker.produce("q", [b"body", b"part"], now_us=T0)
    [delivery] = gateway.dispatch(now=Now(0.0, T0 + 7))
    assert delivery.socket == SEND and delivery.token == (message.qid, message.seq)
    got = native.parse_delivery(delivery.frames)
    assert got == native.Delivered(native.message_key(T0, message.id), T0 + 7, TIMEOUT_US, [b"body", b"part"])
    assert ref_of_key(got.key) == (message.qid, message.seq)


def test_a_consumer_acks_and_nacks_only_what_the_send_socket_holds(store):
    gateway = make(store, max_inflight=2)  # (two go out: the third is left for another consumer)
    broker = gateway.broker
    broker.produce_many("q", [[b"a"], [b"b"], [b"c"]], now_us=T0)
    first, second = gateway.dispatch(now=Now(0.0, T0))
    [elsewhere] = broker.take("q", 1, "another gateway's consumer", now=Now(0.0, T0))
    other_key = native.message_key(elsewhere.enqueued_us, elsewhere.id)
    gateway.received_many(
        SEND,
        [
            native.consumer_ack(first.frames[0]),
            native.consumer_ack(other_key),  # not ours: ignored
            native.consumer_ack(other_key, ok=False),  # nor this
            [b"short"],
            native.consumer_ack(b"0000000000000001|not-a-key"),
            native.consumer_ack(second.frames[0], ok=False),
        ],
        now=Now(0.1, T0),
    )
    assert [m.frames for m in store.scan("q")] == [[b"b"], [b"c"]], "the ack deleted only ours"
    assert broker.holder_of((elsewhere.qid, elsewhere.seq)) == "another gateway's consumer"
    assert broker.held_count(CONSUMER) == 0 and broker.ready_count("q") == 1, "the nack put ours back"
    assert broker.counters.refused_not_held == 2


def test_an_ack_then_a_nack_of_one_delivery_in_a_run_settle_in_order(gateway, store):
    gateway.broker.produce("q", [b"a"], now_us=T0)
    [delivery] = gateway.dispatch(now=Now(0.0, T0))
    key = delivery.frames[0]
    gateway.received_many(SEND, [native.consumer_ack(key), native.consumer_ack(key, ok=False)], now=Now(0.1, T0))
    assert bodies(store) == [], "the ack came first: the nack finds nothing to put back"


def test_a_lone_consumer_that_answers_nothing_gets_at_most_max_inflight(store):
    gateway = make(store, max_inflight=3)
    gateway.broker.produce_many("q", [[b"%d" % i] for i in range(10)], now_us=T0)
    assert len(gateway.dispatch(now=Now(0.0, T0))) == 3
    assert gateway.dispatch(now=Now(1.0, T0)) == [], "nobody answers: one plain pool, however old"
    assert not gateway.would_send(1.0)
    assert len(gateway.dispatch(now=Now(6.0, T0))) == 0, "(the ack timeout is the broker's: expire first)"
    assert gateway.broker.expire(5.0) == 3
    assert len(gateway.dispatch(now=Now(6.0, T0))) == 3


def test_a_delivery_nobody_answers_stops_blocking_once_a_later_one_is_answered_or_it_is_old(store):
    gateway = make(store, max_inflight=2)
    gateway.broker.produce_many("q", [[b"%d" % i] for i in range(10)], now_us=T0)
    kept, answered = gateway.dispatch(now=Now(0.0, T0))
    answer(gateway, answered, now=0.01)  # answered before ``kept``: ``kept`` is passed, it blocks nothing
    third, fourth = gateway.dispatch(now=Now(0.02, T0))
    assert gateway.broker.deadline(kept.token, CONSUMER) is not None, "it is still in flight, its ack counts"
    assert gateway.dispatch(now=Now(0.03, T0)) == [], "two young deliveries nobody passed still count"
    answer(gateway, kept, now=0.1)  # (a late answer passes nothing newer, but says someone answers)
    assert len(gateway.dispatch(now=Now(0.1, T0))) == 2, "the unanswered ones are old: they block nothing"
    assert gateway.broker.deadline(third.token, CONSUMER) is not None
    assert gateway.next_wake(0.1) is not None, "credit comes back when young deliveries age: wake then"


def test_a_late_consumers_answers_do_not_stretch_the_window_of_the_prompt_ones(store):
    gateway = make(store, max_inflight=1000)
    gateway.broker.produce_many("q", [[b"%d" % i] for i in range(4000)], now_us=T0)
    now = 0.0
    for _ in range(20):  # the DEALER hands them out in turn: every other one to a consumer 4 s late
        now += 0.1
        sent = gateway.dispatch(now=Now(now, T0))[:200]
        for i, delivery in enumerate(sent):
            answer(gateway, delivery, now=now + (4.0 if i % 2 else 0.001))
    assert gateway.credit.window_s < 0.1, "half the answers are prompt: the window is theirs"


def test_consumers_holding_too_much_together_lose_the_oldest_early_and_a_late_ack_still_counts(store):
    gateway = make(store, max_inflight=2)
    broker = gateway.broker
    broker.produce_many("q", [[b"%d" % i] for i in range(HOARD * 16)], now_us=T0)
    hoarded: list[Send] = []
    now = 0.0
    for step in range(HOARD * 16):  # one hoarding consumer takes one delivery every other turn; another acks
        now += 0.03
        for i, delivery in enumerate(gateway.dispatch(now=Now(now, T0))):
            if i == 0 and step % 2 == 0:
                hoarded.append(delivery)
            else:
                answer(gateway, delivery, now=now + 0.001)
        if gateway.taken_back_total:
            break
    assert gateway.taken_back_total == 1 and gateway.stats()["taken_back_total"] == 1
    assert broker.held_count(CONSUMER) <= HOARD * 2 - 2
    oldest = hoarded[0]
    assert broker.deadline(oldest.token, CONSUMER) is None, "the oldest went back to the queue"
    assert broker.deadline(hoarded[1].token, CONSUMER) is not None
    answer(gateway, oldest, now=now)
    assert broker.stored(oldest.token) is None, "its holder's late ack still deletes it"


def test_a_delivery_the_send_socket_would_not_take_is_ready_again(gateway, store):
    broker = gateway.broker
    message = broker.produce("q", [b"a"], now_us=T0)
    [delivery] = gateway.dispatch(now=Now(0.0, T0))
    assert gateway.unsent(delivery) is False
    assert broker.ready_count("q") == 1 and broker.held_count(CONSUMER) == 0
    assert store.get("q", message.seq).deliveries == 0, "a delivery that never left is not counted"
    [again] = gateway.dispatch(now=Now(0.0, T0 + 1))
    assert again.frames[0] == delivery.frames[0], "the same key"
    reply = Send(RECEIVE, native.produce_ack(b"p", b"m"))
    assert gateway.unsent_many([again, reply]) == [reply], "a reply is kept for later, a delivery taken back"
    assert broker.ready_count("q") == 1


def test_nothing_is_taken_while_the_send_socket_is_blocked(gateway):
    gateway.broker.produce("q", [b"a"], now_us=T0)
    assert gateway.would_send(0.0)
    assert gateway.dispatch(now=Now(0.0, T0), blocked=frozenset({SEND})) == []
    assert gateway.broker.ready_count("q") == 1


def test_after_a_take_found_nothing_it_waits_for_the_broker_to_say_messages_are_ready(gateway):
    broker = gateway.broker
    assert gateway.dispatch(now=Now(0.0, T0)) == []
    assert not gateway.would_send(0.0)
    dead = broker.produce("q", [b"a"], now_us=T0, meta={"max_deliveries": 1})
    assert gateway.would_send(0.0)
    [delivery] = gateway.dispatch(now=Now(0.0, T0))
    answer(gateway, delivery, ok=False)  # back once, then over its cap: a take finds only a dead letter
    assert gateway.dispatch(now=Now(0.0, T0)) == [] and not gateway.would_send(0.0)
    assert broker.requeue_dead("q", None) and gateway.would_send(0.0), "requeued letters are ready for it"
    assert broker.stored((dead.qid, dead.seq)) is None


def test_a_recovered_gateway_forgets_its_young_deliveries(gateway):
    gateway.broker.produce("q", [b"a"], now_us=T0)
    gateway.dispatch(now=Now(0.0, T0))
    assert gateway.stats()["young_deliveries"] == 1
    gateway.broker.reset()
    gateway.recover()
    assert gateway.stats()["young_deliveries"] == 0 and gateway.clients(0.0, 10) == []


@pytest.mark.parametrize("repeat", [True, False], ids=["ack-ack", "ack-nack"])
def test_a_repeated_answer_in_one_run_counts_once_toward_the_consumers_latency(store, repeat):
    def latency_after(answers: int) -> float:
        gateway = make(store)
        gateway.broker.produce("q", [b"m"], now_us=T0)
        [delivery] = gateway.dispatch(now=Now(0.0, T0))
        key = delivery.frames[0]
        run = [native.consumer_ack(key), native.consumer_ack(key, ok=repeat)][:answers]
        gateway.received_many(SEND, run, now=Now(1.0, T0))
        store.abort()  # (the next gateway starts from the same stored message)
        gateway.broker.reset()
        return gateway.credit.latency_s

    assert latency_after(2) == latency_after(1), "a repeat of an answer is not a second sample"


def test_a_consumer_that_answers_newest_first_holds_no_more_than_the_cap(store):
    # Each answer passes every delivery sent before it: a hostile consumer answering only the newest of
    # each run is credited anew each turn, and what it holds is still bounded (the oldest go back early).
    gateway = make(store, max_inflight=4)
    gateway.broker.produce_many("q", [[b"%d" % i] for i in range(500)], now_us=T0)
    most, now = 0, 0.0
    for _ in range(100):
        now += 0.01
        sent = gateway.dispatch(now=Now(now, T0))
        if sent:
            answer(gateway, sent[-1], now=now)
        most = max(most, gateway.broker.held_count(CONSUMER))
    assert gateway.taken_back_total > 0 and most <= HOARD * 4


def test_a_run_of_edge_shapes_is_answered_as_parse_produce_answers_each(store):
    """The usual shape is read without parse_produce; every edge of it must still get parse_produce's answer."""
    gateway = NativeGateway(
        Broker(store, ack_timeout_s=5.0), queue="q", max_message_size=4, max_inflight=10, ack_timeout_s=5.0
    )
    run = [
        produced(b"p", b"m1", b"abcd"),  # exactly the limit: stored
        produced(b"p", b"m2", b"ab", b"cde"),  # over it, summed over frames
        [b"p", b"x" * native.MAX_ID, b"", b"a"],  # the longest id: stored
        [b"p", b"y" * (native.MAX_ID + 1), b"", b"a"],  # one byte more: refused, its id cut
        [b"p", b"m5", b"header", b"", b"a"],  # a header frame before the delimiter
        [b"p", b"m6", b"", b"", b""],  # empty body frames are a body
    ]
    expected = []
    for frames in run:
        event = native.parse_produce(frames, 4)
        if isinstance(event, native.Rejected):
            expected.append((b"p", event.message_id, False, event.error.detail))
        else:
            expected.append((b"p", event.message_id, True, ""))
    assert acks(gateway.received_many(RECEIVE, run, now=Now(0.0, T0))) == expected
    assert [ok for _, _, ok, _ in expected] == [True, False, True, False, True, True]
    assert bodies(store) == [[b"abcd"], [b"a"], [b"a"], [b"", b""]]


@pytest.mark.parametrize(
    "key",
    [
        b"0000000000000000|" + b"0" * 15 + b"1" + b"0" * 15 + b"G",  # not hex
        b"0000000000000000|" + b"0" * 15 + b"1" + b"0" * 15 + b"A",  # upper case: not a key pzq made
        b"0000000000000000|" + b"0" * 15 + b"1" + b"0" * 14 + b"_1",  # int() would take the underscore
        b"0000000000000000|" + b"0" * 15 + b"1" + b"0" * 14 + b" 1",
        b"0000000000000000|" + b"0" * 15 + b"1" + b"0" * 15,  # one digit short
        b"0000000000000000-" + b"0" * 15 + b"1" + b"0" * 15 + b"1",  # no bar
    ],
)
def test_a_key_pzq_did_not_make_names_no_message(key):
    assert ref_of_key(key) is None


def test_a_key_names_its_queue_and_seq_at_the_edges_of_their_range():
    big = (1 << 64) - 1
    for qid, seq in [(1, 1), (big, big), (0, big), (big, 0)]:
        assert ref_of_key(native.message_key(T0, f"{qid:016x}{seq:016x}")) == (qid, seq)


def test_a_consumer_that_acks_every_delivery_late_within_its_timeout_loses_none_early_and_the_prompt_one_gets_half(
    store,
):
    # The DEALER hands the two consumers a delivery each in turn; the late one acks each 4 s later (under the
    # 5 s ack timeout), 1,000 a second: it holds 4,000, under the cap (64 x 100), so nothing of it goes back
    # early to be delivered again and its late ack refused (at 16 x it was, a third of its deliveries)
    gateway = make(store, max_inflight=100)
    gateway.broker.produce_many("q", [[b"m"]] * 15_000, now_us=T0)
    later: list[tuple[float, Send]] = []
    prompt = late = 0
    now, turn = 0.0, 0
    while now < 6.0:
        now, turn = now + 0.001, turn + 1
        while later and later[0][0] <= now:
            answer(gateway, later.pop(0)[1], now=now)
        for i, delivery in enumerate(gateway.dispatch(now=Now(now, T0), most=2)):
            if (turn + i) % 2:
                later.append((now + 4.0, delivery))
                late += 1
            else:
                answer(gateway, delivery, now=now)
                prompt += 1
    assert gateway.taken_back_total == 0
    assert prompt >= 5_900 and late >= 5_900, (prompt, late)
