"""Fixtures per real backend: a real LMDB store in tmp_path, real servers (in a thread or a subprocess),
real ZeroMQ sockets on ipc endpoints in a temp dir, all closed with linger=0."""

from __future__ import annotations

import dataclasses
import gc
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from pzq import config
from pzq.clients import native as client
from pzq.server import Server, loop
from pzq.server.collector import Collector
from pzq.store import Store

import session_guard
from permission_keys import Tenants


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "db", max_size=64 << 20)
    yield s
    s.close()


def make_config(tmp_path: Path, **overrides) -> config.Config:
    values = dict(
        database=str(tmp_path / "db"),
        receive_dsn=f"ipc://{tmp_path}/receive",
        send_dsn=f"ipc://{tmp_path}/send",
        consume_dsn=f"ipc://{tmp_path}/consume",
        monitor_dsn=f"ipc://{tmp_path}/monitor",
        ack_timeout=1.0,
        phpmq_dsn="",
        emqp_frontend_dsn="",
        emqp_backend_dsn="",
        emqp_publish_dsn="",
        api_dsn="",
        mqks_dsn="",
        disk_reserve=0,
    )  # (pytest keeps its temp dirs: no reserve file in each; tests of it ask)
    values.update(overrides)
    return config.Config(**values).validate()


class InProcessCollector(Collector):
    """The server's garbage-collector rule, less its start-up walks, for a server in the test process.

    At start the real one walks every object twice (collect, then unfreeze, collect and freeze) to free
    start-up's garbage and weigh a frozen object; in a test process that is pytest's heap and every
    earlier test's, 60-80 ms of CPU a server (measured, 58,000 objects), paid by each of the fast tier's
    hundreds of in-process servers. The rest of the rule (freeze what a full collection leaves, a whole
    walk when due, unfreeze at stop) is the server's own. The rule itself is tested on its own
    (tests/test_turn_length.py, tests/test_collector.py) and in every subprocess server."""

    def start(self, now: float) -> None:
        gc.freeze()  # (as the real one leaves it, uncollected: splicing lists, no walk)
        self._next_whole = now + self.whole_s
        if self._collected not in gc.callbacks:
            gc.callbacks.append(self._collected)


loop.Collector = InProcessCollector  # (every Server made in this process: run() makes its collector)


class ThreadServer:
    """A real Server running its loop in a thread of the test process."""

    def __init__(self, cfg: config.Config):
        self.config = cfg
        self.server = Server(cfg, context=zmq.Context.instance())
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        # (a bound for a hang, not a speed: a start that reads 20,000 networks took over 10 s beside a
        # busy core; the thread reports a failed start at once)
        if not self._ready.wait(60):
            raise RuntimeError("server did not start")
        if self._error:
            raise self._error

    def _run(self) -> None:
        try:
            self.server.start()
        except BaseException as exc:  # reported to the test thread, once everything it opened is closed
            self._error = exc
            self.server.close()
            self._ready.set()
            return
        self._ready.set()
        try:
            self.server.run()
        finally:
            self.server.close()

    @property
    def receive(self) -> str:
        return self.config.receive_dsn

    @property
    def send(self) -> str:
        return self.config.send_dsn

    @property
    def monitor(self) -> str:
        return self.config.monitor_dsn

    def stats(self) -> dict:
        return client.stats(self.monitor)

    def cpu_s(self) -> float:
        """CPU seconds the server's loop thread has used: what its work cost, however busy the machine
        (a wall-clock bound fails when other processes take the cores)."""
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.stop()
            self._thread.join(30)
            if self._thread.is_alive():
                raise RuntimeError("server thread did not stop")


@pytest.fixture
def make_server(tmp_path):
    """make_server(**config overrides) -> a started ThreadServer; all are stopped after the test."""
    made: list[ThreadServer] = []

    def make(**overrides) -> ThreadServer:
        srv = ThreadServer(make_config(tmp_path, **overrides))
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()


