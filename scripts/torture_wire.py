"""The torture benchmark's own parts (scripts/torture.py): a `pzq serve` subprocess of whichever tree is
on PYTHONPATH, a sampler of its anonymous RSS, tiny wire helpers for every protocol, and the six honest
clients, each run in a process of its own.

Nothing here imports pzq: the same script measures today's tree and an old one (PYTHONPATH pointing to a
`git archive` of it), since only the wire and the `pzq serve` flags have to be the same.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import msgpack
import zmq

OP_TIMEOUT_S = 60.0  # an honest operation still unanswered after this is counted as lost
PAUSE_S = 0.005  # between two honest operations: each client measures, it is not a load


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def monitor(endpoint: str, request: str = "STATS", timeout_ms: int = 10_000):
    """One monitor request; STATS answers are JSON (None when no answer came)."""
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        sock.send_string(request)
        if not sock.poll(timeout_ms):
            return None
        text = sock.recv().decode("utf-8", "replace")
        return json.loads(text) if request == "STATS" else text
    finally:
        sock.close(0)


def find(figures, name: str):
    """The first value named ``name`` anywhere in nested STATS figures (their layout moves between trees)."""
    if isinstance(figures, dict):
        if name in figures:
            return figures[name]
        for value in figures.values():
            found = find(value, name)
            if found is not None:
                return found
    return None


def depth(endpoint: str, queue: str) -> int | None:
    figures = monitor(endpoint)
    return None if figures is None else int(figures.get("queues", {}).get(queue, {}).get("depth", 0))


class Server:
    """`python -m pzq serve` on a temp store, every gateway on loopback TCP, its RssAnon sampled."""

    def __init__(self, *extra: str):
        # (a port free_ports found may be taken before the server binds it, as an outgoing connection's
        # ephemeral port, or be the one the batched consumers' "auto" endpoint makes of the send port (+2;
        # not named here: older trees, run with --before, have no such setting): the server then exits
        # naming the endpoint, and is started again on other ports)
        for attempt in range(3):
            failure = self._start(extra)
            if failure is None:
                break
            if attempt == 2 or not any(why in failure for why in ("bind", "in use", "give it another")):
                raise RuntimeError(f"pzq serve did not start: {failure}")

    def _start(self, extra: tuple[str, ...]) -> str | None:
        """Start the server on fresh ports: None once it answers MONITOR, else the end of its log."""
        self.workdir = tempfile.mkdtemp(prefix="pzq-torture-")
        ports = iter(free_ports(10))
        tcp = {n: f"tcp://127.0.0.1:{next(ports)}" for n in ("receive", "send", "monitor", "phpmq", "mqks", "api")}
        tcp |= {n: f"tcp://127.0.0.1:{next(ports)}" for n in ("emqp_frontend", "emqp_backend", "http")}
        self.__dict__.update(tcp)
        self.mqks_port = int(self.mqks.rpartition(":")[2])
        self.phpmq_port = int(self.phpmq.rpartition(":")[2])
        self.http = self.http.replace("tcp://", "http://")
        argv = [sys.executable, "-m", "pzq", "serve", "--database", f"{self.workdir}/db", "--log-level", "warning"]
        argv += ["--disk-reserve", "0", "--emqp-publish-dsn", ""]
        for name in ("receive", "send", "monitor", "phpmq", "mqks", "api", "emqp_frontend", "emqp_backend"):
            argv += ["--" + name.replace("_", "-") + "-dsn", getattr(self, name)]
        self.log = f"{self.workdir}/server.log"
        with open(self.log, "ab") as log:
            extra = tuple(arg.replace("{http}", self.http) for arg in extra)  # (the console's port is ours)
            # (cwd: `python -m` looks in the working directory first, where another tree's pzq may be)
            self.proc = subprocess.Popen(
                [*argv, *extra], cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while monitor(self.monitor, "MONITOR", timeout_ms=200) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log, errors="replace") as log:  # (read before close() removes the folder)
                    failure = log.read()[-800:] or f"exit code {self.proc.poll()}, nothing logged"
                self.close()
                return failure
        return None
        self.peak_anon_kb = 0
        self.began = time.monotonic()
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def rss_anon_kb(self) -> int:
        """The server's anonymous resident memory now (file-backed LMDB pages left out), 0 once gone."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while self._sampling:
            self.peak_anon_kb = max(self.peak_anon_kb, self.rss_anon_kb())
            time.sleep(0.01)

    def begin(self) -> None:
        """The case's measured part begins (a case calls it again once its preparation is done)."""
        self.began = time.monotonic()
        self.peak_anon_kb = self.rss_anon_kb()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self._sampling = False
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # a tortured server owes no clean shutdown
            self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


