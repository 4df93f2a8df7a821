"""Deliberately failing tests (issue 25, item 6): each fails and leaves behind what made `scripts/test`
hang after a failure. The suite must still end within a minute of pytest's summary. Removed once
measured."""

from __future__ import annotations

import os
import sys
import time

import zmq


def test_a_test_that_times_out_leaving_a_socket_with_unsent_messages_and_linger_minus_one():
    ctx = zmq.Context.instance()
    ctx.linger = -1
    sock = ctx.socket(zmq.PUSH)
    sock.linger = -1
    sock.connect("tcp://127.0.0.1:9")  # nobody listens: what it sends stays queued forever
    for _ in range(10):
        sock.send(b"never delivered")
    time.sleep(60)  # past --timeout: the test is failed with the socket still open


def test_a_test_that_fails_with_a_local_spark_session_running():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    assert session.range(3).count() == 4, "deliberately wrong"


def test_a_test_that_times_out_leaving_its_own_context_with_unsent_messages():
    ctx = zmq.Context()  # its own, as ApiClient and tests/test_crash.py make: destroyed when collected
    sock = ctx.socket(zmq.PUSH)
    sock.linger = -1
    sock.connect("tcp://127.0.0.1:9")
    for _ in range(10):
        sock.send(b"never delivered")
    time.sleep(60)


def test_a_test_that_fails_leaving_a_thread_that_never_ends():
    import threading

    threading.Thread(target=threading.Event().wait, name="never-ends").start()  # not a daemon
    raise AssertionError("deliberately failing")
