"""MQKS numbers a hostile client writes to make the parser raise what it does not catch: digits that are
digits to Python's str but not to int(), and more digits than int() converts. Each is one error line,
and the turn it came in is not rolled back."""

from __future__ import annotations

import re

import pytest

from pzq.clients import native as client
from pzq.clients.mqks import MqksClient

from conftest import free_tcp_endpoint

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("prefetch", ["²", "١٠", "1" * 5000])
def test_a_prefetch_of_unicode_digits_or_5000_digits_is_one_error_line_and_no_rolled_back_turn(make_server, prefetch):
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0])
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"before"]).ok
    conn = MqksClient(srv.config.mqks_dsn)
    try:
        conn.send(f"c1 consume --confirm q e --manual-ack --prefetch={prefetch}")
        assert re.fullmatch(r"c1 error [0-9a-f]{24}", conn.read_line() or "")  # (before: no answer)
    finally:
        conn.close()
    with client.Producer(srv.receive) as producer:
        assert producer.produce([b"after"]).ok
    assert srv.stats()["queues"]["default"]["depth"] == 2
