#!/usr/bin/env python3
"""The `pzq bench` workload against Redis Streams and RabbitMQ, for pzq's ratio to each.

    .venv/bin/python scripts/compare_peers.py [--install] [--runs 3] [--peers redis,rabbitmq]

Each peer is started from Debian's packages on loopback in a temp dir, with durability comparable to
pzq's fsync'd acks:
- Redis Streams: `appendonly yes`, `appendfsync always`; producers XADD (raw RESP, one packed write per
  window refill, replies parsed by hiredis), consumers XREADGROUP (COUNT 100) with each batch's XACK
  in the same write as the next read.
- RabbitMQ: a durable quorum queue, persistent messages, publisher confirms (up to the window
  unconfirmed), consumers with prefetch 100 and manual acks.
The phases, processes, body stamps and figures are pzq bench's own (pzq.bench.phases.run_phase), so the only
difference between the columns is the system under test. `--install` apt-installs the servers and
pip-installs the Python clients (redis, pika) when they are missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from pzq.bench import native as bench
from pzq.bench.phases import BenchOptions, Progress, run_phase
from pzq.bench.report import _fmt, machine, medians
from pzq.bench.server import cpu_seconds, free_ports
from pzq.bench.workers import _HEAD, TAG_SHIFT, ConsumerResult, ProducerResult

STREAM, GROUP = "pzq-bench", "bench"


# -- Redis --------------------------------------------------------------------------------------------


def _resp(*args: bytes) -> bytes:
    """One Redis command in RESP, as hiredis-based clients write it."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class _RawRedis:
    """Redis's fastest Python client we know: raw RESP commands packed into one write, replies
    parsed by hiredis (redis-py's pipeline builds and parses every command in Python: about half as fast)."""

    def __init__(self, endpoint: str):
        import hiredis

        self.sock = socket.create_connection(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def call_many(self, packed: bytes, replies: int) -> list:
        self.sock.sendall(packed)
        out: list = []
        while len(out) < replies:
            reply = self.reader.gets()
            if reply is False:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("redis closed the connection")
                self.reader.feed(data)
                continue
            out.append(reply)
        return out


def redis_producer(job, start, progress, results) -> None:
    client = _RawRedis(job.endpoint)
    pad = b"x" * max(0, job.size - _HEAD.size)
    stream = STREAM.encode()
    latencies, acked, sent = [], 0, 0
    interval_ns = int(1e9 / job.rate) if job.rate else 0
    start.wait()
    t0 = time.monotonic_ns()
    while sent < job.count:
        if interval_ns:
            due = t0 + sent * interval_ns - time.monotonic_ns()
            if due > 0:
                time.sleep(due / 1e9)
        batch = 1 if interval_ns else min(job.window, job.count - sent)
        now = time.monotonic_ns()
        packed = b"".join(
            _resp(b"XADD", stream, b"*", b"b", _HEAD.pack(now, (job.index << TAG_SHIFT) | i) + pad)
            for i in range(sent, sent + batch)
        )
        client.call_many(packed, batch)  # with appendfsync always, each reply follows the fsync
        done = time.monotonic_ns()
        latencies.extend([done - now] * batch)
        sent += batch
        acked += batch
        with progress.get_lock():
            progress.value += batch
    results.put(ProducerResult(job.index, acked, 0, (time.monotonic_ns() - t0) / 1e9, latencies))


def redis_consumer(job, start, progress, done, results) -> None:
    client = _RawRedis(job.endpoint)
    stream, group = STREAM.encode(), GROUP.encode()
    read = _resp(
        b"XREADGROUP", b"GROUP", group, b"c%d" % job.index, b"COUNT", b"100", b"BLOCK", b"50", b"STREAMS", stream, b">"
    )
    seen = [bytearray(job.per_producer) for _ in range(job.producers)]
    latencies, received, first, last = [], 0, 0, 0
    mask = (1 << TAG_SHIFT) - 1
    ack = b""  # the last batch's XACK goes out in the same write as the next read
    start.wait()
    while not done.is_set():
        reply = client.call_many(ack + read, 2 if ack else 1)[-1]
        ack = b""
        if not reply:
            continue
        entries = reply[0][1]
        now = time.monotonic_ns()
        ack = _resp(b"XACK", stream, group, *[eid for eid, _ in entries])
        for _, fields in entries:
            sent_ns, tag = _HEAD.unpack_from(fields[1])
            producer, seq = tag >> TAG_SHIFT, tag & mask
            if producer < job.producers and seq < job.per_producer:
                seen[producer][seq] += 1
            latencies.append(now - sent_ns)
        received += len(entries)
        first, last = first or now, now
        with progress.get_lock():
            progress.value += len(entries)
    if ack:
        client.call_many(ack, 1)
    results.put(ConsumerResult(job.index, received, seen, first, last, latencies))


class RedisPeer:
    name = "redis"

    def __init__(self, workdir: str):
        self.port = _free_port()
        self.workdir = workdir
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                workdir,
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
            ],
            stdout=open(os.path.join(workdir, "redis.log"), "ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_port(self.port, proc=self.proc)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"

    def reset(self) -> None:
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.port)
        r.delete(STREAM)
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def commits(self):
        return None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    producer_fn = staticmethod(redis_producer)
    consumer_fn = staticmethod(redis_consumer)


