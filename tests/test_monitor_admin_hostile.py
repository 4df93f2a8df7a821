"""The monitor's admin requests against a hostile client and an unlucky operator, over a real server on
real sockets: numbers that are digits to Python's str but not to int(), floods of big pages never read,
forged ids, purges raced by consumers and deletions, writes of a turn that rolls back, and requests in
raw DEALER framing."""

from __future__ import annotations

import pytest

from pzq.clients import native as client
from pzq.clients.admin import AdminRefused, admin_request

pytestmark = pytest.mark.timeout(120)


def ask(srv, *words: str, body: bytes | None = None):
    return admin_request(srv.monitor, words, body, timeout_ms=10_000)


def refusal(srv, *words: str, body: bytes | None = None) -> str:
    with pytest.raises(AdminRefused) as caught:
        ask(srv, *words, body=body)
    assert caught.value.reply.startswith("error: ") and caught.value.reply.count("\n") == 1
    return str(caught.value)


def produce(srv, bodies: list[bytes]) -> None:
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b] for b in bodies))


@pytest.mark.parametrize(
    "words",
    [
        ("PEEK", "default", "²"),
        ("DEAD", "default", "³"),
        ("CLIENTS", "¹"),
        ("CLIENTS", "1", "²"),
        ("PEEK", "default", "١٠"),  # (Arabic-Indic digits: int() takes them, the request's syntax does not)
    ],
)
def test_a_limit_or_offset_of_unicode_digits_is_refused_with_one_line_and_rolls_back_no_turn(make_server, words):
    srv = make_server()
    produce(srv, [b"before"])
    assert "must be a whole number" in refusal(srv, *words)
    produce(srv, [b"after"])  # (the loop is still there, and nothing it stored was rolled back)
    assert srv.stats()["queues"]["default"]["depth"] == 2
