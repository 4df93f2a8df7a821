"""The Prometheus endpoint of a real server, scraped over HTTP."""

from __future__ import annotations

import re
import urllib.request

import pytest

from pzq.clients import native as client
from pzq.config import parse_endpoint
from pzq.errors import ConfigError

from conftest import free_tcp_endpoint, wait_until


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        return response.read().decode()


def value(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def test_metrics_report_queues_counters_commits_and_protocols(make_server):
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    mqks, _ = free_tcp_endpoint()
    srv = make_server(metrics_dsn=url, mqks_dsn=mqks)
    with client.Producer(srv.receive) as producer:
        assert all(r.ok for r in producer.produce_many([b"m%d" % i] for i in range(10)))
    with client.Consumer(srv.send) as consumer:
        for _ in range(4):
            delivery = consumer.receive(timeout_s=5)
            consumer.ack(delivery)

    def settled() -> str | None:  # the loop publishes its figures once a second
        text = scrape(url)
        # (a figure taken between the producer's first and last message says depth 6 too: wait for the acks)
        done = value(text, 'pzq_queue_depth{queue="default"}') == 6
        return text if done and value(text, 'pzq_queue_acked_total{queue="default"}') == 4 else None

    text = wait_until(settled, timeout_s=10)
    assert value(text, 'pzq_queue_produced_total{queue="default"}') == 10
    assert value(text, 'pzq_queue_acked_total{queue="default"}') == 4
    assert value(text, "pzq_produced_total") == 10
    assert value(text, 'pzq_queue_oldest_message_age_seconds{queue="default"}') >= 0
    assert value(text, "pzq_commit_seconds_count") >= 1
    assert value(text, "pzq_commit_messages_sum") == 10
    assert value(text, 'pzq_protocol_figure{figure="connections",protocol="mqks"}') == 0


def test_a_bad_metrics_endpoint_is_a_clear_config_error():
    for bad in ("127.0.0.1:9108", "http://host", "http://host:0", "https://h:1"):
        with pytest.raises(ConfigError, match="--metrics-dsn"):
            parse_endpoint(bad)
    assert parse_endpoint("http://[::1]:9108") == ("::1", 9108)


def test_metrics_count_the_permissions_refusals_per_client_and_right(make_server, tmp_path):
    tcp, _ = free_tcp_endpoint()
    url = tcp.replace("tcp://", "http://")
    api, _ = free_tcp_endpoint()
    rules = tmp_path / "permissions.toml"
    rules.write_text('[default]\nproduce = ["default"]\nconsume = ["default"]\n')
    make_server(metrics_dsn=url, api_dsn=api, permissions=str(rules))
    from pzq.clients.api import ApiClient, ApiError

    with ApiClient(api, timeout_s=5) as client_:
        with pytest.raises(ApiError, match="not-permitted"):
            client_.info("payroll")
    wait_until(lambda: value(scrape(url), 'pzq_permission_refusals_total{client="anonymous",right="consume"}') == 1, 10)
