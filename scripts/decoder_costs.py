#!/usr/bin/env python3
"""What one hostile request costs a gateway, in-process (a real Store and Broker, no socket): the time of
the gateway's call, which is the time the server's loop would stall every other client for it.

    .venv/bin/python scripts/decoder_costs.py          # every case
    .venv/bin/python scripts/decoder_costs.py --quick  # without the 20-pipelined MQKS runs

Run it with PYTHONPATH naming an older tree to compare (issue 26, "cost checked before the work").
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import msgpack

from pzq.broker import Broker
from pzq.clock import Now
from pzq.gateways.api import ApiGateway
from pzq.gateways.emqp import EmqpGateway
from pzq.gateways.mqks import MqksGateway
from pzq.leases import Leases
from pzq.protocols import emqp
from pzq.store import Store
from pzq.store.bindings import Bindings
from pzq.store.dedup_keys import DedupKeys
from pzq.store.emqp_jobs import EmqpJobs
from pzq.store.schedules import Schedules


def timed(call):
    started = time.perf_counter()
    result = call()
    return (time.perf_counter() - started) * 1000, result


def api_cases(store: Store) -> None:
    broker = Broker(store, ack_timeout_s=60)
    gateway = ApiGateway(
        broker, Leases(broker, timeout_s=60), DedupKeys(store), max_message_size=16 << 20, dedup_window_s=60
    )
    nils = b"".join(
        msgpack.packb(f"x{i}") + b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\xc0" * (1 << 20) for i in range(14)
    )
    cases = {
        "API PRODUCE of 2^20 items": (b"PRODUCE", msgpack.packb({"messages": [["q", b"x"]] * (1 << 20)})),
        "API INFO with 14 MiB of nils": (b"INFO", b"\x8f" + msgpack.packb("queue") + msgpack.packb("q") + nils),
    }
    for label, (command, body) in cases.items():
        frames = [b"peer", b"", b"1", command, body]
        ms, reply = timed(lambda frames=frames: gateway.handle(frames, now=Now(1.0, 1)))
        print(f"{label}: {ms:.1f} ms -> {reply[-2].decode()} {msgpack.unpackb(reply[-1])}")


def emqp_cases(store: Store) -> None:
    gateway = EmqpGateway(
        Broker(store, ack_timeout_s=60),
        EmqpJobs(store),
        Schedules(store),
        default_queues=["q"],
        heartbeat_s=3,
        liveness=3,
    )
    frames = [b"client", *emqp.command("REQUEST", "m1", "q", "a," * (8 << 20), "payload")]
    ms, sends = timed(lambda: gateway.from_client(frames, now=Now(1.0, 1)))
    print(f"eMQP REQUEST with a 16 MiB headers frame, on arrival: {ms:.1f} ms -> {sends[0].frames[3].decode()}")
    gateway.from_worker([b"w", *emqp.command("INFORM", "i1", '[[10, "q"]]', "worker")], now=Now(1.0, 1))
    gateway.from_worker([b"w", *emqp.command("READY", "r1")], now=Now(1.0, 1))
    ms, jobs = timed(lambda: gateway.hand_out(now=Now(1.0, 1)))
    print(f"eMQP dispatch of it to a worker: {ms:.1f} ms -> {len(jobs)} job(s)")


def mqks_case(store: Store, label: str, events: list[str], masks: list[str], pipelined: bool) -> None:
    broker = Broker(store, ack_timeout_s=60)
    gateway = MqksGateway(broker, Bindings(store), max_line=32 << 20, window=10, drop_queue=broker.drop_queue)
    gateway.connected(b"c")
    line = f"r1 rebind --confirm {label[:8].replace(' ', '_')} {' '.join(events)} --remove-mask {' '.join(masks)}\n"
    ms, sends = timed(lambda: gateway.received(b"c", line.encode(), now=Now(1.0, 1)))
    answer = sends[-1].frames[1].split()[1].decode()
    twenty = ""
    if pipelined:
        all_ms, _ = timed(lambda: gateway.received(b"c", line.encode() * 20, now=Now(1.0, 1)))
        twenty = f", 20 pipelined {all_ms:.0f} ms"
    print(f"MQKS rebind, {label}: one {ms:.1f} ms ({answer}){twenty}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 20-pipelined MQKS runs")
    args = parser.parse_args()
    deep = "." + ".".join(["a"] * 120)
    mqks = [
        (
            "10,000 events of 3 segments, 100 masks",
            [f"e{i}.s{i % 97}.t{i % 13}" for i in range(10_000)],
            [f"e{i}.*.t*" for i in range(100)],
            not args.quick,
        ),
        (
            "10,000 events of 121 segments, 100 masks *.a...a.i*",
            [f"{i}{deep}" for i in range(10_000)],
            [f"*.{'.'.join(['a'] * 119)}.{i}*" for i in range(100)],
            not args.quick,
        ),
        (
            "10,000 events of 250 bytes, one mask *.*a...ab (a glob that backtracks)",
            [f"{i}." + "a" * 240 for i in range(10_000)],
            ["*.*" + "a" * 120 + "b"],
            False,
        ),
    ]
    for run in (api_cases, emqp_cases, *(lambda store, case=case: mqks_case(store, *case) for case in mqks)):
        with tempfile.TemporaryDirectory() as workdir:
            store = Store(pathlib.Path(workdir) / "db", max_size=1 << 30)
            try:
                run(store)
            finally:
                store.close()


if __name__ == "__main__":
    main()