# -- RabbitMQ -----------------------------------------------------------------------------------------

QUEUE = "pzq-bench"


def rabbit_producer(job, start, progress, results) -> None:
    import pika

    port = int(job.endpoint.rsplit(":", 1)[1])
    conn = pika.SelectConnection(
        pika.ConnectionParameters("127.0.0.1", port), on_close_callback=lambda *_: conn.ioloop.stop()
    )
    pad = b"x" * max(0, job.size - _HEAD.size)
    state = {"sent": 0, "acked": 0, "nacked": 0, "t0": 0, "latencies": [], "sent_at": {}, "ch": None}
    interval_ns = int(1e9 / job.rate) if job.rate else 0
    props = pika.BasicProperties(delivery_mode=2)

    def pump():
        ch = state["ch"]
        while state["sent"] < job.count and state["sent"] - state["acked"] - state["nacked"] < job.window:
            if interval_ns:
                due = state["t0"] + state["sent"] * interval_ns - time.monotonic_ns()
                if due > 0:
                    conn.ioloop.call_later(due / 1e9, pump)
                    return
            i = state["sent"]
            now = time.monotonic_ns()
            state["sent_at"][i + 1] = now
            ch.basic_publish("", QUEUE, _HEAD.pack(now, (job.index << TAG_SHIFT) | i) + pad, props)
            state["sent"] += 1

    def on_confirm(frame):
        method = frame.method
        tags = [k for k in state["sent_at"] if k <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        now = time.monotonic_ns()
        for tag in tags:
            state["latencies"].append(now - state["sent_at"].pop(tag))
        key = "acked" if method.NAME == "Basic.Ack" else "nacked"
        state[key] += len(tags)
        with progress.get_lock():
            progress.value += len(tags)
        if state["acked"] + state["nacked"] >= job.count:
            conn.close()
        else:
            pump()

    def on_channel(ch):
        state["ch"] = ch
        ch.confirm_delivery(on_confirm)
        start.wait()
        state["t0"] = time.monotonic_ns()
        pump()

    conn.add_on_open_callback(lambda c: c.channel(on_open_callback=on_channel))
    conn.ioloop.start()
    seconds = (time.monotonic_ns() - state["t0"]) / 1e9
    results.put(ProducerResult(job.index, state["acked"], state["nacked"], seconds, state["latencies"]))


def rabbit_consumer(job, start, progress, done, results) -> None:
    import pika

    port = int(job.endpoint.rsplit(":", 1)[1])
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    seen = [bytearray(job.per_producer) for _ in range(job.producers)]
    latencies, stats = [], {"received": 0, "first": 0, "last": 0, "unacked": 0, "tag": 0}
    mask = (1 << TAG_SHIFT) - 1

    def ack_all() -> None:
        # One Basic.Ack with multiple=True settles every delivery up to the tag, as Redis's client
        # sends one XACK per batch: a per-message ack would understate RabbitMQ.
        if stats["unacked"]:
            ch.basic_ack(stats["tag"], multiple=True)
            stats["unacked"] = 0

    def on_message(channel, method, props, body):
        now = time.monotonic_ns()
        stats["tag"] = method.delivery_tag
        stats["unacked"] += 1
        if stats["unacked"] >= 50:  # half the prefetch, so the broker never waits on us for room
            ack_all()
        sent_ns, tag = _HEAD.unpack_from(body)
        producer, seq = tag >> TAG_SHIFT, tag & mask
        if producer < job.producers and seq < job.per_producer:
            seen[producer][seq] += 1
        latencies.append(now - sent_ns)
        stats["received"] += 1
        stats["first"], stats["last"] = stats["first"] or now, now
        with progress.get_lock():
            progress.value += 1

    ch.basic_consume(QUEUE, on_message)
    start.wait()
    while not done.is_set():
        conn.process_data_events(time_limit=0.05)
        ack_all()
    conn.close()
    results.put(ConsumerResult(job.index, stats["received"], seen, stats["first"], stats["last"], latencies))


class RabbitPeer:
    name = "rabbitmq"

    def __init__(self, workdir: str):
        self.port = _free_port()
        env = dict(
            os.environ,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_NODENAME=f"pzqbench{self.port}@localhost",
            RABBITMQ_MNESIA_BASE=workdir,
            RABBITMQ_LOG_BASE=workdir,
            RABBITMQ_DIST_PORT=str(_free_port()),
            RABBITMQ_SERVER_START_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(workdir, "plugins"),
            HOME=workdir,
        )
        open(os.path.join(workdir, "plugins"), "w").write("[].\n")
        self.env = env
        # The Debian wrapper in /usr/sbin switches to the rabbitmq user and its own home; the real
        # script runs the node as us, with everything in workdir.
        self.bin = "/usr/lib/rabbitmq/bin" if os.path.isdir("/usr/lib/rabbitmq/bin") else ""
        self.proc = subprocess.Popen(
            [os.path.join(self.bin, "rabbitmq-server")],
            env=env,
            stdout=open(os.path.join(workdir, "rabbit.log"), "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_port(self.port, timeout=120, proc=self.proc)
        self.endpoint = f"tcp://127.0.0.1:{self.port}"

    def reset(self) -> None:
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        ch = conn.channel()
        ch.queue_delete(QUEUE)
        ch.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()

    def cpu_seconds(self) -> float:
        # The Erlang VM (beam) is a child of the rabbitmq-server script: count the whole session.
        return sum(cpu_seconds(pid) for pid in _session_pids(self.proc.pid))

    def commits(self):
        return None

    def stop(self) -> None:
        subprocess.run(
            [os.path.join(self.bin, "rabbitmqctl"), "-n", self.env["RABBITMQ_NODENAME"], "stop"],
            env=self.env,
            capture_output=True,
            timeout=60,
        )
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)

    producer_fn = staticmethod(rabbit_producer)
    consumer_fn = staticmethod(rabbit_consumer)


# -- common -------------------------------------------------------------------------------------------


def _free_port() -> int:
    return free_ports(1)[0]


def _wait_port(port: int, timeout: float = 30, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout} s")


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[3]) == sid or int(entry) == sid:
                        pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def one_run(peer, options: BenchOptions) -> dict:
    progress = Progress(options.progress)
    kw = dict(progress=progress, server=peer, producer_fn=peer.producer_fn, consumer_fn=peer.consumer_fn)
    out = {}
    peer.reset()
    out["producer_w1"], _ = run_phase(
        "producer w1",
        options,
        peer.endpoint,
        None,
        count=options.latency_count,
        window=1,
        producers=1,
        consumers=0,
        **kw,
    )
    out["producer_w100"], _ = run_phase(
        f"producer w{options.window}",
        options,
        peer.endpoint,
        None,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=0,
        **kw,
    )
    out["consumer"], _ = run_phase(
        "consumer drain",
        options,
        None,
        peer.endpoint,
        count=options.count + options.latency_count,
        window=0,
        producers=0,
        consumers=options.consumers,
        **kw,
    )
    peer.reset()
    out["e2e"], _ = run_phase(
        "end to end",
        options,
        peer.endpoint,
        peer.endpoint,
        count=options.count,
        window=options.window,
        producers=options.producers,
        consumers=options.consumers,
        **kw,
    )
    peer.reset()
    out["e2e_paced"], _ = run_phase(
        f"paced {options.rate:g}/s",
        options,
        peer.endpoint,
        peer.endpoint,
        count=int(options.rate * options.paced_seconds),
        window=max(options.window, 1000),
        producers=options.producers,
        consumers=options.consumers,
        rate=options.rate,
        **kw,
    )
    return out


ROWS = [
    ("producer, window 1 (msg/s)", "producer_w1.msg_s"),
    ("  ack p50 (ms)", "producer_w1.ack_p50_ms"),
    ("  ack p99 (ms)", "producer_w1.ack_p99_ms"),
    ("producer, window W (msg/s)", "producer_w100.msg_s"),
    ("consumer, draining (msg/s)", "consumer.msg_s"),
    ("end to end (msg/s)", "e2e.msg_s"),
    ("  latency p50 (ms)", "e2e.lat_p50_ms"),
    ("  latency p99 (ms)", "e2e.lat_p99_ms"),
    ("paced latency p50 (ms)", "e2e_paced.lat_p50_ms"),
    ("paced latency p99 (ms)", "e2e_paced.lat_p99_ms"),
    ("server CPU µs/msg, window 1", "producer_w1.server_cpu_us"),
    ("server CPU µs/msg, window W", "producer_w100.server_cpu_us"),
    ("server CPU µs/msg, e2e", "e2e.server_cpu_us"),
    ("server CPU, window W (%)", "producer_w100.server_cpu_pct"),
    ("server CPU, e2e (%)", "e2e.server_cpu_pct"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default="redis,rabbitmq")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--latency-count", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--paced-seconds", type=float, default=5)
    parser.add_argument("--install", action="store_true", help="apt/pip-install what is missing")
    parser.add_argument("--json", default="compare-peers.json")
    args = parser.parse_args()
    options = BenchOptions(
        count=args.count,
        latency_count=args.latency_count,
        window=args.window,
        producers=args.producers,
        consumers=args.consumers,
        paced_seconds=args.paced_seconds,
        runs=args.runs,
    )
    peers = {
        "redis": (RedisPeer, "redis-server", "redis-server", "redis"),
        "rabbitmq": (RabbitPeer, "rabbitmq-server", "rabbitmq-server", "pika"),
    }
    results = {"machine": machine(), "options": vars(args)}
    print("pzq ...", file=sys.stderr)
    results["pzq"] = bench.bench(dataclasses.replace(options, ceiling=False))["median"]
    for name in args.peers.split(","):
        cls, binary, package, module = peers[name]
        if args.install:
            _install(binary, package, module)
        if not shutil.which(binary):
            print(f"{name}: {binary} is not installed (apt-get install {package}); skipped", file=sys.stderr)
            continue
        runs = []
        for i in range(args.runs):
            workdir = tempfile.mkdtemp(prefix=f"pzq-peer-{name}-")
            print(f"{name} run {i + 1} of {args.runs} ...", file=sys.stderr)
            peer = cls(workdir)
            try:
                runs.append(one_run(peer, options))
            finally:
                peer.stop()
                shutil.rmtree(workdir, ignore_errors=True)
        results[name] = medians(runs)
    names = [n for n in ("pzq", *args.peers.split(",")) if n in results]
    header = f"{'figure':<28}" + "".join(f"{n:>12}" for n in names) + "".join(f"{'pzq/' + n:>14}" for n in names[1:])
    print(header)
    for label, key in ROWS:
        values = [results[n].get(key) for n in names]
        ratios = [f"{results['pzq'][key] / v:.2f}x" if v and key in results["pzq"] else "" for v in values[1:]]
        print(f"{label:<28}" + "".join(f"{_fmt(v):>12}" for v in values) + "".join(f"{r:>14}" for r in ratios))
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nJSON written to {args.json}")


def _install(binary: str, package: str, module: str) -> None:
    if not shutil.which(binary):
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", package],
            check=False,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        )
    try:
        __import__(module)
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", module], check=False)


if __name__ == "__main__":
    main()
