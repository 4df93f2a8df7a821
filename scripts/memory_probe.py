"""The memory bound, probed: API connections that each send SNAPSHOT requests (4 MiB replies) and read
nothing, against a `pzq serve` subprocess; prints the server's peak anonymous RSS and whether an honest
producer was refused while they held their replies and served once they were gone.

    PYTHONPATH=. python scripts/memory_probe.py --connections 30 80

(issue 26, "One memory bound". A function of its own, ``probe``, so that scripts/torture.py can take
it as a case.) It uses nothing newer than the server it measures, so it runs against older trees too:
``PYTHONPATH=/path/to/old/tree python scripts/memory_probe.py``.
"""

from __future__ import annotations

import argparse
import time

import zmq

from pzq.bench.server import PzqServer, memory_mb
from pzq.clients.api import ApiClient
from pzq.errors import PzqError
from pzq.protocols import api as api_proto

QUEUE = "probe"


def hostile(ctx: zmq.Context, endpoint: str, requests: int, tag: int) -> zmq.Socket:
    """One API connection that sends ``requests`` SNAPSHOTs of the whole queue and reads nothing (its
    libzmq takes one reply at most: RCVHWM 1 and a small kernel buffer)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(endpoint)
    args = {"queue": QUEUE, "after": 0, "before": 1 << 40, "limit": 10_000}
    for i in range(requests):
        sock.send_multipart(api_proto.request(f"h{tag}-{i}".encode(), "SNAPSHOT", args))
    return sock


def rss_anon_mb(server: PzqServer) -> float:
    return memory_mb(server.proc.pid, "RssAnon") if server.proc is not None else 0.0


def settle(server: PzqServer, quiet_s: float = 2.0, most_s: float = 30.0) -> float:
    """Poll the server's RssAnon until it has not grown for ``quiet_s``; its peak (MB)."""
    peak, grew_at, t0 = 0.0, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < most_s and time.monotonic() - grew_at < quiet_s:
        now = rss_anon_mb(server)
        if now > peak + 1:
            peak, grew_at = now, time.monotonic()
        time.sleep(0.1)
    return max(peak, rss_anon_mb(server))


def produce_once(endpoint: str) -> str:
    """An honest producer's one PRODUCE: 'ok' or the error code it got."""
    with ApiClient(endpoint, timeout_s=10) as client:
        try:
            client.produce([(QUEUE + "-honest", b"x" * 100)])
            return "ok"
        except PzqError as exc:
            return getattr(exc, "code", type(exc).__name__)


def probe(connections: int, requests: int = 12, message_kib: int = 64, args: tuple[str, ...] = ()) -> dict:
    """One run: a fresh server with a queue of 5 MiB (every SNAPSHOT reply stops at 4 MiB), then
    ``connections`` hostile connections; the figures."""
    with PzqServer(gateways=("api",), args=args, prefix="pzq-memprobe-") as server:
        with ApiClient(server.api, timeout_s=30) as client:
            body = b"m" * (message_kib << 10)
            for _ in range(max(1, (5 << 20) // len(body) // 16)):
                client.produce([(QUEUE, body)] * 16)
        idle = rss_anon_mb(server)
        ctx = zmq.Context()
        socks = [hostile(ctx, server.api, requests, i) for i in range(connections)]
        try:
            peak = settle(server)
            during = produce_once(server.api)
        finally:
            for sock in socks:
                sock.close(0)
            ctx.term()
        deadline, after = time.monotonic() + 30, "not tried"
        while time.monotonic() < deadline:  # (the alarm clears once the server found them gone)
            after = produce_once(server.api)
            if after == "ok":
                break
            time.sleep(0.5)
        return {
            "connections": connections,
            "requests": requests,
            "idle_rss_anon_mb": round(idle),
            "peak_rss_anon_mb": round(peak),
            "peak_vmhwm_mb": round(server.peak_rss_mb()),
            "honest_produce_during": during,
            "honest_produce_after": after,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[30, 80])
    parser.add_argument("--requests", type=int, default=12, help="SNAPSHOTs each connection sends")
    parser.add_argument("--server-arg", action="append", default=[], help="an argument for `pzq serve` (repeat)")
    opts = parser.parse_args()
    for n in opts.connections:
        print(probe(n, opts.requests, args=tuple(opts.server_arg)), flush=True)


if __name__ == "__main__":
    main()
