"""The life of a delivery as pzq/broker/state.py's transition table states it: every row is driven on
a real store, and the message ends in the state the row names; every verb and every part the table
names exists, so the table cannot drift from the code unseen."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

import pzq.broker.state
from pzq.broker import Broker, Exclusive, handing, implicit, produce, questions, queues, ranges, settle
from pzq.clock import Now
from pzq.store import Store

T0 = 1_700_000_000_000_000  # a wall-clock µs timestamp
GROUP = Exclusive("g")
Ref = tuple[int, int]

_PARTS = {m.__name__.rsplit(".", 1)[1]: m for m in (handing, implicit, produce, questions, queues, ranges, settle)}


def _table() -> list[tuple[str, str, str, str]]:
    """The rows of the table in state.py's docstring: (from, event, to, by)."""
    doc = pzq.broker.state.__doc__ or ""
    block = doc[doc.index("    from           event") :].split("\n\n")[0].splitlines()[1:]
    return [tuple(re.split(r"\s{2,}", line.strip())) for line in block]  # type: ignore[misc]


ROWS = _table()


def _verbs(event: str) -> list[str]:
    return [verb.strip() for verb in re.sub(r"\[.*\]", "", event).split(",")]


def _class_named(name: str) -> type:
    if name in ("BrokerState", "Broker"):
        return {"BrokerState": pzq.broker.state.BrokerState, "Broker": Broker}[name]
    for module in _PARTS.values():
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(name)


def test_the_table_has_its_rows():
    assert len(ROWS) >= 20 and all(len(row) == 4 for row in ROWS), ROWS


def test_every_verb_and_part_the_table_names_exists(store):
    broker = Broker(store, ack_timeout_s=10.0)
    for _, event, _, by in ROWS:
        for verb in _verbs(event):
            assert callable(getattr(broker, verb, None)), f"Broker offers no {verb!r}"
        cls, _, method = by.split(" (")[0].partition(".")
        assert not method or callable(getattr(_class_named(cls), method, None)), f"no {by}"


# -- the rows, driven: each scenario brings a message to the row's "from" state, fires the event,
# and returns the state the message is in then (of the new message where the event makes one)


class Life:
    def __init__(self, store: Store):
        self.store = store
        self.broker = Broker(store, ack_timeout_s=10.0)
        self.acked = 0

    def ready(self, body: bytes = b"m", **kw) -> Ref:
        message = self.broker.produce("q", [body], now_us=T0, **kw)
        return message.qid, message.seq

    def in_flight(self, holder: str = "c1") -> Ref:
        self.ready()
        m = self.broker.take("q", 1, holder, now=Now(0.0, T0))[0]
        return m.qid, m.seq

    def late(self) -> Ref:
        ref = self.in_flight()
        assert self.broker.expire(100.0) == 1
        return ref

    def held(self) -> Ref:
        ref = self.ready()
        [(lo, count, _)] = self.broker.take_ranges("q", 1, GROUP, now_us=T0)
        assert (lo, count) == (ref[1], 1)
        return ref

    def dead(self) -> Ref:
        ref = self.in_flight()
        assert self.broker.dead_letter(ref, "test", by="c1", now_us=T0)
        return ref

    def state_of(self, ref: Ref, last: str = "c1") -> str:
        b = self.broker
        if b.queue_info("q") is None:
            return "dropped"
        if b.holder_of(ref) is not None:
            return "IN FLIGHT" if b.in_flight_to(ref) is not None else "HELD"
        if b.stored(ref) is not None:
            return "READY, late" if b.holds(ref, last) else "READY"
        if any(d.message.seq == ref[1] for d in self.store.dead_letters.read("q", 0, 100)):
            return "dead-lettered"
        if b.counters.acked > self.acked:
            return "settled"
        newer = b.peek("q", ref[1] + 1, 10)
        return "moved" if newer else "dropped"

    def new_ref(self) -> Ref:
        [m] = self.broker.peek("q", 0, 1)
        return m.qid, m.seq


def _produce(life: Life, verb: str) -> str:
    b = life.broker
    if verb == "produce":
        return life.state_of(life.ready())
    if verb == "produce_many":
        assert b.produce_many("q", [[b"m"]], now_us=T0) == 1
    else:
        upload = b.begin_big([b"m" * 10], 4)
        while b.write_big(upload, 4):
            pass
        b.produce_big("q", upload, now_us=T0)
    return life.state_of(life.new_ref())


