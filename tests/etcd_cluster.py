"""A real etcd on loopback for the tests of placement in etcd: ``EtcdCluster``, one or three members of
Debian's etcd-server (scripts/test installs it), each its own data directory and ports, with the faults
the tests need (SIGKILL and restart, SIGSTOP and SIGCONT, every member stopped for a while); and
``EtcdShards``, three `pzq serve --shard NAME --etcd URLS` processes registered in it."""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from pzq.clients.api import ApiClient

from conftest import ProcessServer, steady_ports

ETCD = shutil.which("etcd")
needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd-server is not installed (scripts/test installs it)")


class EtcdCluster:
    """``members`` etcd processes on loopback forming one cluster; ``urls`` is the clients' list."""

    def __init__(self, root: Path, members: int = 3):
        self.root = root
        ports = steady_ports(2 * members, 20_000, 30_000)
        self.names = [f"e{i}" for i in range(members)]
        self.client = {n: f"http://127.0.0.1:{ports[2 * i]}" for i, n in enumerate(self.names)}
        self.peer = {n: f"http://127.0.0.1:{ports[2 * i + 1]}" for i, n in enumerate(self.names)}
        self.urls = ",".join(self.client.values())
        self.procs: dict[str, subprocess.Popen] = {}
        for name in self.names:
            self.start(name, new=True)
        self.wait_healthy()

    def start(self, name: str, new: bool = False) -> None:
        initial = ",".join(f"{n}={self.peer[n]}" for n in self.names)
        argv = [
            ETCD or "etcd",
            "--name", name,
            "--data-dir", str(self.root / name),
            "--listen-client-urls", self.client[name],
            "--advertise-client-urls", self.client[name],
            "--listen-peer-urls", self.peer[name],
            "--initial-advertise-peer-urls", self.peer[name],
            "--initial-cluster", initial,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"pzq-test-{id(self)}",
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--log-level", "warn",
        ]  # fmt: skip
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the process keeps it
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=log)
        log.close()

    def status(self, name: str, timeout: float = 1.0) -> dict | None:
        """A member's status (its leader's id among it), None if it does not answer."""
        request = urllib.request.Request(f"{self.client[name]}/v3/maintenance/status", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return json.loads(answer.read())
        except OSError:
            return None

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running member answers and knows a leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [self.status(n) for n in self.names if self.procs[n].poll() is None]
            if found and all(s is not None and int(s.get("leader", 0)) for s in found):
                return
            time.sleep(0.1)
        raise AssertionError(f"etcd is not healthy after {timeout} s: {found}")

    def leader(self) -> str:
        """The name of the member that leads now."""
        for name in self.names:
            found = self.status(name)
            if found is not None and found.get("leader") == found["header"]["member_id"]:
                return name
        raise AssertionError("no etcd member leads")

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait(10)

    def pause(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for name in self.names:
            if self.procs[name].poll() is None:
                self.procs[name].terminate()
        for name in self.names:
            self.procs[name].wait(10)

    def start_all(self) -> None:
        for name in self.names:
            if self.procs[name].poll() is not None:
                self.start(name)
        self.wait_healthy()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)


class EtcdShards:
    """Three `pzq serve --shard NAME --etcd URLS` processes (a, b, c), each its own store and API port."""

    def __init__(self, root: Path, etcd: EtcdCluster, *extra: str, names: tuple[str, ...] = ("a", "b", "c")):
        self.etcd = etcd
        self.servers: dict[str, ProcessServer] = {}
        self.endpoints: dict[str, str] = {}
        ports = steady_ports(len(names), 12_000, 20_000)
        for name, port in zip(names, ports, strict=True):
            (root / name).mkdir(exist_ok=True)
            self.endpoints[name] = f"tcp://127.0.0.1:{port}"
            args = ["--api-dsn", self.endpoints[name], "--shard", name, "--etcd", etcd.urls, *extra]
            self.servers[name] = ProcessServer(root / name, *args)
        for srv in self.servers.values():
            srv.start()
        self.clients = {name: ApiClient(dsn, timeout_s=30) for name, dsn in self.endpoints.items()}
        self.wait_registered()

    def registry(self, name: str) -> dict:
        return self.servers[name].stats()["registry"]

    def wait_registered(self, timeout: float = 20.0) -> None:
        """Until every shard sees every other registered and alive (placement spreads over them all)."""
        deadline = time.monotonic() + timeout
        names = sorted(self.servers)
        while time.monotonic() < deadline:
            if all(self.registry(n)["alive"] == names for n in names):
                return
            time.sleep(0.1)
        raise AssertionError(f"shards not all registered: { {n: self.registry(n) for n in names} }")

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        for srv in self.servers.values():
            srv.stop()


# -- fixtures (tests/conftest.py loads this module as a plugin) and helpers of the etcd tests ----------


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """One etcd member for a test module (each test its own ``prefix``, so none sees another's keys)."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1)
    yield cluster
    cluster.close()


@pytest.fixture
def prefix():
    return f"/t{uuid.uuid4().hex[:8]}/"


@pytest.fixture
def shards(tmp_path, etcd, prefix):
    made = EtcdShards(tmp_path, etcd, "--etcd-prefix", prefix)
    yield made
    made.close()


def wait_for(check, timeout: float = 10.0, every: float = 0.05):
    """``check()``'s first true value within ``timeout`` (AssertionError naming the last one otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() >= deadline:
            assert found, f"not within {timeout} s: {found!r}"
            return found
        time.sleep(every)


def etcd_keys(etcd: EtcdCluster, prefix: str) -> dict[str, bytes]:
    """Every key under ``prefix`` and its value, read from etcd itself."""
    raw = prefix.encode()
    body = {"key": base64.b64encode(raw).decode(), "range_end": base64.b64encode(raw[:-1] + b"0").decode()}
    request = urllib.request.Request(f"{etcd.client['e0']}/v3/kv/range", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=5) as answer:
        kvs = json.loads(answer.read()).get("kvs", [])
    return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")) for kv in kvs}


def etcd_put(etcd: EtcdCluster, key: str, value: bytes) -> None:
    body = {"key": base64.b64encode(key.encode()).decode(), "value": base64.b64encode(value).decode()}
    request = urllib.request.Request(f"{etcd.client['e0']}/v3/kv/put", data=json.dumps(body).encode())
    urllib.request.urlopen(request, timeout=5).close()


def where(shards: EtcdShards, name: str, queue: str, place: bool = False) -> dict:
    """Shard ``name``'s API WHERE answer for ``queue`` (``place``: a producer's, which places it)."""
    return shards.clients[name].call("WHERE", queue=queue, place=int(place))