@pytest.fixture
def tenants(tmp_path) -> Tenants:
    """CURVE keys of two tenants (orders, payroll) and a stranger, with a permissions file beside the
    clients directory (tests/permission_keys.py)."""
    return Tenants(tmp_path / "keys")


@pytest.fixture
def server(make_server):
    return make_server()


class ProcessServer:
    """`python -m pzq serve` as a real subprocess, restartable on the same database."""

    def __init__(self, tmp_path: Path, *extra: str, ack_timeout: int | str = 1_000_000, env: dict | None = None):
        self.tmp_path = tmp_path
        self.env = None if env is None else {**os.environ, **env}
        self.database = tmp_path / "db"
        self.receive = f"ipc://{tmp_path}/receive"
        self.send = f"ipc://{tmp_path}/send"
        self.consume = f"ipc://{tmp_path}/consume"
        self.monitor = f"ipc://{tmp_path}/monitor"
        self.log = tmp_path / "server.log"
        self.argv = [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--database",
            str(self.database),
            "--receive-dsn",
            self.receive,
            "--send-dsn",
            self.send,
            "--monitor-dsn",
            self.monitor,
            "--ack-timeout",
            str(ack_timeout),
            *extra,
        ]
        if "--disk-reserve" not in extra:
            self.argv += ["--disk-reserve", "0"]
        if "--consume-dsn" not in extra:  # (its default is a fixed port: each server its own ipc file)
            self.argv += ["--consume-dsn", self.consume]
        for option in (
            "--phpmq-dsn",
            "--emqp-frontend-dsn",
            "--emqp-backend-dsn",
            "--emqp-publish-dsn",
            "--mqks-dsn",
            "--api-dsn",
        ):
            if option not in extra:  # gateways bind fixed default ports: off unless a test asks
                self.argv += [option, ""]
        self.proc: subprocess.Popen | None = None

    def start(self) -> ProcessServer:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                client.monitor_request(self.monitor, timeout_s=0.2)
                return self
            except client.ClientError:
                continue
        raise RuntimeError(f"server did not answer MONITOR: {self.log.read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
            raise

    def restart(self, sig: int = signal.SIGTERM) -> ProcessServer:
        self.stop(sig)
        return self.start()

    def stats(self) -> dict:
        return client.stats(self.monitor)


@pytest.fixture
def process_server(tmp_path):
    """process_server(*extra flags, ack_timeout=µs or "250ms", env={...}) -> a started subprocess server, reaped after
    the test."""
    made: list[ProcessServer] = []

    def make(*extra: str, ack_timeout: int | str = 1_000_000, env: dict | None = None) -> ProcessServer:
        srv = ProcessServer(tmp_path, *extra, ack_timeout=ack_timeout, env=env)
        made.append(srv)
        return srv.start()

    yield make
    for srv in made:
        try:
            srv.stop(signal.SIGKILL)
        except Exception:  # noqa: BLE001 - best effort reaping; the test result is what matters
            pass


@pytest.fixture
def sockets():
    """sockets(kind, endpoint) -> a socket (connected unless endpoint is None), closed after the test.

    Closed with a short linger, not 0: libzmq 4.3 aborts the whole process (session_base.cpp:233,
    "Resource temporarily unavailable") when a socket closed with linger 0 still has a multipart
    message half taken by its engine and the peer goes away at that moment (a server the test stops
    next). With a linger the engine finishes the message it began; zmq_close never blocks either way."""
    ctx = zmq.Context.instance()
    made: list[zmq.Socket] = []

    def make(kind: int, endpoint: str | None) -> zmq.Socket:
        s = ctx.socket(kind)
        s.linger = 0
        if endpoint is not None:
            s.connect(endpoint)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close(linger=100)


def recv(sock: zmq.Socket, timeout_ms: int = 5000) -> list[bytes]:
    """The next multipart message, failing the test (never hanging) if none arrives in time."""
    if not sock.poll(timeout_ms):
        pytest.fail(f"nothing received within {timeout_ms} ms")
    return sock.recv_multipart()


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.02):
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