# -- wire helpers -----------------------------------------------------------------------------------


def phpmq(msg_type: int, packets: list[tuple[int, bytes]]) -> bytes:
    """One PHPMQ message (specs/phpmq.md): an 8-byte header, then 32-byte packet headers and contents."""
    out = [b"H01%03d%02d" % (msg_type, len(packets))]
    for kind, content in packets:
        out += [b"P%02d%029d" % (kind, len(content)), content]
    return b"".join(out)


def phpmq_take(buf: bytearray) -> dict[int, bytes] | None:
    """One whole PHPMQ message from the front of ``buf`` (removed), or None while it is incomplete."""
    if len(buf) < 8:
        return None
    pos, packets = 8, {}
    for _ in range(int(buf[6:8])):
        if len(buf) < pos + 32:
            return None
        length = int(buf[pos + 3 : pos + 32])
        if len(buf) < pos + 32 + length:
            return None
        packets[int(buf[pos + 1 : pos + 3])] = bytes(buf[pos + 32 : pos + 32 + length])
        pos += 32 + length
    del buf[:pos]
    return packets


def emqp(command: str, *args: str | bytes) -> list[bytes]:
    """An eMQP command as a DEALER sends it, with a fresh msgid."""
    frames = [b"", b"eMQP/1.0", command.encode(), str(uuid.uuid4()).encode()]
    return frames + [a if isinstance(a, bytes) else a.encode() for a in args]


def api_request(command: str, args: dict | bytes, request_id: bytes | None = None) -> list[bytes]:
    body = args if isinstance(args, bytes) else msgpack.packb(args, use_bin_type=True)
    return [b"", request_id or uuid.uuid4().hex.encode(), command.encode(), body]


