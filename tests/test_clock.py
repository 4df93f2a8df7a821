"""One ``Now`` per turn (issue 41, item 3): the server reads both clocks once a turn and every endpoint,
gateway and chore of that turn is handed the same value; the stamps a consumer reads are that value's."""

from __future__ import annotations

import collections
import itertools
import time

import pytest
import zmq

from pzq.clock import Now
from pzq.protocols import native as wire
from pzq.server import Server

from conftest import make_config

_inproc = itertools.count()


def test_a_now_holds_both_clocks_read_one_right_after_the_other():
    mono_before, wall_before = time.monotonic(), time.time_ns() // 1000
    now = Now.read()
    mono_after, wall_after = time.monotonic(), time.time_ns() // 1000
    assert mono_before <= now.mono <= mono_after, "mono is time.monotonic(), in seconds"
    assert wall_before <= now.wall_us <= wall_after, "wall_us is the wall clock in µs"
    assert isinstance(now.wall_us, int), "a stamp is a whole number of µs, as records carry it"
    assert (mono_after - mono_before) < 1.0, "(the two reads are one after the other)"


def test_a_now_cannot_be_changed_once_read_and_a_test_makes_its_own():
    now = Now(mono=5.0, wall_us=1_700_000_000_000_000)
    with pytest.raises(AttributeError):
        now.mono = 6.0  # type: ignore[misc]
    assert now == Now(5.0, 1_700_000_000_000_000)


def _recording(calls: list, server: Server, label: str, method):
    """``method`` that first writes down (the server's turn, ``label``, the Now it was handed)."""

    def call(*args, **kwargs):
        now = kwargs["now"] if "now" in kwargs else next(a for a in args if isinstance(a, Now))
        calls.append((server.turns, label, now))
        return method(*args, **kwargs)

    return call


def test_every_endpoint_and_gateway_of_a_turn_is_handed_the_same_now_and_the_stamps_are_its_wall_clock(tmp_path):
    n = next(_inproc)
    cfg = make_config(
        tmp_path,
        receive_dsn=f"inproc://clock-receive-{n}",
        send_dsn=f"inproc://clock-send-{n}",
        consume_dsn=f"inproc://clock-consume-{n}",
        api_dsn=f"inproc://clock-api-{n}",
        monitor_dsn=f"inproc://clock-monitor-{n}",
    )
    server = Server(cfg, context=zmq.Context.instance())
    server.start()
    calls: list[tuple[int, str, Now]] = []
    for endpoint in server.endpoints:  # (the tasks call these by name at each turn: instance attributes win)
        kind = type(endpoint).__name__
        for verb in ("read", "work", "flush"):
            setattr(endpoint, verb, _recording(calls, server, f"{kind}.{verb}", getattr(endpoint, verb)))
        gateway = getattr(endpoint, "gateway", None)
        for verb in ("received", "received_many", "dispatch"):
            if gateway is not None and hasattr(gateway, verb):
                label = f"{type(gateway).__name__}.{verb}"
                setattr(gateway, verb, _recording(calls, server, label, getattr(gateway, verb)))
    producer, consumer = (zmq.Context.instance().socket(kind) for kind in (zmq.DEALER, zmq.DEALER))
    try:
        for sock in (producer, consumer):
            sock.setsockopt(zmq.LINGER, 0)
        producer.connect(cfg.receive_dsn)
        consumer.connect(cfg.send_dsn)
        server._turn(0)  # (a turn with nothing to read)
        producer.send_multipart(wire.produce(b"m1", [b"body"]))
        delivered = None
        until = time.monotonic() + 10
        while delivered is None and time.monotonic() < until:
            server._turn(50)
            if consumer.poll(0):
                delivered = wire.parse_delivery(consumer.recv_multipart())
        assert delivered is not None and delivered.body == [b"body"], "the message went through the turns"
    finally:
        producer.close(0)
        consumer.close(0)
        server.close()

    by_turn: dict[int, list[tuple[str, Now]]] = collections.defaultdict(list)
    for turn, label, now in calls:
        by_turn[turn].append((label, now))
    assert len(by_turn) >= 2
    for turn, seen in by_turn.items():
        nows = {now for _, now in seen}
        assert len(nows) == 1, f"turn {turn}: every endpoint and gateway saw one Now, not {sorted(nows)}"
        labels = {label for label, _ in seen}
        for endpoint in server.endpoints:
            kind = type(endpoint).__name__
            assert {f"{kind}.read", f"{kind}.work", f"{kind}.flush"} <= labels, f"turn {turn}: {kind} took part"
    turns = sorted(by_turn)
    firsts = [by_turn[t][0][1] for t in turns]
    assert all(a.mono < b.mono for a, b in itertools.pairwise(firsts)), "each turn reads the clocks anew"

    stored = [now for _, label, now in calls if label == "NativeGateway.received_many"]
    handed = [now for _, label, now in calls if label == "NativeGateway.dispatch"]
    enqueued_us = int(delivered.key.split(b"|")[0])
    assert enqueued_us in {now.wall_us for now in stored}, "the record's stamp is the storing turn's wall clock"
    assert delivered.sent_us in {now.wall_us for now in handed}, "the delivery's stamp is its turn's wall clock"
