"""Fairness between API clients over real sockets: a client that pipelines hundreds of requests is served
one request a round beside the others, is answered ``ERR busy`` past its share of waiting requests, and
a PRODUCE of more messages than one turn's work is refused from its list's header."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
import zmq

from pzq.clients.api import ApiClient
from pzq.config import Limits
from pzq.endpoints.api import ApiEndpoint
from pzq.protocols import api as api_proto

from conftest import recv, wait_until

pytestmark = pytest.mark.timeout(120)

BATCH = 1_000  # messages in each of the flood's PRODUCEs: a few ms of the loop each
HOSTILES = 10  # connections that pipeline PRODUCEs, 20 each


def _flood(sock: zmq.Socket, n: int, queue: str = "flood") -> None:
    body = msgpack.packb({"messages": [[queue, b"x" * 10]] * BATCH}, use_bin_type=True)
    for i in range(n):
        sock.send_multipart([b"", b"h%d" % i, b"PRODUCE", body])


def _answers(sock: zmq.Socket) -> list[list[bytes]]:
    """What the socket holds now, without waiting."""
    out = []
    while sock.poll(0):
        out.append(sock.recv_multipart())
    return out


class Dealt:
    """What the API endpoint did with each request it read, counted as it goes: carried out, refused busy,
    or dropped unanswered (its client let its replies pile up unread: it would resend them). The barrier
    for "every answer came": once every request sent is counted, exactly the answers due are read."""

    def __init__(self, srv):
        self.endpoint = next(e for e in srv.server.endpoints if isinstance(e, ApiEndpoint))
        self.dropped: list[bytes] = []
        refuses = self.endpoint.replies.refuses

        def counted(peer: bytes, what: str) -> bool:
            refused = refuses(peer, what)
            if refused:
                self.dropped.append(peer)
            return refused

        self.endpoint.replies.refuses = counted

    def total(self) -> int:
        return self.endpoint.gateway.requests_total + self.endpoint.refused_busy + len(self.dropped)


def _all_answers(dealt: Dealt, sent: int, got: dict[zmq.Socket, list[list[bytes]]], others: int) -> None:
    """Once the server has dealt with the ``sent`` requests of the sockets of ``got`` and the ``others`` of
    lock-step clients (answered, and read already), read every answer due to them: those not dropped."""
    wait_until(lambda: dealt.total() >= sent + others, timeout_s=60)
    due = sent - len(dealt.dropped) - sum(map(len, got.values()))
    poller = zmq.Poller()
    for sock in got:
        poller.register(sock, zmq.POLLIN)
    for _ in range(due):  # (in a busy turn's answers, some may still be on their way)
        ready = dict(poller.poll(10_000))
        assert ready, f"{due} answers due, {sum(map(len, got.values()))} came"
        sock = next(iter(ready))
        got[sock].append(sock.recv_multipart())
    assert not any(sock.poll(0) for sock in got), "one answer for each request, no more"


def _ok(answers: list[list[bytes]]) -> int:
    return sum(1 for a in answers if a[2] == b"OK")


def test_an_honest_request_waits_a_round_however_many_requests_other_clients_pipeline(make_server, tmp_path, sockets):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", hard_sync=False)  # (rounds, not durability: no fsyncs)
    dealt = Dealt(srv)
    hostiles = [sockets(zmq.DEALER, srv.config.api_dsn) for _ in range(HOSTILES)]
    for sock in hostiles:
        sock.sndhwm = 0  # (all queued at once: those the server's pipe has no room for wait here)
        _flood(sock, 200 // HOSTILES)
    got: dict[zmq.Socket, list[list[bytes]]] = {sock: [] for sock in hostiles}
    got[hostiles[0]].append(recv(hostiles[0], 30_000))  # the flood is being carried out
    for sock in hostiles:
        got[sock] += _answers(sock)
    carried_before = sum(map(_ok, got.values()))  # at least this many were done before the honest request
    honest = sockets(zmq.DEALER, srv.config.api_dsn)
    honest.send_multipart(api_proto.request(b"i", "INFO", {"queue": "flood"}))
    reply = recv(honest, 30_000)
    depth = msgpack.unpackb(reply[3])["depth"]
    # The flood's PRODUCEs carried out while the INFO waited: a round (one per flooding client), and
    # those whose replies were still on their way (a turn's work). In one FIFO queue it waited behind
    # every request the server had read of the flood (each client's pipe holds 16; up to 160 here).
    assert reply[2] == b"OK" and depth % BATCH == 0
    assert depth // BATCH - carried_before <= HOSTILES + 8, (depth // BATCH, carried_before)
    _all_answers(dealt, 200, got, others=1)  # (the honest INFO)
    answers = [a for answers in got.values() for a in answers]
    assert all(msgpack.unpackb(a[3])["code"] == "busy" for a in answers if a[2] == b"ERR")
    with ApiClient(srv.config.api_dsn, timeout_s=10) as client:
        assert client.info("flood")["depth"] == _ok(answers) * BATCH  # a busy one stored nothing


def test_a_client_past_its_share_of_waiting_requests_is_answered_busy_and_others_are_not(
    make_server, tmp_path, sockets
):
    limits = dataclasses.replace(Limits(), api_pending_per_peer=1)
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=limits)
    dealt = Dealt(srv)
    hostile = sockets(zmq.DEALER, srv.config.api_dsn)
    hostile.sndhwm = 0
    _flood(hostile, 50)
    with ApiClient(srv.config.api_dsn, timeout_s=30) as client:
        # A lock-step client has one request waiting at most: never past its share, whatever the flood.
        for i in range(5):
            assert client.produce([("honest", b"m%d" % i)])["count"] == 1
        answers: dict[zmq.Socket, list[list[bytes]]] = {hostile: []}
        _all_answers(dealt, 50, answers, others=5)  # (the honest client's five PRODUCEs)
        got = answers[hostile]
        busy = [msgpack.unpackb(a[3]) for a in got if a[2] == b"ERR"]
        assert busy, "50 pipelined requests, one waiting allowed: some were past the share"
        assert {b["code"] for b in busy} == {"busy"} and "share" in busy[0]["detail"]
        assert client.info("flood")["depth"] == _ok(got) * BATCH  # the refused ones did nothing
        assert client.info("honest")["depth"] == 5
        assert client.produce([("flood", b"after")])["count"] == 1  # refusing was about that client only


def test_a_produce_of_more_messages_than_a_turn_carries_out_is_refused_and_nothing_is_stored(
    make_server, tmp_path, sockets
):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api", limits=dataclasses.replace(Limits(), api_max_produce=10))
    raw = sockets(zmq.DEALER, srv.config.api_dsn)
    # The list's header announces a million messages and none follow: refused from the header alone.
    header = b"\x81" + msgpack.packb("messages") + b"\xdd" + (1 << 20).to_bytes(4, "big")
    raw.send_multipart([b"", b"1", b"PRODUCE", header])
    raw.send_multipart(api_proto.request(b"2", "PRODUCE", {"messages": [["q", b"x"]] * 11}))
    raw.send_multipart(api_proto.request(b"3", "PRODUCE", {"messages": [["q", b"x"]] * 10}))
    replies = {a[1]: (a[2], msgpack.unpackb(a[3])) for a in (recv(raw), recv(raw), recv(raw))}
    assert replies[b"1"][0] == b"ERR" and replies[b"1"][1]["code"] == "too-many"
    assert replies[b"2"][0] == b"ERR" and "at most 10 messages" in replies[b"2"][1]["detail"]
    assert replies[b"3"] == (b"OK", {"count": 10, "duplicate": False})


def test_a_cheap_request_goes_before_a_crowd_of_costly_ones_that_came_at_once(make_server, tmp_path, sockets):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    crowd = [sockets(zmq.DEALER, srv.config.api_dsn) for _ in range(30)]
    for sock in crowd:
        _flood(sock, 1)  # one PRODUCE of 1,000 each: a few ms of the loop
    got: dict[zmq.Socket, list[list[bytes]]] = {sock: [] for sock in crowd}
    got[crowd[0]].append(recv(crowd[0], 30_000))  # the crowd is being carried out
    for sock in crowd:
        got[sock] += _answers(sock)
    carried_before = sum(map(_ok, got.values()))
    honest = sockets(zmq.DEALER, srv.config.api_dsn)
    honest.send_multipart(api_proto.request(b"i", "INFO", {"queue": "flood"}))
    reply = recv(honest, 30_000)
    depth = msgpack.unpackb(reply[3])["depth"]
    # Served by what each client's requests cost, not one request of each client a round: the INFO
    # waited for the PRODUCEs already under way (a turn's work), not for one of each of the 30.
    assert reply[2] == b"OK" and depth % BATCH == 0
    assert depth // BATCH - carried_before <= 8, (depth // BATCH, carried_before)
