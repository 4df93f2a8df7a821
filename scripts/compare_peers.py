#!/usr/bin/env python3
"""pzq's batched and legacy clients beside Redis Streams and RabbitMQ, in one run, with the same number of
messages in flight for every system; ratios to Redis and server CPU µs per message.

    .venv/bin/python scripts/compare_peers.py [--install] [--runs 3] [--in-flight 100] [--before db15207]
        [--server-arg=--max-message-size --server-arg=16M]   (this pzq's server only: what a setting costs)
    .venv/bin/python scripts/compare_peers.py --peers '' --client batched   (pzq's batched phases alone)

Each round runs every system once, in turn (load that comes and goes falls on all alike); the table shows
medians over the rounds. N (--in-flight) messages in flight for every producer and consumer:
- pzq batched (PZQ-BATCH/1, `pzq bench --client batched`): batches of --batch-size, N // batch-size
  batches in flight; a BatchConsumer with credit N that acks each received batch and waits for SETTLED.
- pzq legacy (`pzq bench`): a window of N unacked messages; the server's push consumer.
- pzq before (--before REV, a revision of this repository unpacked by `git archive`, or --pzq-tree PATH):
  the legacy phases on that pzq's server, in the same rounds.
- Redis Streams (`appendonly yes`, `appendfsync always`): raw RESP XADDs on one socket, replies parsed by
  hiredis, N in flight (as replies come, as many new XADDs go out in one write); consumers XREADGROUP
  COUNT N with each batch's XACK in the same write as the next read.
- RabbitMQ: a durable quorum queue, persistent messages, asynchronous publisher confirms (N unconfirmed),
  consumers with prefetch N and one `multiple` ack every N/2 deliveries.
The phases, processes, body stamps and figures are pzq bench's own (pzq.bench.phases.run_phase), so the
only difference between the columns is the system under test and its client. Server CPU is read from
/proc for the server's processes (RabbitMQ: its whole session, the Erlang VM included). `--install`
apt-installs the servers and pip-installs the Python clients (redis, hiredis, pika) when missing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
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
from pzq.bench.report import _fmt, flatten, machine, medians
from pzq.bench.server import cpu_seconds, free_ports
from pzq.bench.workers import BODY_HEAD, TAG_SHIFT, ConsumerResult, ProducerResult

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

        self.error = hiredis.ReplyError
        self.sock = socket.create_connection(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def send(self, packed: bytes) -> None:
        self.sock.sendall(packed)

    def replies(self) -> int:
        """Wait for at least one reply; how many replies were read (all those already here)."""
        count = 0
        while True:
            reply = self.reader.gets()
            if reply is not False:
                if isinstance(reply, self.error):
                    raise ConnectionError(f"redis: {reply}")
                count += 1
                continue
            if count:
                return count
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.reader.feed(data)

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
    """XADD with ``job.window`` commands in flight: each time replies come (after the fsync of the event
    loop turn that read their commands), as many new commands go out in one write (sliding, as RabbitMQ's
    confirms and pzq's acks). Paced: one command at a time at the rate, waiting for its reply."""
    client = _RawRedis(job.endpoint)
    pad = b"x" * max(0, job.size - BODY_HEAD.size)
    stream = STREAM.encode()
    latencies: list[int] = []
    sent_at: collections.deque[int] = collections.deque()
    acked = sent = 0
    interval_ns = int(1e9 / job.rate) if job.rate else 0
    start.wait()
    t0 = time.monotonic_ns()
    while acked < job.count:
        room = min(job.window - len(sent_at), job.count - sent)
        if interval_ns:
            due = t0 + sent * interval_ns - time.monotonic_ns()
            if due > 0:
                time.sleep(due / 1e9)
            room = 1
        if room > 0:
            now = time.monotonic_ns()
            client.send(
                b"".join(
                    _resp(b"XADD", stream, b"*", b"b", BODY_HEAD.pack(now, (job.index << TAG_SHIFT) | i) + pad)
                    for i in range(sent, sent + room)
                )
            )
            sent_at.extend([now] * room)
            sent += room
        got = client.replies()  # every reply that has come (at least one)
        now = time.monotonic_ns()
        for _ in range(got):
            latencies.append(now - sent_at.popleft())
        acked += got
        with progress.get_lock():
            progress.value += got
    results.put(ProducerResult(job.index, acked, 0, (time.monotonic_ns() - t0) / 1e9, latencies))


def redis_consumer(job, start, progress, done, results) -> None:
    client = _RawRedis(job.endpoint)
    stream, group = STREAM.encode(), GROUP.encode()
    read = _resp(
        b"XREADGROUP",
        b"GROUP",
        group,
        b"c%d" % job.index,
        b"COUNT",
        b"%d" % job.credit,
        b"BLOCK",
        b"50",
        b"STREAMS",
        stream,
        b">",
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
            sent_ns, tag = BODY_HEAD.unpack_from(fields[1])
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
    pad = b"x" * max(0, job.size - BODY_HEAD.size)
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
            ch.basic_publish("", QUEUE, BODY_HEAD.pack(now, (job.index << TAG_SHIFT) | i) + pad, props)
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
    ch.basic_qos(prefetch_count=job.credit)
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
        if stats["unacked"] >= max(1, job.credit // 2):  # half the prefetch: the broker never waits on us
            ack_all()
        sent_ns, tag = BODY_HEAD.unpack_from(body)
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


# (label, key): every system's figures under the same keys; pzq batched's are renamed to them (BATCHED).
ROWS = [
    ("producer, window 1 (msg/s)", "producer_w1.msg_s"),
    ("  ack p50 (ms)", "producer_w1.ack_p50_ms"),
    ("  ack p99 (ms)", "producer_w1.ack_p99_ms"),
    ("producer, N in flight (msg/s)", "producer_w100.msg_s"),
    ("  ack p50 (ms)", "producer_w100.ack_p50_ms"),
    ("consumer, draining (msg/s)", "consumer.msg_s"),
    ("end to end (msg/s)", "e2e.msg_s"),
    ("  latency p50 (ms)", "e2e.lat_p50_ms"),
    ("  latency p99 (ms)", "e2e.lat_p99_ms"),
    ("  lost", "e2e.lost"),
    ("paced latency p50 (ms)", "e2e_paced.lat_p50_ms"),
    ("paced latency p99 (ms)", "e2e_paced.lat_p99_ms"),
    ("server CPU µs/msg, window 1", "producer_w1.server_cpu_us"),
    ("server CPU µs/msg, produce", "producer_w100.server_cpu_us"),
    ("server CPU µs/msg, draining", "consumer.server_cpu_us"),
    ("server CPU µs/msg, e2e", "e2e.server_cpu_us"),
    ("server CPU, produce (%)", "producer_w100.server_cpu_pct"),
    ("server CPU, e2e (%)", "e2e.server_cpu_pct"),
    ("commits, produce", "producer_w100.commits"),
    ("  of which synced a meta page alone", "producer_w100.meta_syncs"),
    ("commits, e2e", "e2e.commits"),
    ("  of which synced a meta page alone", "e2e.meta_syncs"),
]
BATCHED = {"producer_batched.": "producer_w100.", "consumer_batched.": "consumer.", "e2e_batched.": "e2e."}
LEGACY = ("producer_w1.", "producer_w100.", "consumer.", "e2e.", "e2e_paced.")
# The targets (issue 40): (column, key, op, other column or None, goal)
TARGETS = [
    ("pzq batched", "producer_w100.msg_s", ">=", "redis", 1.5),
    ("pzq batched", "e2e.msg_s", ">=", "redis", 1.0),
    ("pzq batched", "consumer.server_cpu_us", "<=", None, 8),
    ("pzq legacy", "producer_w100.msg_s", ">=", "pzq before", 1.0),
    ("pzq legacy", "e2e.server_cpu_us", "<=", "pzq before", 0.7),
    ("pzq legacy", "producer_w1.ack_p50_ms", "<=", "pzq before", 1.0),
]


def columns(run: dict) -> dict[str, dict]:
    """One run of pzq (--client both) as two columns, batched and legacy, under the common keys."""
    run = flatten(run)
    batched = {BATCHED[p] + k[len(p) :]: v for k, v in run.items() for p in BATCHED if k.startswith(p)}
    legacy = {k: v for k, v in run.items() if k.startswith(LEGACY)}
    return {"pzq batched": batched, "pzq legacy": legacy}


def table(results: dict[str, dict], names: list[str]) -> list[str]:
    """The medians side by side, each pzq column's ratio to Redis, and legacy's to the tree before."""
    ratios = [(n, "redis") for n in names if n.startswith("pzq") and "redis" in names]
    ratios += [("pzq legacy", "pzq before")] if "pzq before" in names else []
    head = f"{'figure':<32}" + "".join(f"{n:>13}" for n in names)
    lines = [head + "".join(f"{a.split()[-1] + '/' + b.split()[-1]:>16}" for a, b in ratios)]
    for label, key in ROWS:
        values = [results[n].get(key) for n in names]
        if all(v is None for v in values):
            continue
        cells = []
        for a, b in ratios:
            x, y = results[a].get(key), results[b].get(key)
            cells.append(f"{x / y:.2f}x" if x is not None and y else "")
        lines.append(f"{label:<32}" + "".join(f"{_fmt(v):>13}" for v in values) + "".join(f"{c:>16}" for c in cells))
    lines.append("")
    for column, key, op, other, goal in TARGETS:
        if column not in results or key not in results[column] or (other and other not in results):
            continue
        value = results[column][key]
        if other:
            base = results[other].get(key)
            value = value / base if base else float("nan")
        met = value >= goal if op == ">=" else value <= goal
        what = f"{column} {key}" + (f" / {other}" if other else "")
        lines.append(f"target {what} {op} {goal:g}: {value:.3g} {'met' if met else 'NOT met'}")
    return lines


def before_tree(rev: str | None, tree: str | None, workdir: str) -> str | None:
    """The pzq tree to compare the legacy figures with: ``tree``, or ``rev`` unpacked by git archive."""
    if tree:
        return os.path.abspath(tree)
    if not rev:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", root, "archive", rev, "pzq"], capture_output=True, check=True).stdout
    target = os.path.join(workdir, f"pzq-{rev}")
    os.makedirs(target)
    subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default="redis,rabbitmq", help="comma-separated; '' for pzq alone")
    parser.add_argument("--runs", type=int, default=3, help="rounds; each runs every system once, in turn")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--latency-count", type=int, default=10_000)
    parser.add_argument("--in-flight", "--window", dest="window", type=int, default=100, help="for every system")
    parser.add_argument("--batch-size", type=int, default=50, help="pzq batched: messages per batch")
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--paced-seconds", type=float, default=5)
    parser.add_argument("--before", help="a git revision of this repository: its pzq's legacy figures too")
    parser.add_argument("--pzq-tree", help="a folder holding another pzq package: its legacy figures too")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="extra `pzq serve` argument for this pzq (repeatable)"
    )
    parser.add_argument(
        "--client",
        choices=("both", "batched", "legacy"),
        default="both",
        help="this pzq's clients: both columns, or only one (its phases alone: e.g. the batched drain's figures)",
    )
    parser.add_argument("--install", action="store_true", help="apt/pip-install what is missing")
    parser.add_argument("--json", default="compare-peers.json")
    args = parser.parse_args()
    if min(args.runs, args.count, args.latency_count, args.window, args.batch_size) < 1:
        parser.error("--runs, --count, --latency-count, --in-flight, --batch-size: at least 1")
    options = BenchOptions(
        count=args.count,
        latency_count=args.latency_count,
        window=args.window,
        producers=args.producers,
        consumers=args.consumers,
        paced_seconds=args.paced_seconds,
        runs=1,
        ceiling=False,
        batch_size=args.batch_size,
    )
    peers = {
        "redis": (RedisPeer, "redis-server", "redis-server", ("redis", "hiredis")),
        "rabbitmq": (RabbitPeer, "rabbitmq-server", "rabbitmq-server", ("pika",)),
    }
    chosen = [n for n in args.peers.split(",") if n]
    for name in chosen:
        cls, binary, package, modules = peers[name]
        if args.install:
            _install(binary, package, modules)
    chosen = [n for n in chosen if _usable(n, *peers[n][1:])]
    scratch = tempfile.mkdtemp(prefix="pzq-compare-")
    try:
        tree = before_tree(args.before, args.pzq_tree, scratch)
        runs: dict[str, list[dict]] = {}
        progress = Progress(True)
        for i in range(args.runs):
            # Every system once per round, in turn: load that comes and goes on a shared machine falls
            # on all of them alike.
            print(f"round {i + 1} of {args.runs}: pzq (batched and legacy) ...", file=sys.stderr)
            run, _ = bench.one_run(
                dataclasses.replace(options, client=args.client, server_args=tuple(args.server_arg)), progress
            )
            for column, figures in columns(run).items():
                if figures:  # (--client batched or legacy: the other column has no figures)
                    runs.setdefault(column, []).append(figures)
            if tree:
                print(f"round {i + 1}: pzq before ({args.before or tree}, legacy) ...", file=sys.stderr)
                run, _ = bench.one_run(dataclasses.replace(options, client="legacy"), progress, code=tree)
                runs.setdefault("pzq before", []).append(columns(run)["pzq legacy"])
            for name in chosen:
                workdir = tempfile.mkdtemp(prefix=f"pzq-peer-{name}-")
                print(f"round {i + 1}: {name} ...", file=sys.stderr)
                peer = peers[name][0](workdir)
                try:
                    runs.setdefault(name, []).append(flatten(one_run(peer, options)))
                finally:
                    peer.stop()
                    shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {name: medians(r) for name, r in runs.items()}
    names = [n for n in ("pzq batched", "pzq legacy", "pzq before", "redis", "rabbitmq") if n in results]
    print(
        f"{args.runs} round(s), medians; {args.count:,} messages a phase, {args.window} in flight for every "
        f"system (pzq batched: batches of {min(args.batch_size, args.window)}); load before: {_load()}"
    )
    print("\n".join(table(results, names)))
    with open(args.json, "w") as f:
        json.dump({"machine": machine(), "options": vars(args), "runs": runs, "median": results}, f, indent=2)
    print(f"\nJSON written to {args.json}")


def _load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def _usable(name: str, binary: str, package: str, modules: tuple[str, ...]) -> bool:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not shutil.which(binary) and not os.path.exists(f"/usr/lib/rabbitmq/bin/{binary}"):
        missing.insert(0, binary)
    if missing:
        print(
            f"{name}: {', '.join(missing)} missing (--install, or apt-get install {package}); skipped", file=sys.stderr
        )
    return not missing


def _install(binary: str, package: str, modules: tuple[str, ...]) -> None:
    """Debian's package of the server (apt-get update first, once: a fresh machine has no lists) and the
    Python clients from PyPI, each only when missing."""
    if not shutil.which(binary):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=False, env=env)
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=False)
        importlib.invalidate_caches()


if __name__ == "__main__":
    main()
