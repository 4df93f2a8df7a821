"""The torture benchmark's cases of the native doors (issue 39; scripts/torture.py): the legacy send
socket against a consumer that reads nothing, and batch ids and batched consumers under many CURVE keys
(those need CURVE, which the harness does not speak: tests/test_native_batch_ids.py and
tests/test_native_consume_hostile.py are their proof). They speak the wire themselves, as every case.
"""

from __future__ import annotations

import time

import zmq
from torture_cases import dealer
from torture_wire import Server, find, monitor

MiB = 1 << 20
WINDOW = 8  # the producer's messages in flight


def native_send_deaf(srv: Server, size: int, short: bool) -> str:
    """A ROUTER consumer on the send socket that never reads (one message in its pipe, a 4 KiB receive
    buffer), beside one that reads and acks every delivery at once; ``size`` messages of 1 MiB produced
    through the receive socket, ``WINDOW`` in flight. What the reader got, and the most the memory bound
    counted for deliveries while it ran."""
    ctx = zmq.Context.instance()
    opened = find(monitor(srv.monitor), "open") or 0
    deaf = ctx.socket(zmq.ROUTER)
    deaf.rcvhwm, deaf.rcvbuf, deaf.linger = 1, 4096, 0
    deaf.connect(srv.send)
    reader = ctx.socket(zmq.ROUTER)
    reader.linger = 0
    reader.connect(srv.send)
    deadline = time.monotonic() + 10
    while (find(monitor(srv.monitor), "open") or 0) < opened + 2 and time.monotonic() < deadline:
        time.sleep(0.02)  # (both connected before the first delivery: the deaf one gets its share)
    producer = dealer(srv.receive, sndhwm=0)
    poller = zmq.Poller()
    poller.register(producer, zmq.POLLIN)
    poller.register(reader, zmq.POLLIN)
    body = b"d" * MiB
    sent = acked = refused = got = 0
    counted = 0
    started = time.monotonic()
    deadline = started + (3 if short else 120)
    look_at = started
    while (got < size or acked + refused < size) and time.monotonic() < deadline:
        while sent < size and sent - acked - refused < WINDOW:
            producer.send_multipart([b"%d" % sent, b"", body])
            sent += 1
        ready = dict(poller.poll(20))
        while producer in ready and producer.poll(0):
            answer = producer.recv_multipart()
            if answer[1:2] == [b"1"]:
                acked += 1
            else:
                refused += 1
                if refused == 1:
                    print(f"  (a refusal: {answer!r:.120})", flush=True)
        while reader in ready and reader.poll(0):
            frames = reader.recv_multipart()
            reader.send_multipart([frames[0], frames[1], b"1"])
            got += len(frames) > 5 and len(frames[5]) == MiB  # (the honest producer's probes are small)
        if time.monotonic() >= look_at:
            look_at = time.monotonic() + 0.25
            counted = max(counted, find(monitor(srv.monitor), "deliveries_bytes") or 0)
    elapsed = time.monotonic() - started
    figures = monitor(srv.monitor)
    cut = find(figures, "send_stalled_cut_total")
    deaf.close(0)
    reader.close(0)
    producer.close(0)
    short_of = "" if got >= size or short else " (NOT all)"
    return (
        f"{size} x 1 MiB ({acked} stored, {refused} refused) beside a consumer that never reads: the reader "
        f"got {got}{short_of} in {elapsed:.1f} s; deliveries counted {counted / MiB:.0f} MiB at most; "
        f"the deaf one cut {cut} time(s)"
    )
