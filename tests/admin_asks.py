"""What the monitor admin tests ask a running server: one request, a refusal's line, messages produced."""

from __future__ import annotations

import pytest

from pzq.clients import native as client
from pzq.clients.admin import AdminRefused, admin_request


def ask(srv, *words: str, body: bytes | None = None):
    """The JSON answer to one admin request (AdminRefused for an ``error:`` line)."""
    return admin_request(srv.monitor, words, body, timeout_s=10)


def refusal(srv, *words: str, body: bytes | None = None) -> str:
    """The one ``error:`` line a request must get."""
    with pytest.raises(AdminRefused) as caught:
        ask(srv, *words, body=body)
    assert caught.value.reply.startswith("error: ") and caught.value.reply.count("\n") == 1
    return str(caught.value)


def produce(srv, bodies: list[bytes]) -> None:
    """Store ``bodies`` through the native receive socket, each acknowledged."""
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b] for b in bodies))
