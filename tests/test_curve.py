"""ZeroMQ CURVE on a real server: allowed client keys get through, everyone else gets nothing."""
from __future__ import annotations

import os
import shutil
import stat

import pytest
import zmq
from click.testing import CliRunner

from conftest import free_tcp_endpoint
from pzq.cli import cli
from pzq.curve import secure_client

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def keys(tmp_path):
    runner = CliRunner()
    for name in ("server", "alice", "mallory"):
        result = runner.invoke(cli, ["keygen", str(tmp_path / name), name])
        assert result.exit_code == 0, result.output
    (tmp_path / "clients").mkdir()
    shutil.copy(tmp_path / "alice" / "alice.key", tmp_path / "clients")  # only Alice's public key
    return tmp_path


def produce_once(endpoint: str, curve: tuple[str, str] | None) -> list[bytes] | None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve:
        secure_client(sock, *curve)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"1", b"", b"secret payload"])
        return sock.recv_multipart() if sock.poll(1500) else None
    finally:
        sock.close(0)


def test_keygen_writes_a_public_key_and_an_owner_only_secret_key(keys):
    assert (keys / "server" / "server.key").read_text().count("public-key") == 1
    assert stat.S_IMODE(os.stat(keys / "server" / "server.key_secret").st_mode) == 0o600


def test_only_clients_with_an_allowed_key_are_served(make_server, keys):
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(receive_dsn=endpoint, curve_secret_key=str(keys / "server" / "server.key_secret"),
                      curve_clients=str(keys / "clients"))
    server_key = str(keys / "server" / "server.key")
    alice = (str(keys / "alice" / "alice.key_secret"), server_key)
    mallory = (str(keys / "mallory" / "mallory.key_secret"), server_key)
    assert produce_once(endpoint, None) is None  # plain ZeroMQ: the handshake never completes
    assert produce_once(endpoint, mallory) is None  # a key pair of its own, but not an allowed one
    assert produce_once(endpoint, alice) == [b"1", b"1", b""]
    assert srv.stats()["messages"] == 1  # the monitor (ipc, owner-only file) needs no key
    os.remove(keys / "clients" / "alice.key")
    (keys / "clients" / "garbage.key").write_text("not a key")  # does not stop the revocation
    srv.server.curve.reload()  # what SIGHUP does
    assert produce_once(endpoint, alice) is None


def test_the_cli_produces_and_consumes_through_curve(make_server, keys):
    receive, _ = free_tcp_endpoint()
    send, _ = free_tcp_endpoint()
    make_server(receive_dsn=receive, send_dsn=send, curve_secret_key=str(keys / "server" / "server.key_secret"),
                curve_clients=str(keys / "clients"))
    curve = ["--curve-client-key", str(keys / "alice" / "alice.key_secret"),
             "--curve-server-key", str(keys / "server" / "server.key")]
    runner = CliRunner()
    result = runner.invoke(cli, ["produce", "--receive-dsn", receive, *curve, "hello"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["consume", "--send-dsn", send, *curve, "--timeout", "5000"])
    assert result.exit_code == 0 and result.output.strip().endswith("hello"), result.output


def test_the_api_client_speaks_curve_too(make_server, keys):
    from pzq.api_client import ApiClient
    from pzq.errors import ClientError

    endpoint, _ = free_tcp_endpoint()
    make_server(api_dsn=endpoint, curve_secret_key=str(keys / "server" / "server.key_secret"),
                curve_clients=str(keys / "clients"))
    alice = (str(keys / "alice" / "alice.key_secret"), str(keys / "server" / "server.key"))
    with ApiClient(endpoint, timeout_s=10, curve=alice) as api:
        assert api.produce([("q", b"x")])["count"] == 1
    with ApiClient(endpoint, timeout_s=1, attempt_s=0.5) as stranger, pytest.raises(ClientError):
        stranger.info("q")
