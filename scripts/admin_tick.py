"""What the admin's once-a-second tick costs the loop with many queues (head ages and per-queue rates, a
share of the queues a tick): the CPU time of each tick over two rounds of every queue, median and worst.
A real store in a temp dir, the queues empty (a head read costs the same for any queue).

    .venv/bin/python scripts/admin_tick.py [--queues 100000]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

from pzq.admin import Admin
from pzq.broker import Broker
from pzq.store import Store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"{tmp}/db", max_size=4 << 30)
        store.catalog.max_queues = args.queues + 1
        for i in range(args.queues):
            store.queue(f"q{i:06d}")
        store.commit()
        admin = Admin(Broker(store, ack_timeout_s=5), store, store_limit=4 << 30, gateways=dict)
        gc.disable()  # (the server's collector keeps full collections out of turns: scripts measure the tick)
        costs = []
        for tick in range(2 * args.queues // admin.limits.admin_heads_per_tick + 5):
            start = time.process_time()
            admin.tick(1000.0 + tick)
            costs.append(time.process_time() - start)
        costs.sort()
        print(
            f"{args.queues:,} queues: {len(costs)} ticks, CPU median {costs[len(costs) // 2] * 1e3:.2f} ms, "
            f"worst {costs[-1] * 1e3:.2f} ms; rates kept for {len(admin.rates):,} queues"
        )
        store.close()


if __name__ == "__main__":
    main()