def api_call(endpoint: str, command: str, args: dict, timeout_s: float = 60) -> tuple[bool, dict]:
    """One API request on a fresh DEALER: (ok, results)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    try:
        frames = api_request(command, args)
        sock.send_multipart(frames)
        while sock.poll(int(timeout_s * 1000)):
            answer = sock.recv_multipart()
            if len(answer) == 4 and answer[1] == frames[1]:
                return answer[2] == b"OK", msgpack.unpackb(answer[3], raw=False)
        return False, {"code": "no answer"}
    finally:
        sock.close(0)


# -- the honest clients: each measures the wait of one operation at a time --------------------------


class Honest:
    """Runs in its own process: ``op`` until ``stop`` is set, recording when each began and its wait
    (CLOCK_MONOTONIC is the same in every process: the parent keeps those begun within a case)."""

    def __init__(self, srv: dict, stop, ready):
        self.srv, self.stop, self.ready = srv, stop, ready
        self.ctx = zmq.Context()
        self.waits: list[tuple[float, float]] = []
        self.lost: list[float] = []

    def run(self) -> tuple[list[tuple[float, float]], list[float]]:
        """(start, wait) of every operation after the first, and the starts of those lost."""
        self.setup()
        while not self.stop.is_set():
            started = time.monotonic()
            done = self.op(lambda began=started: self.stop.is_set() or time.monotonic() - began > OP_TIMEOUT_S)
            if self.ready.is_set():
                self.waits.append((started, time.monotonic() - started))  # (one cut off by the stop: as it stood)
                if not done and not self.stop.is_set():
                    self.lost.append(started)
            self.ready.set()
            time.sleep(PAUSE_S)
        return self.waits, self.lost

    def socket(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        sock.connect(endpoint)
        return sock

    def setup(self) -> None:
        pass

    def op(self, give_up) -> bool:
        raise NotImplementedError


class NativeProducer(Honest):
    """Window 1: one message, wait for its ack."""

    def setup(self) -> None:
        self.sock, self.n = self.socket(zmq.DEALER, self.srv["receive"]), 0

    def op(self, give_up) -> bool:
        self.n += 1
        mid = b"h%d" % self.n
        self.sock.send_multipart([mid, b"", b"honest:%d" % time.monotonic_ns()])
        while not give_up():
            if self.sock.poll(50) and self.sock.recv_multipart()[0] == mid:
                return True
        return False


class NativeConsumer(Honest):
    """Acks every delivery at once; a wait is an honest message's time from its producer to here."""

    def setup(self) -> None:
        self.sock = self.socket(zmq.ROUTER, self.srv["send"])

    def run(self) -> tuple[list[tuple[float, float]], list[float]]:
        self.setup()
        self.ready.set()
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frames) < 5:
                    continue
                self.sock.send_multipart([frames[0], frames[1], b"1"])
                body = frames[5] if len(frames) > 5 else b""
                if body.startswith(b"honest:"):
                    sent = int(body[7:]) / 1e9
                    self.waits.append((sent, time.monotonic() - sent))
        return self.waits, self.lost


class Phpmq(Honest):
    """Sends one message on one connection and waits for its dispatch on another (PHPMQ has no receipt)."""

    def setup(self) -> None:
        port = self.srv["phpmq_port"]
        self.out = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.inn = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.inn.sendall(phpmq(2, [(1, b"honest-phpmq"), (4, b"10")]))
        self.inn.settimeout(0.05)
        self.buf = bytearray()

    def op(self, give_up) -> bool:
        tag = b"honest:%d" % time.monotonic_ns()
        self.out.sendall(phpmq(1, [(1, b"honest-phpmq"), (2, tag), (5, b"0")]))
        while not give_up():
            while (packets := phpmq_take(self.buf)) is not None:
                self.inn.sendall(phpmq(4, [(1, b"honest-phpmq"), (3, packets.get(3, b""))]))
                if packets.get(2) == tag:
                    return True
            try:
                chunk = self.inn.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                time.sleep(0.05)  # (closed by the server: this client has lost for good)
            self.buf += chunk
        return False


class Mqks(Honest):
    """Publishes one event and waits for its delivery to its own consumer."""

    def setup(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.srv["mqks_port"]), timeout=10)
        self.sock.sendall(b"hc consume --confirm honest-mqks honest.mqks\n")
        self.buf, self.n = b"", 0
        self.sock.settimeout(0.05)

    def op(self, give_up) -> bool:
        self.n += 1
        tag = b"%d" % time.monotonic_ns()
        self.sock.sendall(b"hp%d publish honest.mqks %s\n" % (self.n, tag))
        while not give_up():
            while b"\n" in self.buf:
                line, _, self.buf = self.buf.partition(b"\n")
                if line.startswith(b"hc ok ") and line.endswith(b" " + tag):
                    return True
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not chunk:
                time.sleep(0.05)
            self.buf += chunk
        return False


