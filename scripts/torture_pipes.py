"""The torture benchmark's cases of the receiving pipes (issue 39 item 2; scripts/torture.py): many
producers at once, and a producer that pipelines messages past --max-message-size. Wire helpers only,
nothing of pzq imported, as the other case modules."""

from __future__ import annotations

import os
import time

import zmq
from torture_cases import dealer
from torture_wire import Server

WINDOW = 100


def many_producers(srv: Server, size: int, short: bool) -> str:
    """``size`` producers of 100-byte messages at once, each with a window of 100 on its own connection,
    2,000 messages each (200 when short): what they store together, and the slowest one's share."""
    each = 200 if short else 2_000
    socks = [dealer(srv.receive, sndhwm=0) for _ in range(size)]
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    index = {sock: i for i, sock in enumerate(socks)}
    sent, acked, refused = [0] * size, [0] * size, 0
    body = os.urandom(100)

    def top_up(i: int) -> None:
        while sent[i] < each and sent[i] - acked[i] < WINDOW:
            socks[i].send_multipart([b"%d" % sent[i], b"", body])
            sent[i] += 1

    started = time.monotonic()
    for i in range(size):
        top_up(i)
    slowest_at_half, deadline = 0, started + 120
    while sum(acked) < size * each and time.monotonic() < deadline:
        for sock, _ in poller.poll(1000):
            i = index[sock]
            while sock.poll(0):
                answer = sock.recv_multipart()
                acked[i] += 1
                refused += answer[1:2] != [b"1"]
            top_up(i)
        if not slowest_at_half and sum(acked) >= size * each // 2:
            slowest_at_half = min(acked)
    seconds = time.monotonic() - started
    for sock in socks:
        sock.close(0)
    done = sum(acked)
    lost = "" if done == size * each and not refused else f" NOT all stored: {done} answered, {refused} refused"
    return (
        f"{size} producers x {each}: {done / seconds:,.0f} msg/s, the slowest at {slowest_at_half} "
        f"when half were acked{lost}"
    )


def oversized_pipeline(srv: Server, size: int, short: bool) -> str:
    """``size`` messages of 15 MiB, over the default --max-message-size of 1 MiB, sent at once by one
    producer: each is read to be answered "too large" (not cut off, not held), beside the honest clients."""
    body = os.urandom(15 << 20)
    sock = dealer(srv.receive, sndhwm=0)
    started = time.monotonic()
    for i in range(size):
        sock.send_multipart([b"%d" % i, b"", body])
    answers, deadline = [], started + 120
    while len(answers) < size and sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
        answers.append(sock.recv_multipart())
    seconds = time.monotonic() - started
    sock.close(0)
    too_large = sum(1 for a in answers if a[1:2] == [b"0"] and b"too large" in a[-1].lower())
    verdict = "" if too_large == size else " NOT each answered too large"
    return f"{size} x 15 MiB over the limit: {too_large} answered too large in {seconds:.1f} s{verdict}"