def wait_connected(sock: zmq.Socket, endpoint: str, timeout_ms: int = 5000) -> zmq.Socket:
    """Connect ``sock`` and return once the ZMTP handshake with the server is done (a socket monitor
    event, not a sleep), so the server's DEALER already counts it among its peers."""
    mon = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sock.connect(endpoint)
        if not mon.poll(timeout_ms):
            pytest.fail(f"no handshake with {endpoint} within {timeout_ms} ms")
        mon.recv_multipart()
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
    return sock


def mqks_barrier(conn) -> list[str]:
    """Every line the server sends ``conn`` (an MqksClient) before a barrier: "nothing more arrives"
    without a fixed wait. A ping is answered in the turn that reads it, in order after that turn's
    other answers but possibly before its deliveries; a second ping, sent once the first is
    answered, is read in a later turn, so its answer follows everything the server sent ``conn``
    for any request made before the barrier."""
    got = []
    for _ in range(2):
        token = f"barrier-{secrets.token_hex(4)}"
        conn.send(f"{token} ping {token}")
        while (line := conn.read_line()) != f"{token} ok {token}":
            if line is None:
                pytest.fail(f"no answer to the barrier ping within {conn.timeout_s} s")
            got.append(line)
    return got


def free_tcp_endpoint() -> tuple[str, tuple[str, int]]:
    """A tcp:// endpoint on a free loopback port, and its (host, port) for plain sockets."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"tcp://127.0.0.1:{port}", ("127.0.0.1", port)


def local_spark(master: str, app: str):
    """A local Spark session with pzq's data source, for a module fixture to yield from and stop (a JVM
    that compiles less: these jobs are small and short, and its start was most of their time)."""
    from pyspark.sql import SparkSession

    from pzq.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def steady_ports(n: int, low: int, high: int) -> list[int]:
    """``n`` loopback ports free now between ``low`` and ``high`` (below the kernel's ephemeral range, each
    caller its own span): a server restarted on its ports must find them, and while it is down a port of
    the ephemeral range may be given to any outgoing connection, even one of its own clients reconnecting
    to it (TCP's self-connect), which then talks to itself."""
    import random

    for _ in range(50):
        ports = random.sample(range(low, high), n)
        held = []
        try:
            for port in ports:
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return ports
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError(f"no {n} free loopback ports between {low} and {high}")


@dataclasses.dataclass
class EveryGateway:
    """A subprocess server with every endpoint on: raw-TCP addresses, ZeroMQ endpoints."""

    server: ProcessServer
    phpmq: tuple[str, int]
    mqks: tuple[str, int]
    emqp_front: str
    emqp_back: str
    api: str


def start_every_gateway(process_server, tmp_path: Path, *extra: str) -> EveryGateway:
    for attempt in range(3):
        phpmq_dsn, phpmq_addr = free_tcp_endpoint()
        mqks_dsn, mqks_addr = free_tcp_endpoint()
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        api_dsn = f"ipc://{tmp_path}/api"
        try:
            srv = process_server(
                "--phpmq-dsn",
                phpmq_dsn,
                "--mqks-dsn",
                mqks_dsn,
                "--emqp-frontend-dsn",
                front,
                "--emqp-backend-dsn",
                back,
                "--api-dsn",
                api_dsn,
                *extra,
            )
        except RuntimeError as exc:
            # A free port can be taken by another process (a client's ephemeral port) before the
            # server binds it: choose again.
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
            continue
        return EveryGateway(srv, phpmq_addr, mqks_addr, front, back, api_dsn)
    raise AssertionError("unreachable")


# The slow tier: real subprocess servers (restarts, kill -9, full disks), the real eventmq and PHP
# clients, Spark, the fuzzers and the benchmarks. `pytest -m "not slow"` runs the rest, the fast tier.
# The etcd tests' fixtures (etcd, prefix, shards): tests/etcd_cluster.py, loaded as a plugin.
pytest_plugins = ["etcd_cluster"]

SLOW_MODULES = {
    "test_crash",
    "test_etcd_placement",
    "test_etcd_faults",
    "test_fuzz_sockets",
    "test_fuzz_decoders",
    "test_bench",
    "test_torture",
    "test_emqp_eventmq",
    "test_spark",
    "test_spark_shards",
    "test_limits",
    "test_full_disk",
    "test_systemd",
    "test_damaged_store",
    "test_durability",
}
# `pzq console` is a server of its own (a web stack in a subprocess): its tests are the slow tier's too.
SLOW_FIXTURES = {"process_server", "emqp_server", "api_server", "spark", "console", "operator"}
# Tests of a fast module that start a server process themselves (`pzq serve`, `pzq console`).
SLOW_TESTS = {
    "test_console_process.py::test_serve_with_an_http_dsn_starts_the_console_as_a_lower_priority_child_whose_page_answers",
    "test_console_process.py::test_a_killed_console_is_started_again_and_its_end_logged",
    "test_console_process.py::test_sigterm_to_serve_stops_the_console_first",
    "test_console_process.py::test_a_sigkilled_serve_takes_its_console_with_it",
    "test_console_process.py::test_a_console_port_already_taken_is_retried_with_a_growing_wait_while_producers_are_served",
    "test_console_process.py::test_with_curve_the_console_reaches_pzq_with_its_own_key_which_proc_never_shows",
    "test_console_process.py::test_a_sighup_reaches_the_console_whose_key_stays_allowed_after_the_clients_directory_is_reread",
    "test_cli.py::test_json_logs_are_one_object_per_line",
    "test_local_files.py::test_the_default_monitor_socket_lives_in_the_private_store_directory",
    "test_console.py::test_the_console_stops_with_status_0_when_its_stdin_pipe_ends_as_when_pzq_serve_is_killed",
    "test_console.py::test_a_port_in_use_is_one_clear_line_and_a_non_zero_exit",
    "test_console.py::test_the_console_serves_while_pzq_is_not_there_yet_and_ends_with_status_0_on_sigterm",
    "test_console.py::test_with_curve_the_console_reads_pzq_with_its_own_key_from_a_file_or_stdin_and_a_strangers_reads_nothing",
    "test_console.py::test_the_console_takes_its_endpoints_and_host_names_from_the_servers_config_file",
    "test_curve.py::test_with_curve_the_web_console_starts_only_when_named_unauthenticated",
    "test_bench_batched.py::test_batched_and_legacy_clients_run_side_by_side_and_lose_nothing",  # (the bench's
    "test_bench_batched.py::test_batched_alone_runs_no_legacy_phase_and_no_ceiling",  # own server process)
    "test_bench_batched.py::test_a_batched_producer_against_a_server_without_batches_reports_it_instead_of_waiting",
}
# Run by pytest-xdist (scripts/test: -n 2 --dist loadgroup), the tests of one group go to one worker:
# a module whose expensive module fixture (a Spark session and its JVM, a Spark cluster, the power-cut
# shim built with cc) is made once, not once per worker; and the tests that bind pzq's default TCP ports
# (a `serve` with its defaults), which two workers would otherwise bind at once.
SHARED_MODULES = {
    "test_spark",
    "test_spark_shards",
    "test_spark_cluster",
    "test_power_cut",
    "test_native_batch_powercut",
}
DEFAULT_PORTS = {
    "test_cli.py::test_json_logs_are_one_object_per_line",
    "test_cli.py::test_an_endpoint_in_use_is_reported_without_a_traceback",
    "test_curve.py::test_with_curve_the_default_raw_tcp_gateways_stop_the_server_with_one_line",
    "test_local_files.py::test_the_default_monitor_socket_lives_in_the_private_store_directory",
}


# The dearest modules (about half of a whole run's seconds), started first: xdist hands a worker the next
# test as it finishes one, so a long test collected last (torture, at "t") kept one worker busy for a
# minute and more while the other had nothing left. Groups go out before single tests whatever this order
# (xdist's --loadscope-reorder, by size): the two Spark modules start at once, one on each worker.
FIRST = [
    "test_spark_cluster",
    "test_spark",
    "test_spark_shards",
    "test_torture",
    "test_cluster_faults",
    "test_etcd_faults",
    "test_bench",
    "test_fuzz_decoders",
    "test_damaged_store",
    "test_console",
    "test_full_disk",
    "test_emqp_eventmq",
    "test_durability",
    "test_console_process",
    "test_crash",
]


def xdist_group_of(nodeid: str) -> str:
    """The unit of work a test goes out in: its SHARED_MODULES module, "default-ports", or itself."""
    path, _, rest = nodeid.partition("::")
    module = path.rpartition("/")[2].removesuffix(".py")
    if module in SHARED_MODULES:
        return module
    if f"{module}.py::{rest.partition('[')[0].partition('@')[0]}" in DEFAULT_PORTS:
        return "default-ports"
    return nodeid


def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup with the groups above, read from the test ids by the controller itself: xdist
    3.8 names a marked test's group by rewriting ``item._nodeid``, which pytest 9.2 no longer reads
    (``nodeid`` is ``_id`` there), so the marks alone put a group's tests on both workers (two Spark
    sessions, two servers on the default ports at once)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return Groups(config, log)


