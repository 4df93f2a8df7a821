"""LEASE with ``durable`` 0 (Spark's lease ahead) against a crash: its reply leaves before the commit, so a
power cut may lose the leases it told of. What is lost must come back to the group from the same offset
(at-least-once: the same messages, none missing), and never make another client's reply skip its commit."""

from __future__ import annotations

import signal

from pzq.clients import native as client
from pzq.clients.api import ApiClient


def test_leases_answered_without_a_commit_and_lost_to_a_sigkill_are_leased_again_with_the_same_messages(
    process_server, tmp_path
):
    endpoint = f"ipc://{tmp_path}/api"
    srv = process_server("--api-dsn", endpoint, "--commit-interval", "30s")  # (nothing commits by the clock)
    with ApiClient(endpoint, timeout_s=20, attempt_s=0.5) as api:
        api.produce([("default", b"m%d" % i) for i in range(10)])
        assert api.lease("default", "g", 0, 1) == (0, 1)  # (the group, durably)
        assert api.lease("default", "g", 1, 5, durable=False) == (0, 6)
        before = api.fetch("default", "g", 0, 6)
        assert [m[4] for m in before[0]] == [b"m%d" % i for i in range(6)]
        srv.restart(signal.SIGKILL)
        # (a SIGKILL keeps what the page cache holds: the leases may be there, unsynced; a power cut may lose
        # them, as test_native_batch_powercut's store would. Either way the same offset leases the same)
        base, end = api.offsets("default", "g")
        assert base == 0 and end in (1, 6)
        assert api.lease("default", "g", 1, 5) == (0, 6)  # (durable: answered after the commit)
        again = api.fetch("default", "g", 0, 6)
        assert [m[4] for m in again[0]] == [m[4] for m in before[0]]
        # A lease without durable then another client's write: that write's reply waits for its commit
        assert api.lease("default", "g", 6, 2, durable=False) == (0, 8)
        api.produce([("other", b"kept")])
        srv.restart(signal.SIGKILL)
        assert api.info("other")["depth"] == 1
        assert api.offsets("default", "g") == (0, 8)
    consumer = client.Consumer(srv.send)
    try:
        got = []
        while (delivery := consumer.receive(timeout_s=1)) is not None:
            got.append(delivery.body[0])
            consumer.ack(delivery)
        assert got == [b"m8", b"m9"]  # (the leased ones stay the group's: none twice, none lost)
    finally:
        consumer.close()