class Emqp(Honest):
    """A REQUEST with reply-requested, served by this process's own worker; a wait ends at the REPLY."""

    def setup(self) -> None:
        self.worker = self.socket(zmq.DEALER, self.srv["emqp_backend"])
        self.worker.send_multipart(emqp("INFORM", '[[10, "honest-emqp"]]', "worker"))
        self.worker.poll(10_000) and self.worker.recv_multipart()
        self.worker.send_multipart(emqp("READY"))
        self.client = self.socket(zmq.DEALER, self.srv["emqp_frontend"])
        self.beat = time.monotonic()

    def op(self, give_up) -> bool:
        frames = emqp("REQUEST", "honest-emqp", "reply-requested", '["run", {"callable": "x", "path": "y"}]')
        self.client.send_multipart(frames)
        poller = zmq.Poller()
        poller.register(self.client, zmq.POLLIN)
        poller.register(self.worker, zmq.POLLIN)
        while not give_up():
            if time.monotonic() - self.beat > 1:
                self.beat = time.monotonic()
                self.worker.send_multipart(emqp("HEARTBEAT", str(time.time())))
            events = dict(poller.poll(50))
            if self.worker in events:
                job = self.worker.recv_multipart()
                if len(job) > 3 and job[2] == b"REQUEST":
                    self.worker.send_multipart(emqp("REPLY", '{"value": 1}', job[3]))
                    self.worker.send_multipart(emqp("READY"))
            if self.client in events:
                answer = self.client.recv_multipart()
                if answer[2:3] == [b"REPLY"] and answer[-1] == frames[3]:
                    return True
        return False


class Api(Honest):
    """One PRODUCE of one message, waiting for its answer."""

    def setup(self) -> None:
        self.sock = self.socket(zmq.DEALER, self.srv["api"])

    def op(self, give_up) -> bool:
        frames = api_request("PRODUCE", {"messages": [["honest-api", b"x"]], "key": uuid.uuid4().hex})
        self.sock.send_multipart(frames)
        while not give_up():
            if self.sock.poll(50) and self.sock.recv_multipart()[1:2] == [frames[1]]:
                return True
        return False


CLIENTS = {
    "native-prod": NativeProducer,
    "native-cons": NativeConsumer,
    "phpmq": Phpmq,
    "mqks": Mqks,
    "emqp": Emqp,
    "api": Api,
}


def _client_main(kind: str, srv: dict, stop, ready, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        results.put((kind, *CLIENTS[kind](srv, stop, ready).run()))
    except Exception as exc:  # noqa: BLE001 - reported in the table, not a traceback per process
        results.put((kind, [], f"{type(exc).__name__}: {exc}"))


class HonestClients:
    """Every honest client in a process of its own, started and warmed up before a case."""

    def __init__(self, srv: Server, kinds: list[str]):
        mp = multiprocessing.get_context("fork")  # (started in milliseconds; each makes its own zmq context)
        endpoints = {n: getattr(srv, n) for n in ("receive", "send", "api", "emqp_frontend", "emqp_backend")}
        endpoints |= {"mqks_port": srv.mqks_port, "phpmq_port": srv.phpmq_port}
        self.stop, self.results = mp.Event(), mp.Queue()
        self.ready = {kind: mp.Event() for kind in kinds}
        self.procs = [
            mp.Process(
                target=_client_main,
                args=(kind, endpoints, self.stop, self.ready[kind], self.results),
                daemon=True,
            )
            for kind in kinds
        ]
        for proc in self.procs:
            proc.start()
        deadline = time.monotonic() + 30
        for event in self.ready.values():
            event.wait(max(0.1, deadline - time.monotonic()))

    def finish(self, since: float) -> dict[str, tuple[list[float], int | str]]:
        """Stop every client; each one's waits of operations begun ``since`` (a monotonic time), and
        how many of those were lost (or the error that stopped the client)."""
        self.stop.set()
        out: dict[str, tuple[list[float], int | str]] = {}
        deadline = time.monotonic() + 30
        while len(out) < len(self.procs) and time.monotonic() < deadline:
            try:
                kind, waits, lost = self.results.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - queue.Empty: a client that never answered
                break
            if isinstance(lost, str):
                out[kind] = ([], lost)
            else:
                out[kind] = ([w for t, w in waits if t >= since], sum(1 for t in lost if t >= since))
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        return out