@pytest.hookimpl(tryfirst=True)  # (the slow marks before -m deselects)
def pytest_collection_modifyitems(config, items):
    first = {module: rank for rank, module in enumerate(FIRST)}
    items.sort(key=lambda item: first.get(item.module.__name__.rpartition(".")[2] if item.module else "", len(first)))
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        test = f"{module}.py::{item.originalname}" if isinstance(item, pytest.Function) else ""
        if module in SLOW_MODULES or test in SLOW_TESTS or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# -- the session always ends (tests/session_guard.py) ---------------------------------------------------

session_guard.never_block_on_collection()
_watchdog = session_guard.Watchdog()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """First of all at session end: bound what is left of the run (the teardown of module fixtures
    that an interrupted run left, the clean-up, the summary)."""
    session.config._pzq_session = session
    _watchdog.arm(exitstatus, session_guard.CLEANUP_S)


class _CleanUp:
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        """After every fixture's teardown, before the summary: release what failed tests left open."""
        found = session_guard.clean_up()
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if found and reporter is not None:
            reporter.write_line(f"tests left behind (now released): {'; '.join(found)}", yellow=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A test module's assertion-rewritten code is kept in tests/__pycache__ (git ignores it) even where
    PYTHONDONTWRITEBYTECODE is set, as on this machine: else each xdist worker rewrote the asserts of
    every test module at each run (8.6 s of CPU a worker, 18 s of the fast tier's wall under load)."""
    if not isinstance(collector, pytest.Module):
        yield
        return
    was = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = was


def pytest_configure(config):
    config.pluginmanager.register(_CleanUp(), "pzq-tests-clean-up")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """After the summary: the interpreter has EXIT_GRACE_S to exit, or the watchdog ends it with
    pytest's own exit status."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker done with its tests waits for the controller to close its channel, which it does once
        # the other worker is done too: minutes, not a hang. The controller's own watchdog ends the run.
        _watchdog.disarm()
        return
    session = getattr(config, "_pzq_session", None)
    _watchdog.arm(_watchdog.status if session is None else session.exitstatus, session_guard.EXIT_GRACE_S)


def ended(raws: list[socket.socket], seconds: float, count: int | None = None) -> list[bool]:
    """Which of ``raws`` the server ends within ``seconds`` (libzmq's greeting is read past); with ``count``,
    as soon as that many ended (the test knows by a barrier that no more will: a server's counter)."""
    done = [False] * len(raws)
    count = len(raws) if count is None else count
    with selectors.DefaultSelector() as sel:
        for i, raw in enumerate(raws):
            raw.setblocking(False)
            sel.register(raw, selectors.EVENT_READ, i)
        deadline = time.monotonic() + seconds
        while sum(done) < count and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                try:
                    data = key.fileobj.recv(4096)
                except ConnectionResetError:
                    data = b""
                if data == b"":
                    done[key.data] = True
                    sel.unregister(key.fileobj)
    return done
