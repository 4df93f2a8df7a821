"""Client text never starts a log line of its own: a newline, carriage return or escape sequence in an
eMQP header, an MQKS flag or a queue name reaches the text log escaped, and JSON logs stay JSON."""

from __future__ import annotations

import io
import json
import logging
import sys
import uuid

import pytest
import zmq

from pzq.clients.mqks import MqksClient
from pzq.logs import JsonFormatter, TextFormatter, escape

from conftest import free_tcp_endpoint, mqks_barrier, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def text_log():
    """What pzq logs (INFO and up) as `pzq serve --log-format text` writes it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield out
    root.removeHandler(handler)
    root.setLevel(level)


def no_line_of_its_own(log: str) -> None:
    assert "FAKE" in log, "the client's text reached the log"
    assert not [line for line in log.splitlines() if line.startswith("FAKE")], log


def test_an_emqp_header_with_a_newline_is_escaped_in_the_log(make_server, text_log):
    front, _ = free_tcp_endpoint()
    srv = make_server(emqp_frontend_dsn=front, emqp_backend_dsn=free_tcp_endpoint()[0])
    peer = zmq.Context.instance().socket(zmq.DEALER)
    peer.linger = 0
    try:
        peer.connect(front)
        headers = b"retry-count:\nFAKE LINE\r\nFAKE\x1b[2J"
        peer.send_multipart([b"", b"eMQP/1.0", b"REQUEST", str(uuid.uuid4()).encode(), b"jobs", headers, b'"x"'])
        wait_until(lambda: "FAKE" in text_log.getvalue(), timeout_s=10)
    finally:
        peer.close()
    srv.stop()
    no_line_of_its_own(text_log.getvalue())
    assert "\\x1b[2J" in text_log.getvalue() and "\x1b" not in text_log.getvalue()


def test_an_mqks_flag_and_queue_name_with_control_characters_never_start_a_log_line(make_server, text_log):
    srv = make_server(mqks_dsn=free_tcp_endpoint()[0])
    conn = MqksClient(srv.config.mqks_dsn)
    try:
        # (MQKS refuses a tab or carriage return in a line; every other line break gets this far)
        conn.send("r1 consume q --delete-queue-when-unused=\x0bFAKE\x85FAKE\u2028FAKE\x1cFAKE")
        conn.send("r2 consume q\x0cFAKE\x1b[2J --bogus=\x0bFAKE")
        mqks_barrier(conn)
    finally:
        conn.close()
    srv.stop()
    # MQKS refuses a line with control characters before it reads its words: the client's text may not
    # reach the log at all; where it does, it is escaped.
    log = text_log.getvalue()
    assert "ids must not contain control characters" in log or "FAKE" in log, log
    assert not [line for line in log.splitlines() if line.startswith("FAKE")], log
    assert "\x1b" not in log


def test_the_text_of_an_exception_under_a_traceback_is_escaped_too():
    record = logging.LogRecord("pzq", logging.ERROR, __file__, 1, "failed on %s", ("queue\nFAKE",), None)
    try:
        raise ValueError("queue\nFAKE LINE")
    except ValueError:
        record.exc_info = sys.exc_info()
    text = TextFormatter().format(record)
    assert "ValueError: queue\\nFAKE LINE" in text and "failed on queue\\nFAKE" in text
    assert not [line for line in text.splitlines() if line.startswith("FAKE")], text


def test_json_logs_stay_one_valid_object_a_line():
    record = logging.LogRecord("pzq", logging.WARNING, __file__, 1, "bad %s", ("a\nFAKE\u2028\x1b",), None)
    line = JsonFormatter().format(record)
    assert "\n" not in line and json.loads(line)["message"] == "bad a\nFAKE\u2028\x1b"


def test_printable_text_is_logged_as_it_is():
    assert escape("queue 'orders' é ✓") == "queue 'orders' é ✓"
    assert escape("a\tb\x00") == "a\\tb\\x00"


def test_a_routing_id_libzmq_made_is_shown_as_a_digest_others_as_text_or_hex():
    from pzq.logs import peer_label

    made, after = b"\x00\x2a\xe8\x94\x4b", b"\x00\x2a\xe8\x94\x4c"
    assert peer_label(made).startswith("peer-") and made.hex() not in peer_label(made)
    assert peer_label(made) == peer_label(made) != peer_label(after), "one peer one name, each its own"
    assert peer_label(b"worker-7") == "worker-7"
    assert peer_label(b"\x00\x01") == "0001" and peer_label(b"\xff" * 40) == "ff" * 32
