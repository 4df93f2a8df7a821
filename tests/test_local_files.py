"""Local files: the store is private whatever the umask, the monitor socket is not where another local
user can squat it, pzq never binds over or talks to another user's socket file, and every CLI command
gives one clear line (not a traceback) when what answers is not pzq."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading

import pytest
import zmq
from click.testing import CliRunner

from pzq.cli import cli
from pzq.config import Config
from pzq.errors import ConfigError
from pzq.server import Server
from pzq.store import Store

from conftest import free_tcp_endpoint, make_config, wait_until

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def pzq(*args: str, cwd=None, timeout: float = 30) -> subprocess.CompletedProcess:
    """`pzq ARGS`: through click's runner in this process (exit status, stdout, stderr), or as a process
    of its own when it must run in ``cwd`` (a default found relative to it)."""
    if cwd is not None:
        return subprocess.run(
            [sys.executable, "-m", "pzq", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
    ran = CliRunner().invoke(cli, list(args), prog_name="pzq", catch_exceptions=False)
    return subprocess.CompletedProcess(["pzq", *args], ran.exit_code, ran.stdout, ran.stderr)


def one_clear_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pzq: error: "), result.stderr
    return lines[0]


def test_the_store_is_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        store = Store(tmp_path / "db", max_size=16 << 20)
        store.put("q", [b"secret"], now_us=1)
        store.commit()
        store.close()
    finally:
        os.umask(old)
    assert mode(tmp_path / "db") == 0o700
    assert mode(tmp_path / "db" / "data.mdb") == mode(tmp_path / "db" / "lock.mdb") == 0o600


def test_files_an_earlier_version_left_readable_are_made_private(tmp_path):
    Store(tmp_path / "db", max_size=16 << 20).close()
    for name in ("data.mdb", "lock.mdb"):
        os.chmod(tmp_path / "db" / name, 0o644)
    Store(tmp_path / "db", max_size=16 << 20).close()
    assert mode(tmp_path / "db" / "data.mdb") == mode(tmp_path / "db" / "lock.mdb") == 0o600


def test_the_default_monitor_socket_lives_in_the_private_store_directory(tmp_path):
    assert Config().monitor_dsn == "ipc://./pzq-data/monitor"
    assert Config(database="/var/lib/pzq/").monitor_dsn == "ipc:///var/lib/pzq/monitor"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pzq",
            "serve",
            "--receive-dsn",
            f"ipc://{tmp_path}/r",
            "--send-dsn",
            f"ipc://{tmp_path}/s",
            "--phpmq-dsn",
            "",
            "--emqp-frontend-dsn",
            "",
            "--emqp-backend-dsn",
            "",
            "--emqp-publish-dsn",
            "",
            "--mqks-dsn",
            "",
            "--api-dsn",
            "",
        ],
        cwd=tmp_path,
        stderr=subprocess.DEVNULL,
    )
    try:
        # (a client says at once that nothing listens: the server's socket is waited for first)
        assert wait_until(lambda: (tmp_path / "pzq-data" / "monitor").exists() or server.poll() is not None, 60)
        result = pzq("monitor", "--json", "--timeout", "20s", cwd=tmp_path)  # the same default, found alone
        assert result.returncode == 0 and '"messages": 0' in result.stdout, result.stderr
        assert mode(tmp_path / "pzq-data") == 0o700
        assert mode(tmp_path / "pzq-data" / "monitor") == 0o600
    finally:
        server.terminate()
        server.wait(15)


@as_root
def test_the_server_never_binds_over_another_users_socket_file(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    squat = socket.socket(socket.AF_UNIX)
    squat.bind(str(shared / "monitor"))
    os.chown(shared / "monitor", NOBODY, NOBODY)
    cfg = make_config(tmp_path, monitor_dsn=f"ipc://{shared}/monitor")
    server = Server(cfg, context=zmq.Context.instance())
    try:
        with pytest.raises(ConfigError, match="belongs to uid 65534.*refusing to bind over it"):
            server.start()
    finally:
        server.close()
        squat.close()
    assert os.stat(shared / "monitor").st_uid == NOBODY, "the squatter's file is left alone"
    line = one_clear_line(pzq("monitor", "--monitor-dsn", f"ipc://{shared}/monitor", "--timeout", "1s"))
    assert "refusing to talk to" in line and "belongs to uid 65534" in line


class FakeServer:
    """Something that is not pzq on a pzq endpoint: answers every request with ``answer``."""

    def __init__(self, kind: int, endpoint: str, answer):
        self.sock = zmq.Context.instance().socket(kind)
        self.sock.linger = 0
        self.sock.bind(endpoint)
        self.answer = answer
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            if self.sock.poll(50):
                frames = self.sock.recv_multipart()
                for reply in self.answer(frames):
                    self.sock.send_multipart(reply)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.sock.close(linger=0)


# (the last: every key a command reads at the top, with rows that are not rows)
NESTED = b'{"tables": [1], "figures": {}, "name": "q", "consumers": [1], "consumers_total": 1, "messages": [1],'
NESTED += b' "letters": [1], "more": false, "queues": {"q": 1}, "created": 1, "requeued": "x", "deleted": []}'


@pytest.mark.parametrize("answer", [b"hello", b'{"messages": 1, "queues": 7}', b"[1, 2", b"\xff\xfe", NESTED])
@pytest.mark.parametrize(
    "command",
    [
        *(["monitor"], ["monitor", "--json"], ["clients"], ["queue", "list"], ["queue", "create", "q"]),
        *(["queue", "delete", "q", "--yes"], ["queue", "show", "q"], ["queue", "peek", "q"], ["queue", "purge", "q"]),
        *(["queue", "peek", "--dead", "q"], ["queue", "publish", "q", "x"], ["dead-letters", "list", "q"]),
        *(["dead-letters", "requeue", "q", "--all"], ["dead-letters", "delete", "q", "--all"]),
    ],
)
def test_a_monitor_command_answered_by_something_else_prints_one_line(tmp_path, command, answer):
    endpoint = f"ipc://{tmp_path}/monitor"
    fake = FakeServer(zmq.REP, endpoint, lambda frames: [[answer]])
    try:
        one_clear_line(
            pzq(
                *command,
                "--monitor-dsn",
                endpoint,
                "--timeout" if command[0] == "monitor" else "--",
                *(["3s"] if command[0] == "monitor" else []),
            )
        )
    finally:
        fake.close()


@pytest.mark.parametrize("answer", [[b"garbage"], [b"1", b"2", b"3", b"4"], [b"\x00" * 3]])
def test_produce_answered_by_something_else_prints_one_line(tmp_path, answer):
    endpoint = f"ipc://{tmp_path}/receive"
    fake = FakeServer(zmq.ROUTER, endpoint, lambda frames: [[frames[0], *answer]])
    try:
        # (the client drops what it cannot read and says it had no ack: 0.5 s, not its 10 s)
        one_clear_line(pzq("produce", "--receive-dsn", endpoint, "--timeout", "0.5s", "hello"))
    finally:
        fake.close()


def test_consume_fed_by_something_else_prints_one_line(tmp_path):
    endpoint = f"ipc://{tmp_path}/send"
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.bind(endpoint)
    # (sent from a thread: a DEALER with no peer yet blocks the send until the consumer connects)
    sender = threading.Thread(target=sock.send_multipart, args=([b"key", b"not a time", b"x", b"", b"body"],))
    sender.start()
    try:
        # (the send socket alone: no wait for a batched endpoint beside it that is not there)
        one_clear_line(pzq("consume", "--send-dsn", endpoint, "--consume-dsn", "", "--timeout", "20s"))
    finally:
        sender.join(10)
        sock.close(linger=0)


@pytest.mark.parametrize("command", [["publish", "e", "data"], ["consume", "q"]])
def test_mqks_commands_answered_by_something_else_print_one_line(command):
    dsn, addr = free_tcp_endpoint()
    listener = socket.create_server(addr)
    stop = threading.Event()

    def serve() -> None:  # an endless stream of lines that are not MQKS answers
        conn, _ = listener.accept()
        with conn:
            while not stop.is_set():
                try:
                    conn.sendall(b"not mqks\n" * 100)
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        one_clear_line(pzq("mqks", command[0], "--mqks-dsn", dsn, *command[1:]))
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def test_every_ipc_socket_file_is_owner_only_whatever_the_umask(tmp_path):
    cfg = make_config(tmp_path, api_dsn=f"ipc://{tmp_path}/api")
    old = os.umask(0)
    server = Server(cfg, context=zmq.Context.instance())
    try:
        server.start()
        for name in ("receive", "send", "monitor", "api"):
            assert mode(tmp_path / name) == 0o600, name
    finally:
        server.close()
        os.umask(old)
