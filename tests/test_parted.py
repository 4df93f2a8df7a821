"""The parted path of every door but native (pzq/gateways/parted.py) on a real store and broker: a big
message is written a turn's bytes at a time and answered with its last part, what its owner sent after
it waits behind it in order while other owners go on, a refusal or a failed turn answers it and leaves
nothing of it, and what may wait is bounded per owner and in all."""

from __future__ import annotations

import hashlib
import os

import msgpack
import pytest

from pzq.broker import Broker
from pzq.config import Limits
from pzq.endpoints.base import TurnBudget
from pzq.gateways.contract import Send
from pzq.gateways.parted import Big, Parted
from pzq.store import Store

KIB = 1 << 10
LIMITS = Limits(body_chunk_bytes=64 * KIB, turn_write_bytes=128 * KIB, pipe_in_bytes=1 << 20)


@pytest.fixture
def broker(store) -> Broker:
    return Broker(store, ack_timeout_s=60.0, limits=LIMITS)


def turn(parts: Parted, store: Store, now_us: int = 1) -> list[Send]:
    """One turn of the endpoint: the parted step within a turn's bytes, then the commit."""
    out = parts.step(TurnBudget(float("inf"), LIMITS.turn_write_bytes, LIMITS.turn_records), now_us)
    store.commit()
    parts.flushed()
    return out


def answer(text: str) -> Send:
    return Send("", [b"peer", text.encode()])


def big(broker: Broker, queue: str, log: list[str], name: str, **extra) -> Big:
    def finish(upload, now_us: int) -> list[Send]:
        broker.produce_big(queue, upload, now_us=now_us)
        log.append(name)
        return [answer(f"stored {name}")]

    def refused(reason: str) -> list[Send]:
        return [answer(f"refused {name}: {reason}")]

    return Big(finish, refused, lambda: [answer(f"failed {name}")], **extra)


def small(broker: Broker, queue: str, body: bytes, log: list[str], name: str):
    def act(now_us: int) -> list[Send]:
        broker.produce(queue, [body], now_us=now_us)
        log.append(name)
        return [answer(f"stored {name}")]

    return act


def stored_bodies(broker: Broker, queue: str) -> list[bytes]:
    return [b"".join(m.frames) for m in broker.peek(queue, 0, 100)]


def test_a_big_message_is_written_a_turns_bytes_at_a_time_and_answered_with_its_last_part(broker, store):
    parts, log = Parted(broker, LIMITS), []
    body = os.urandom(600 * KIB)  # ten chunks: five turns of 128 KiB
    parts.write("a", [body], big(broker, "q", log, "big"))
    answers, turns = [], 0
    while not answers and turns < 10:
        turns += 1
        answers = turn(parts, store)
        assert parts.writing is False  # (flushed: set again by the next part)
        if not answers:
            assert broker.queue_info("q") is None or broker.queue_info("q").count == 0, "stored before its last part"
    assert turns == 5 and answers == [answer("stored big")]
    assert stored_bodies(broker, "q") == [body] and not parts.pending and parts.held_bytes == 0


def test_what_an_owner_sends_after_its_big_message_waits_behind_it_in_order_and_others_do_not(broker, store):
    parts, log = Parted(broker, LIMITS), []
    body = os.urandom(300 * KIB)
    parts.write("a", [body], big(broker, "q", log, "a-big"))
    assert parts.busy("a") and not parts.busy("b")
    assert parts.after("a", small(broker, "q", b"a-1", log, "a-1"), 3, now_us=1) == []  # (kept)
    assert parts.after("a", small(broker, "q", b"a-2", log, "a-2"), 3, now_us=1) == []
    assert parts.after("b", small(broker, "q", b"b-1", log, "b-1"), 3, now_us=1) == [answer("stored b-1")]
    assert parts.behind_of("a") == 6 and parts.held_of("a") == 300 * KIB + 6
    answers = []
    while parts.pending:
        answers += turn(parts, store)
    assert log == ["b-1", "a-big", "a-1", "a-2"]
    assert answers == [answer("stored a-big"), answer("stored a-1"), answer("stored a-2")]
    assert stored_bodies(broker, "q") == [b"b-1", body, b"a-1", b"a-2"]
    assert not parts.busy("a") and parts.held_bytes == 0 and parts.settled() >= {"a"}