def _from_ready(life: Life, verb: str, note: str) -> str:
    b = life.broker
    if "TTL" in note:
        ref = life.ready(expires_us=T0 - 1)
        assert b.take("q", 1, "c1", now=Now(0.0, T0)) == []
        return life.state_of(ref)
    ref = life.ready()
    if verb in ("take", "take_run"):
        assert len(getattr(b, verb)("q", 1, "c1", now=Now(0.0, T0))) == 1
    elif verb == "take_columns":
        assert b.take_columns("q", 1, "c1", now=Now(0.0, T0)).refs == [ref]
    elif verb == "take_ranges":
        assert b.take_ranges("q", 1, GROUP, now_us=T0)
    elif verb == "hold_range":
        b.hold_range(ref[0], ref[1], ref[1] + 1, GROUP)
    elif verb == "hold":
        b.hold(ref, "c1")
    elif verb == "purge":
        assert b.purge("q", 0, 1 << 40, 100)[0] == 1
    return life.state_of(ref)


def _from_in_flight(life: Life, verb: str, note: str) -> str:
    b = life.broker
    if verb == "rolled_back":
        kept = "kept" in note
        b.redo_on_rollback("native")
        life.ready()
        life.store.commit()
        b.turn_begins()
        m = b.take("q", 1, "native" if kept else "c1", now=Now(0.0, T0))[0]
        if kept:  # (it left in a turn that committed; the next one fails)
            life.store.commit()
            b.committed()
            b.turn_begins()
        life.store.abort()
        b.rolled_back()
        return life.state_of((m.qid, m.seq), last="native" if kept else "c1")
    ref = life.in_flight()
    life.acked = b.counters.acked
    one: dict[str, Callable[[], object]] = {
        "ack": lambda: b.ack(ref, by="c1"),
        "ack_many": lambda: b.ack_many([ref], by="c1"),
        "nack": lambda: b.nack(ref, by="c1"),
        "expire": lambda: b.expire(100.0),
        "take_back": lambda: b.take_back(ref, by="c1"),
        "take_back_many": lambda: b.take_back_many([ref], by="c1"),
        "consumer_gone": lambda: b.consumer_gone("c1"),
        "undeliver": lambda: b.undeliver(ref),
        "undeliver_many": lambda: b.undeliver_many([ref]),
        "requeue_at_end": lambda: b.requeue_at_end(ref, by="c1"),
        "dead_letter": lambda: b.dead_letter(ref, "test", by="c1", now_us=T0),
        "reset": b.reset,
        "drop_queue": lambda: b.drop_queue("q"),
    }
    one[verb]()
    return life.state_of(ref)


def _from_late(life: Life, verb: str) -> str:
    b = life.broker
    ref = life.late()
    life.acked = b.counters.acked
    if verb == "ack":
        assert b.ack(ref, by="c1")
    elif verb == "requeue_at_end":
        assert b.requeue_at_end(ref, by="c1")
    elif verb == "dead_letter":
        assert b.dead_letter(ref, "test", by="c1", now_us=T0)
    elif verb == "nack":
        assert not b.nack(ref, by="c1")
    elif verb == "take_back":
        assert not b.take_back(ref, by="c1")
    return life.state_of(ref)


def _from_held(life: Life, verb: str) -> str:
    b = life.broker
    ref = life.held()
    life.acked = b.counters.acked
    if verb == "ack_range":
        assert b.ack_range(ref[0], ref[1], ref[1] + 1, GROUP, 10) == (1, ref[1] + 1)
    elif verb == "release_range":
        assert b.release_range(ref[0], ref[1], ref[1] + 1, GROUP, deliveries=1) == 1
    elif verb == "ack":
        assert not b.ack(ref, by=GROUP) and not b.ack(ref, by="c1")
    elif verb == "nack":
        assert not b.nack(ref, by=GROUP) and not b.nack(ref, by="c1")
    elif verb == "drop_queue":
        b.drop_queue("q")
    return life.state_of(ref)


def _from_dead(life: Life, verb: str) -> str:
    life.dead()
    assert len(life.broker.requeue_dead("q")) == 1
    return life.state_of(life.new_ref())


_AS_IN_FLIGHT = {"ack": "settled", "requeue_at_end": "moved", "dead_letter": "dead-lettered"}


def _drive(life: Life, start: str, verb: str, note: str) -> str:
    if start == "(none)":
        return _produce(life, verb)
    if start == "READY":
        return _from_ready(life, verb, note)
    if start == "IN FLIGHT":
        return _from_in_flight(life, verb, note)
    if start == "READY, late":
        return _from_late(life, verb)
    if start == "HELD":
        return _from_held(life, verb)
    assert start == "dead-lettered"
    return _from_dead(life, verb)


CASES = [(row, verb) for row in ROWS for verb in _verbs(row[1])]


@pytest.mark.parametrize(("row", "verb"), CASES, ids=[f"{row[0]} {verb} {row[1]}" for row, verb in CASES])
def test_each_transition_ends_in_the_state_the_table_names(row, verb, tmp_path):
    start, event, to, _ = row
    note = m.group(1) if (m := re.search(r"\[(.*)\]", event)) else ""
    store = Store(tmp_path / "db", max_size=64 << 20)
    try:
        expected = _AS_IN_FLIGHT[verb] if to == "as IN FLIGHT" else to
        assert _drive(Life(store), start, verb, note) == expected
    finally:
        store.close()
