"""Logs an operator can read: per-message events (dead letters, with their reasons) come as one INFO line
per queue per interval with counts, never a line per message, and a flood over many queues stays a few
lines."""

from __future__ import annotations

import logging
import re

from click.testing import CliRunner

from pzq.cli import cli
from pzq.logs import EventTally

from conftest import wait_until


def test_a_tally_logs_one_line_per_queue_with_counts_then_starts_again(caplog):
    tally = EventTally(logging.getLogger("pzq.test"), every_s=10, queues=20)
    for _ in range(3016):
        tally.add("q", "dead-lettered (max-deliveries)")
    tally.add("q", "dead-lettered (expired)", 12)
    tally.add("other", "dead-lettered (expired)")
    began = tally._since
    assert began is not None
    with caplog.at_level(logging.INFO, logger="pzq.test"):
        tally.tick(began + 9.9)
        assert caplog.records == []  # not yet: the interval is not over
        tally.tick(began + 10)
        assert tally.flush() == 0  # nothing new: nothing logged
    assert [r.getMessage() for r in caplog.records] == [
        "queue 'q': 3,016 dead-lettered (max-deliveries), 12 dead-lettered (expired) in the last 10 s",
        "queue 'other': 1 dead-lettered (expired) in the last 10 s",
    ]
    assert {r.levelno for r in caplog.records} == {logging.INFO}


def test_events_on_thousands_of_queues_cost_a_bounded_number_of_lines(caplog):
    tally = EventTally(logging.getLogger("pzq.test"), every_s=10, queues=20)
    for i in range(5000):  # a hostile producer's messages, each to a queue of its own, all poison
        tally.add(f"q{i}", "dead-lettered (max-deliveries)", 1 + (i == 7))
    with caplog.at_level(logging.INFO, logger="pzq.test"):
        assert tally.flush() == 21
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("queue 'q7': 2 dead-lettered")  # the busiest first
    assert lines[-1] == "4,980 more queue(s): 4,980 dead-lettered (max-deliveries) in the last 1 s"


def test_a_server_dead_lettering_a_thousand_messages_logs_a_line_or_two_not_a_thousand(process_server):
    srv = process_server("--max-deliveries", "1", "--log-level", "info")
    runner = CliRunner()
    produced = runner.invoke(cli, ["produce", "--receive-dsn", srv.receive], input="poison\n" * 1000)
    assert produced.exit_code == 0, produced.output
    args = ["consume", "--send-dsn", srv.send, "--consume-dsn", srv.consume, "-n", "1000", "--nack", "--timeout", "20s"]
    consumed = runner.invoke(cli, args)
    assert consumed.exit_code == 0, consumed.output
    # a nacked message was delivered once, as often as --max-deliveries allows: the next take moves it
    runner.invoke(cli, ["consume", "--send-dsn", srv.send, "--consume-dsn", srv.consume, "--timeout", "500ms"])
    wait_until(lambda: srv.stats()["dead_lettered_total"] == 1000, timeout_s=30)
    assert srv.stop() == 0  # (a stop logs what the last interval counted)
    log = srv.log.read_text().splitlines()
    lines = [line for line in log if "dead-lettered" in line or "dead letters" in line]
    assert 1 <= len(lines) <= 3, lines  # an interval of 10 s; a slow machine may cut the run in two or three
    counted = [
        re.search(r" INFO pzq\.broker: queue 'default': ([\d,]+) dead-lettered \(max-deliveries\) in", line)
        for line in lines
    ]
    assert all(counted), lines
    assert sum(int(m.group(1).replace(",", "")) for m in counted if m) == 1000
