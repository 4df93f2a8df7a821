"""The etcd registry's thread while etcd is away (pzq/etcd_registry.py): it tries again a few times a
second, not in a spin. Without a pause after a failed round it made a round every 50 ms (each member
tried in turn: 52 refused connections a second a shard, 4 % of a core of an idle shard against 1 % with
etcd up, and all of them at etcd's door the moment it returns). No etcd here: a port nobody listens on."""

from __future__ import annotations

import socket
import time

from pzq import etcd_registry
from pzq.etcd_registry import EtcdRegistry
from pzq.shards import Shard


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_while_etcd_refuses_every_call_the_registry_tries_again_a_few_times_a_second_not_in_a_spin(tmp_path):
    urls = ",".join(f"http://127.0.0.1:{closed_port()}" for _ in range(3))
    registry = EtcdRegistry(urls, "/pzq", Shard("a", api_dsn="tcp://127.0.0.1:1"), "id", str(tmp_path / "cache"), 100)
    registry.start()
    try:
        deadline = time.monotonic() + 10
        while registry.stats()["call_failures_total"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        before, begin = registry.calls_total, time.monotonic()
        time.sleep(2.0)  # (the rate of calls over a while: nothing to poll for)
        rounds = (registry.calls_total - before) / 3 / (time.monotonic() - begin)  # (3 members a round)
    finally:
        registry.stop()
    assert not registry.view.reachable and "127.0.0.1" in registry.view.error
    assert rounds <= 1.5 / etcd_registry.RETRY_S, f"{rounds:.1f} rounds a second while etcd is away"
    assert rounds >= 0.5 / etcd_registry.RETRY_S, f"{rounds:.1f} rounds a second: etcd's return would be seen late"
