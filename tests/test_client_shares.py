"""Fair shares of the pools clients make things in (issue 26, item 4): eMQP schedules, API consumer groups
and MQKS bindings. A client (its CURVE key, else its connection) holds at most its share of each pool, and
the pool's last part is kept for clients that hold none yet: a hostile client past its share is refused
with its protocol's error, changing nothing, and counted, while another client can still create."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import socket
import uuid

import pytest
import zmq
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients.api import ApiClient, ApiError
from pzq.config import DEFAULT_LIMITS, ClientShares

from conftest import free_tcp_endpoint, recv

pytestmark = pytest.mark.timeout(60)

# Pools of 16: a client's share is 2 (16 // 8) and the last 2 (16 // 8) are kept for newcomers
SMALL = dataclasses.replace(DEFAULT_LIMITS, max_schedules=16, max_groups=16, mqks_max_bindings=16)


def test_a_client_takes_its_share_and_past_the_reserve_only_a_client_that_holds_none_may_begin():
    shares = ClientShares(16, SMALL)
    assert (shares.share, shares.reserve) == (2, 2)
    total = 0
    for client in range(7):  # seven clients at their share: 14 of 16
        for _ in range(2):
            assert shares.refusal(client, total) is None
            shares.add(client)
            total += 1
        assert shares.refusal(client, total) is not None, "past its share"
    assert shares.refusal("newcomer", total) is None, "the reserve is for a client that holds none"
    shares.add("newcomer")
    total += 1
    assert shares.refusal("newcomer", total) is not None, "a client that holds some may not take the reserve"
    assert shares.refused_total == 8
    shares.add(0, -1)  # one of client 0's and one of client 1's are gone: 13 taken, under the reserve
    shares.add(1, -1)
    assert shares.refusal(0, total - 2) is None, "client 0 may make one again"
    shares.forget(1)
    assert 1 not in shares.held


# -- eMQP: SCHEDULE per frontend peer (its routing identity), or per CURVE key ---------------------------

V = b"eMQP/1.0"


def _dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.identity = uuid.uuid4().hex.encode()
    sock.connect(endpoint)
    return sock


def _payload(n: int) -> bytes:
    return json.dumps(["run", {"callable": "tick", "path": "m", "args": [n]}]).encode()


def _schedule(sock: zmq.Socket, n: int) -> list[bytes]:
    """SCHEDULE a job of its own (a schedule is named by its payload); the answer (ACK or REPLY)."""
    msgid = uuid.uuid4().hex.encode()
    sock.send_multipart([b"", V, b"SCHEDULE", msgid, b"ticks", b"", b"3600", _payload(n), b""])
    while True:
        frames = recv(sock, 5000)
        if frames[2] in (b"ACK", b"REPLY"):
            return frames


def test_an_emqp_client_flooding_schedules_is_refused_past_its_share_and_another_can_still_schedule(make_server):
    front, _ = free_tcp_endpoint()
    srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=free_tcp_endpoint()[0], limits=SMALL)
    hostile, honest = _dealer(front), _dealer(front)
    try:
        assert [_schedule(hostile, n)[2] for n in range(2)] == [b"ACK", b"ACK"]
        for n in range(2, 10):
            refused = _schedule(hostile, n)
            assert refused[2] == b"REPLY" and "no more schedules for this client" in json.loads(refused[4])["error"]
        stats = srv.stats()["emqp"]
        assert stats["schedules"] == 2 and stats["schedules_refused_total"] == 8, "refused ones change nothing"
        assert _schedule(honest, 100)[2] == b"ACK", "another client still schedules"
        assert srv.stats()["emqp"]["schedules"] == 3
        hostile.send_multipart([b"", V, b"UNSCHEDULE", b"u1", b"ticks", b"", b"-1", _payload(0), b""])
        assert recv(hostile, 5000)[2:5:2] == [b"ACK", b"u1"]
        assert _schedule(hostile, 50)[2] == b"ACK", "a schedule removed no longer counts against its maker"
    finally:
        hostile.close(0)
        honest.close(0)


# -- API: LEASE making a consumer group, per peer (or CURVE key) -----------------------------------------


def test_an_api_client_flooding_groups_is_refused_past_its_share_and_another_can_still_make_one(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=SMALL)
    with ApiClient(srv.config.api_dsn, timeout_s=10) as hostile, ApiClient(srv.config.api_dsn, timeout_s=10) as honest:
        hostile.produce([("q", b"m")])
        assert [hostile.lease("q", f"g{i}", 0, 1)[0] for i in range(2)] == [0, 0]
        for i in range(2, 10):
            with pytest.raises(ApiError) as refused:
                hostile.lease("q", f"g{i}", 0, 1)
            assert refused.value.code == "too-many-groups"
        stats = srv.stats()["api"]
        assert set(stats["groups"]) == {"q/g0", "q/g1"} and stats["groups_refused_total"] == 8
        honest.lease("q", "mine", 0, 1)
        assert "q/mine" in srv.stats()["api"]["groups"], "another client still makes a group"


# -- MQKS: bindings per connection -------------------------------------------------------------------------


def _lines(conn: socket.socket, reader, count: int) -> list[str]:
    return [reader.readline().decode().rstrip("\n") for _ in range(count)]


def test_an_mqks_connection_flooding_bindings_is_refused_past_its_share_and_another_can_still_bind(make_server):
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0], limits=SMALL)
    port = int(srv.config.mqks_dsn.rsplit(":", 1)[1])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as hostile,
        socket.create_connection(("127.0.0.1", port), timeout=10) as honest,
    ):
        bad, good = hostile.makefile("rb"), honest.makefile("rb")
        hostile.sendall(b"c1 consume --confirm q1 e1 e2\n")
        assert _lines(hostile, bad, 1) == ["c1 ok "]
        hostile.sendall(b"r1 rebind --confirm q1 --add e3\nc2 consume --confirm q2 e4\nr2 rebind --confirm q1 e1 e5\n")
        answers = _lines(hostile, bad, 4)
        assert re.fullmatch(r"r1 error [0-9a-f]{24}", answers[0]) and re.fullmatch(r"c2 error [0-9a-f]{24}", answers[1])
        assert answers[2:] == ["c1 ok --update q1 e1 e5", "r2 ok "], "a swap keeps what it holds"
        stats = srv.stats()["mqks"]
        assert stats["bindings"] == 2 and stats["bindings_refused_total"] == 2, "refused ones change nothing"
        honest.sendall(b"c3 consume --confirm q3 x1 x2\n")
        assert _lines(honest, good, 1) == ["c3 ok "], "another connection still binds"


def test_with_curve_one_key_on_many_connections_is_one_client_and_another_key_still_makes_groups(make_server, tmp_path):
    runner = CliRunner()
    for name in ("server", "alice", "mallory"):
        assert runner.invoke(cli, ["keygen", str(tmp_path / name), name]).exit_code == 0
    (tmp_path / "clients").mkdir()
    for name in ("alice", "mallory"):
        shutil.copy(tmp_path / name / f"{name}.key", tmp_path / "clients")
    endpoint, _ = free_tcp_endpoint()
    srv = make_server(
        api_dsn=endpoint,
        limits=SMALL,
        curve_secret_key=str(tmp_path / "server" / "server.key_secret"),
        curve_clients=str(tmp_path / "clients"),
        unauthenticated="monitor",
    )

    def client(name: str) -> ApiClient:
        key = (str(tmp_path / name / f"{name}.key_secret"), str(tmp_path / "server" / "server.key"))
        return ApiClient(endpoint, timeout_s=10, curve=key)

    mallorys = [client("mallory") for _ in range(3)]  # three connections, one key
    alice = client("alice")
    try:
        mallorys[0].produce([("q", b"m")])
        mallorys[0].lease("q", "g0", 0, 1)
        mallorys[1].lease("q", "g1", 0, 1)
        with pytest.raises(ApiError) as refused:  # the key's share is spent, whichever connection asks
            mallorys[2].lease("q", "g2", 0, 1)
        assert refused.value.code == "too-many-groups"
        alice.lease("q", "a0", 0, 1)
        assert set(srv.stats()["api"]["groups"]) == {"q/g0", "q/g1", "q/a0"}
    finally:
        for c in [*mallorys, alice]:
            c.close()
