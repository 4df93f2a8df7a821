"""`pzq bench --protocol mqks`: publish -> consume -> ack throughput through the MQKS gateway, manual
ack, durable store.

One publisher connection publishes N messages (pipelined, unconfirmed, as MQKS clients do) while one
consumer connection (--manual-ack) receives each and acks it. The clock runs from the first publish
to the last ack confirmed (`ack --confirm` of the last message, answered after its commit). Each run
uses a fresh server and store (fsync'd commits). The reference MQKS published about 15,500 msg/s for
this with manual ack, in memory, on unknown hardware.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable

from pzq.bench.report import machine, medians
from pzq.bench.server import PzqServer
from pzq.clients.mqks import MqksClient
from pzq.errors import PzqError
from pzq.protocols.mqks_client import parse_delivery, request_line

QUEUE, EVENT = "rate", "rate-event"
ACK_BATCH = 100  # acks written together, as a busy consumer would


@dataclasses.dataclass(frozen=True)
class MqksOptions:
    messages: int = 10_000
    runs: int = 3
    size: int = 100  # data bytes
    server_args: tuple[str, ...] = ()


def one_run(options: MqksOptions) -> dict:
    """One fresh server: publish, consume and ack every message; the figures of that run."""
    n = options.messages
    args = ("--ack-timeout", "60000000", *options.server_args)
    with (
        PzqServer(gateways=("mqks",), transport="ipc", args=args, prefix="pzq-bench-mqks-") as server,
        MqksClient(server.mqks, timeout_s=30) as consumer,
        MqksClient(server.mqks, timeout_s=30, prefix="p") as publisher,
    ):
        consumer_id = consumer.consume(QUEUE, [EVENT], manual_ack=True)
        data = "x" * options.size

        def publish() -> None:
            publisher.write(b"".join(request_line(f"m{i}", "publish", f"{EVENT} {data}") for i in range(n)))

        t0 = time.perf_counter()
        sender = threading.Thread(target=publish, daemon=True)
        sender.start()
        got, seen, acks = 0, set(), []
        while got < n:
            line = consumer.read_line()
            if line is None:
                raise PzqError(f"mqks: stalled after {got} of {n} messages")
            delivery = parse_delivery(line)
            if delivery is None:
                continue
            got += 1
            seen.add(delivery.msg_id)
            last = got == n
            acks.append(
                request_line("last" if last else f"a{got}", "ack", f"{consumer_id} {delivery.msg_id}", confirm=last)
            )
            if len(acks) >= ACK_BATCH or last:
                consumer.write(b"".join(acks))
                acks.clear()
        consumer.wait_ok("last")
        seconds = time.perf_counter() - t0
        sender.join(30)
        left = server.depth(QUEUE)
    return {
        "messages": n,
        "received": got,
        "distinct": len(seen),
        "left": left,
        "seconds": round(seconds, 6),
        "msg_s": round(n / seconds),
    }


def bench(options: MqksOptions, echo: Callable[[str], None] = print) -> dict:
    """``options.runs`` runs, each line printed as it ends, then the median."""
    runs = []
    for run in range(1, options.runs + 1):
        runs.append(one_run(options))
        echo(
            f"run {run}: {runs[-1]['msg_s']:,.0f} msg/s (publish -> consume -> ack, manual ack, "
            f"{options.messages:,} messages of {options.size} B)"
        )
    median = statistics.median(r["msg_s"] for r in runs)
    echo(f"median: {median:,.0f} msg/s   (reference MQKS, in memory: about 15,500 msg/s)")
    return {"machine": machine(), "options": dataclasses.asdict(options), "runs": runs, "median": medians(runs)}
