#!/usr/bin/env python3
"""What permissions cost: one check in-process, and API PRODUCE and native produce rates through a real
`pzq serve` without a permissions file and with one, taken in one run, alternating, as ratios.

    PYTHONPATH=. .venv/bin/python scripts/permissions_cost.py --rounds 3 --messages 20000

The file used has ``--keys`` key sections of four patterns per right (the client's own key last), and
a default, so that a check walks a realistic file. API requests carry ``--batch`` messages spread over
8 queues; each is checked per message's queue. Native producers are checked once, at the handshake.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from pathlib import Path

from pzq.bench.server import PzqServer
from pzq.clients import native as client
from pzq.clients.api import ApiClient
from pzq.permissions import PRODUCE, Permissions


def permissions_file(folder: Path, keys: int) -> Path:
    lines = ['[default]\nproduce = ["orders.*", "default"]\nconsume = ["default"]\n']
    for i in range(keys):
        patterns = ", ".join(f'"tenant{i}.{j}.*"' for j in range(4))
        lines.append(f"[keys.tenant{i}]\nproduce = [{patterns}]\nconsume = [{patterns}]\nmanage = [{patterns}]\n")
    path = folder / "permissions.toml"
    path.write_text("\n".join(lines))
    return path


def check_cost(path: Path) -> dict[str, float]:
    """Nanoseconds per check: no file, an allowed queue, a refused one (counted and logged, rate-limited)."""
    off = Permissions(str(path.parent / "none.toml"))
    on = Permissions(str(path), names=lambda key: None)  # (unknown keys: the default decides)
    n = 200_000
    figures = {
        "no file": timeit.timeit(lambda: off.key_may("K", PRODUCE, "orders.eu", "api", "PRODUCE"), number=n),
        "allowed": timeit.timeit(lambda: on.key_may("K", PRODUCE, "orders.eu", "api", "PRODUCE"), number=n),
    }
    import logging

    logging.getLogger("pzq").setLevel(logging.CRITICAL)  # (the refusals' log lines are not what is timed)
    figures["refused"] = timeit.timeit(lambda: on.key_may("K", PRODUCE, "payroll", "api", "PRODUCE"), number=n)
    return {name: seconds / n * 1e9 for name, seconds in figures.items()}


def api_rate(srv: PzqServer, messages: int, batch: int) -> float:
    body = b"x" * 100
    with ApiClient(srv.api, timeout_s=60) as api:
        t0 = time.perf_counter()
        for start in range(0, messages, batch):
            api.produce([(f"orders.q{(start + i) % 8}", body) for i in range(batch)])
        return messages / (time.perf_counter() - t0)


def native_rate(srv: PzqServer, messages: int) -> float:
    with client.Producer(srv.receive, timeout_s=60) as producer:
        t0 = time.perf_counter()
        results = producer.produce_many(([b"x" * 100] for _ in range(messages)), window=100)
        if not all(r.ok for r in results):
            raise SystemExit("a produce was refused")
        return messages / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100, help="messages per API PRODUCE")
    parser.add_argument("--keys", type=int, default=50, help="key sections in the file")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pzq-permissions-cost-"))
    path = permissions_file(folder, args.keys)
    for name, ns in check_cost(path).items():
        print(f"one check, {name}: {ns:.0f} ns")
    rates: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, extra in (("no file", ()), ("with file", ("--permissions", str(path)))):
            with PzqServer(gateways=("api",), transport="ipc", args=("--disk-reserve", "0", *extra)) as srv:
                rates.setdefault(f"api {label}", []).append(api_rate(srv, args.messages, args.batch))
                rates.setdefault(f"native {label}", []).append(native_rate(srv, args.messages))
    print(f"median of {args.rounds} rounds, {args.messages} messages each (msg/s):")
    for name, values in rates.items():
        print(f"  {name:18} {statistics.median(values):>10,.0f}   runs: {', '.join(f'{v:,.0f}' for v in values)}")
    for protocol in ("api", "native"):
        ratio = statistics.median(rates[f"{protocol} with file"]) / statistics.median(rates[f"{protocol} no file"])
        print(f"  {protocol}: with file / no file = {ratio:.3f}")


if __name__ == "__main__":
    main()