def test_a_big_message_behind_another_waits_for_it_and_holds_back_what_came_after_it(broker, store):
    parts, log = Parted(broker, LIMITS), []
    first, second = os.urandom(200 * KIB), os.urandom(200 * KIB)

    def write_second(now_us: int) -> list[Send]:
        parts.write("a", [second], big(broker, "q", log, "second"))
        return []

    parts.write("a", [first], big(broker, "q", log, "first"))
    parts.after("a", write_second, len(second), now_us=1)
    parts.after("a", small(broker, "q", b"last", log, "last"), 4, now_us=1)
    while parts.pending:
        turn(parts, store)
    assert log == ["first", "second", "last"]
    assert stored_bodies(broker, "q") == [first, second, b"last"]


def test_a_big_message_the_store_has_no_room_for_is_refused_and_leaves_nothing(tmp_path):
    store = Store(tmp_path / "db", max_size=1 << 20)
    try:
        broker = Broker(store, ack_timeout_s=60.0, limits=LIMITS)
        parts, log = Parted(broker, LIMITS), []
        parts.write("a", [os.urandom(2 << 20)], big(broker, "q", log, "big"))
        answers = turn(parts, store)
        assert len(answers) == 1 and answers[0].frames[1].startswith(b"refused big: queue full")
        assert log == [] and not parts.pending and parts.held_bytes == 0 and parts.refused_total == 1
        small_one = small(broker, "q", b"fits", log, "small")
        assert parts.after("a", small_one, 4, now_us=1) == [answer("stored small")], "the owner goes on at once"
    finally:
        store.close()


def test_a_failed_turn_fails_the_message_it_wrote_parts_of_and_what_waited_behind_it_goes_on(broker, store):
    parts, log = Parted(broker, LIMITS), []
    parts.write("a", [os.urandom(300 * KIB)], big(broker, "q", log, "lost"))
    parts.after("a", small(broker, "q", b"after", log, "after"), 5, now_us=1)
    turn(parts, store)  # (a part committed)
    parts.step(TurnBudget(float("inf"), LIMITS.turn_write_bytes), 1)  # (the next part's turn fails)
    store.abort()
    broker.reset()
    assert parts.rolled_back() == [answer("failed lost")] and parts.writing is False
    answers = []
    while parts.pending:
        answers += turn(parts, store)
    assert answers == [answer("stored after")] and stored_bodies(broker, "q") == [b"after"]
    with store.env.snapshot() as txn:  # (the parts the failed message left went with the next commit)
        assert txn.stat(store.env.dbs["bodies"])["entries"] == 0 and txn.stat(store.env.dbs["uploads"])["entries"] == 0


def test_behind_its_big_message_an_owner_may_keep_its_part_of_the_bound_and_all_of_them_the_bound(broker):
    parts = Parted(broker, LIMITS)  # (pipe_in_bytes 1 MiB: a quarter of it behind each owner's big message)
    assert parts.room("a", 600 * KIB), "an owner that holds nothing may have one, under the bound"
    parts.write("a", [b"x" * (600 * KIB)], Big(lambda u, n: [], lambda r: [], list))
    assert parts.room("a", 256 * KIB) and not parts.room("a", 256 * KIB + 1), "its part, behind its big one"
    parts.after("a", lambda now_us: [], 200 * KIB, now_us=1)
    assert not parts.room("a", 57 * KIB) and parts.room("a", 56 * KIB)
    assert parts.room("b", 224 * KIB) and not parts.room("b", 224 * KIB + 1), "the bound is shared"
    assert not parts.full
    parts.write("b", [b"y" * (424 * KIB)], Big(lambda u, n: [], lambda r: [], list))
    assert parts.full and parts.bodies_bytes == 1 << 20


def test_each_part_is_shown_once_in_order_so_that_a_digest_is_taken_a_part_at_a_time(broker, store):
    parts, seen = Parted(broker, LIMITS), hashlib.blake2b(digest_size=16)
    body = os.urandom(333 * KIB + 7)
    parts.write("a", [body], big(broker, "q", [], "big", each=seen.update))
    while parts.pending:
        turn(parts, store)
    assert seen.digest() == hashlib.blake2b(body, digest_size=16).digest()


def test_the_api_digest_of_a_big_message_taken_in_parts_is_the_digest_of_its_whole_request():
    from pzq.gateways.api import _packed_head

    for queue, size in (("q", 70_000), ("é" * 100, 1 << 20), ("x" * 255, (16 << 20) + 3)):
        body = b"\x00" * size
        assert _packed_head(queue, size) + body == msgpack.packb([(queue, body)])
