"""The server's socket maker: re-binding a socket (as a CURVE revocation does) leaves a working endpoint,
on ipc (whose file the closed listener unlinks) and on tcp (whose port it frees a moment later)."""

from __future__ import annotations

import pytest
import zmq

from pzq.endpoints.base import Sockets

from conftest import free_tcp_endpoint, recv


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_rebound_socket_serves_new_peers_at_its_old_address_every_time(tmp_path, transport, sockets):
    endpoint = f"ipc://{tmp_path}/send" if transport == "ipc" else free_tcp_endpoint()[0]
    made = Sockets(zmq.Context.instance())
    try:
        sock = made.bind(zmq.DEALER, endpoint, "--send-dsn", SNDHWM=1000, RCVHWM=1000, MAXMSGSIZE=4096)
        for round_ in range(10):
            sock = made.rebind(sock)
            assert not made.pending, f"round {round_}: the address was not free within the wait"
            peer = sockets(zmq.ROUTER, endpoint)
            sock.send_multipart([b"round %d" % round_])
            assert recv(peer)[1:] == [b"round %d" % round_]
        assert made.owned == [sock]
    finally:
        made.close()


def test_a_rebound_socket_leaves_no_table_of_the_old_ones_peers_behind(tmp_path):
    """The socket monitor's reader (endpoints/connwatch.py) keeps each watched socket's peers by descriptor;
    a re-bind (each CURVE revocation on SIGHUP) cuts them all off, and kept the old socket's table for good."""
    endpoint, _ = free_tcp_endpoint()
    made = Sockets(zmq.Context.instance())
    try:
        sock = made.bind(zmq.DEALER, endpoint, "--send-dsn", SNDHWM=1000, RCVHWM=1000, MAXMSGSIZE=4096)
        for _ in range(3):
            made.peers.setdefault(sock, {})[99] = ("127.0.0.1:40000", 1)  # (as connwatch records an accept)
            sock = made.rebind(sock)
        assert set(made.peers) <= set(made.owned)
    finally:
        made.close()
