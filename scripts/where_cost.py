"""What a WHERE costs the loop (the API's and the monitor's answer, pzq/server/wiring.py's Where): the CPU
time of one answer, median of many, for shard lists of 1 to 1,024 shards, with 10,000 queues in the store:
a queue of 8 partitions asked again (its places cached), and queues asked for the first time. A real
store in a temp dir; each answer's size in msgpack (the API's).

    .venv/bin/python scripts/where_cost.py [--queues 10000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import msgpack

from pzq import shards
from pzq.server.wiring import Where
from pzq.store import Store


def shard_list(count: int) -> shards.ShardList:
    return shards.ShardList(
        tuple(
            shards.Shard(
                f"s{i}",
                receive_dsn=f"tcp://10.0.{i // 250}.{i % 250}:11131",
                api_dsn=f"tcp://10.0.{i // 250}.{i % 250}:11133",
                monitor_dsn=f"tcp://10.0.{i // 250}.{i % 250}:11136",
            )
            for i in range(count)
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"{tmp}/db", max_size=1 << 30)
        store.catalog.max_queues = args.queues + 16
        for i in range(args.queues):
            store.queue(f"q{i:06d}")
        for i in range(8):
            store.queue(shards.partition_name("orders", i))
        store.catalog.keep_partitions("orders", 8)
        store.commit()
        for count in (1, 3, 16, 64, 1024):
            where = Where("s0", shard_list(count), store.catalog)
            again, first = [], []
            for i in range(50 if count == 1024 else 300):
                started = time.thread_time()
                answer = where("orders")  # (asked again: its places from Where's cache)
                again.append(time.thread_time() - started)
                started = time.thread_time()
                where(f"new{i}")  # (asked first: placed anew)
                first.append(time.thread_time() - started)
            size = len(msgpack.packb(answer))
            print(
                f"{count:5d} shards: WHERE of a queue asked again median {statistics.median(again) * 1e3:.3f} ms "
                f"CPU, asked first {statistics.median(first) * 1e3:.3f} ms (worst {max(first) * 1e3:.3f}); "
                f"answer {size:,} bytes"
            )
        store.close()


if __name__ == "__main__":
    main()
