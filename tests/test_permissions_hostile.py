"""A hostile tenant against the permissions, over real sockets: a key limited to ``orders.*`` tries to
wedge the server or flood its log with requests it knows will be refused, and to keep or widen its
rights through weird names, reloads and reconnects. Each test is an attack that once worked."""

from __future__ import annotations

import logging

import pytest
from test_permissions_emqp import Peers, answer, refused, request

from conftest import free_tcp_endpoint
from permission_keys import TENANTS

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def emqp(make_server, tenants):
    """start(permissions text) -> (server, peers): the eMQP gateway under CURVE with that file."""
    made: list[Peers] = []

    def start(text: str = TENANTS):
        tenants.write(text)
        front, _ = free_tcp_endpoint()
        back, _ = free_tcp_endpoint()
        srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=back, unauthenticated="monitor", **tenants.config())
        peers = Peers(tenants, front, back, "")
        made.append(peers)
        return srv, peers

    yield start
    for peers in made:
        peers.close()


def test_a_huge_refused_queue_name_does_not_wedge_the_server_on_a_pattern_of_two_stars(emqp):
    # "*.*.eu" as a regular expression backtracks quadratically on a long name it does not match:
    # 60,000 dots took the loop about 10 s (a megabyte, about an hour), for one refused REQUEST.
    srv, peers = emqp('[keys.orders]\nproduce = ["orders.*", "*.*.eu"]\n')
    orders = peers.client("orders")
    request(orders, b"." * 60_000)
    m = request(orders, b"orders.jobs")
    assert answer(orders, m)[2] == b"ACK", "the next request was answered at once"
    assert srv.stats()["permissions"]["refused"] == {"orders": {"produce": 1}}


def test_a_refused_huge_queue_name_is_not_written_whole_to_the_log(emqp, caplog):
    srv, peers = emqp()
    orders = peers.client("orders")
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            m = request(orders, b"payroll" + b"x" * 500_000)
            assert "not permitted" in refused(answer(orders, m))
    lines = [r.getMessage() for r in caplog.records if "not-permitted" in r.getMessage()]
    assert lines, "the refusals were logged"
    assert max(map(len, lines)) < 1000, "each line names the queue by its start and its size"
    assert srv.stats()["permissions"]["refused_total"] == 5


def test_a_pattern_of_stars_matches_exactly_the_names_it_matched_as_a_plain_regular_expression():
    import random
    import re

    from pzq.permissions import Rights

    def plain(pattern: str, name: str) -> bool:
        return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), name, re.DOTALL) is not None

    rng = random.Random(30)
    for _ in range(5000):
        pattern = "".join(rng.choice("ab.*") for _ in range(rng.randint(1, 7)))
        name = "".join(rng.choice("ab.*\n") for _ in range(rng.randint(0, 9)))
        assert Rights({"consume": [pattern]}).may("consume", name) == plain(pattern, name), (pattern, name)
