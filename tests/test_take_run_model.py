"""A hostile mix of records taken by a batched consumer (Broker.take_run) against the same operations
through ``take``: plain native/API records and big bodies in chunks beside TTLs (passed and not), meta
with a delivery cap, acks of part of a run, nacks, timeouts and a consumer that leaves. Same deliveries,
delivery counts and dead letters, in the same order, on two stores driven alike."""

from __future__ import annotations

import random

import pytest

from pzq.broker import Broker
from pzq.clock import Now
from pzq.store import Store

T0 = 1_700_000_000_000_000


def _state(broker: Broker, store: Store) -> tuple:
    stored = [(m.seq, m.frames, m.deliveries) for m in store.scan("q", 0, 10_000)]
    dead = (
        [(d.message.seq, d.message.deliveries, d.reason) for d in store.dead_letters.read("q", 0, 10_000)]
        if store.queue("q", create=False)
        else []
    )
    return stored, dead, len(broker.inflight)


@pytest.mark.parametrize("seed", range(12))
def test_take_run_hands_out_counts_and_dead_letters_exactly_as_take_does_whatever_the_records(tmp_path, seed):
    rng = random.Random(seed)
    stores = [Store(tmp_path / name, max_size=64 << 20) for name in ("run", "take")]
    brokers = [Broker(store, ack_timeout_s=5.0) for store in stores]
    now, now_us = 100.0, T0
    held: dict[str, list] = {"a": [], "b": []}  # refs each consumer holds (the same on both sides)
    try:
        for _step in range(120):
            op = rng.random()
            if op < 0.35:  # a run of producers' messages: plain (native, batch, API), TTLs, meta with a cap
                kinds = [
                    rng.choice(["plain", "plain", "encoded", "ttl-past", "ttl-later", "cap", "emqp", "chunked"])
                    for _ in range(rng.randint(1, 8))
                ]
                for broker in brokers:
                    for i, kind in enumerate(kinds):
                        body = [b"m%d" % i, b"x" * (i % 4)]
                        if kind == "plain":
                            broker.produce_many("q", [body], now_us=now_us)
                        elif kind == "encoded":
                            broker.produce_many("q", [b"\x92\xc4\x01e\xc4\x00"], now_us=now_us, encoded=True)
                        elif kind == "ttl-past":
                            broker.produce("q", body, now_us=now_us, expires_us=now_us + 1_000)
                        elif kind == "ttl-later":
                            broker.produce("q", body, now_us=now_us, expires_us=now_us + 60_000_000)
                        elif kind == "chunked":  # (a big body, written in parts: its record names them)
                            upload = broker.begin_big([b"c%d" % i, b"y" * 300], 64)
                            while not upload.done:
                                broker.write_big(upload, 64)
                            broker.produce_big("q", upload, now_us=now_us)
                        elif kind == "cap":
                            broker.produce("q", body, now_us=now_us, meta={"max_deliveries": 2})
                        else:
                            broker.produce("q", body, now_us=now_us, meta={"client": "c", "msgid": "1"})
            elif op < 0.6:  # a take of up to n by one consumer
                who, n = rng.choice("ab"), rng.randint(1, 12)
                got_run = brokers[0].take_run("q", n, who, now=Now(now, now_us))
                got_take = brokers[1].take("q", n, who, now=Now(now, now_us))
                assert [(ref, frames) for ref, _, frames in got_run] == [((m.qid, m.seq), m.frames) for m in got_take]
                held[who] += [ref for ref, _, _ in got_run]
            elif op < 0.75:  # acks of part of what was taken (and a key named twice, and one never given)
                who = rng.choice("ab")
                if held[who]:
                    part = rng.sample(held[who], rng.randint(1, len(held[who])))
                    extra = [part[0], (99, 1)]
                    outs = [broker.ack_many(part + extra, by=who) for broker in brokers]
                    assert outs[0] == outs[1]
                    held[who] = [r for r in held[who] if r not in part]
            elif op < 0.85:  # nacks
                who = rng.choice("ab")
                if held[who]:
                    ref = held[who].pop(rng.randrange(len(held[who])))
                    assert brokers[0].nack(ref, by=who) == brokers[1].nack(ref, by=who)
            elif op < 0.93:  # time passes: TTLs and ack timeouts run out
                now += rng.choice([0.5, 3.0, 6.0])
                now_us += rng.choice([500, 2_000_000, 70_000_000])
                assert brokers[0].expire(now) == brokers[1].expire(now)
                for who in held:
                    held[who] = [r for r in held[who] if r in brokers[1].inflight]
            else:  # a consumer leaves
                who = rng.choice("ab")
                assert brokers[0].consumer_gone(who) == brokers[1].consumer_gone(who)
                held[who] = []
            assert _state(brokers[0], stores[0]) == _state(brokers[1], stores[1])
    finally:
        for store in stores:
            store.close()
