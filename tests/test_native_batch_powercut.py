"""A power cut under a stream of batches (tests/test_power_cut.py's shim and rebuild): every message of
every batch the producer was acked for, and of every acked prefix, is in the durable image, and so is the
batch id that makes a resend of it store nothing."""

from __future__ import annotations

import signal

import test_power_cut
import zmq
from test_power_cut import MESSAGES, recovered

from pzq.protocols import native_batch as wire
from pzq.store import Store
from pzq.store.dedup_keys import DedupKeys

shim = test_power_cut.shim  # (the fixture that builds the shim, shared)
PER_BATCH = 20
WINDOW = 4  # batches in flight


def batches_until_cut(srv, cut_after: int) -> tuple[set[bytes], set[bytes]]:
    """Send batches (WINDOW in flight) and SIGKILL the server once ``cut_after`` messages were acked, with
    more in flight; the acked bodies and the ids of batches acked whole."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(srv.receive)
    acked: set[bytes] = set()
    whole: set[bytes] = set()
    sent: dict[bytes, list[bytes]] = {}
    answered: list[bytes] = []

    def take(frames: list[bytes]) -> None:
        answer = wire.parse_batch_ack(frames)
        assert answer is not None
        answered.append(answer.batch_id)
        acked.update(sent[answer.batch_id][: answer.stored])
        if answer.ok:
            whole.add(answer.batch_id)

    try:
        for n in range(MESSAGES // PER_BATCH):
            if n - len(answered) >= WINDOW:
                assert sock.poll(10_000), "no ack within 10 s"
                take(sock.recv_multipart())
                if len(acked) >= cut_after:
                    break
            bodies = [b"message %06d" % (n * PER_BATCH + i) for i in range(PER_BATCH)]
            sent[b"b%d" % n] = bodies
            sock.send_multipart(wire.batch(b"b%d" % n, [[body] for body in bodies]))
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(timeout=10)
        while sock.poll(0):  # acks that left before the kill count too
            take(sock.recv_multipart())
    finally:
        sock.close(linger=0)
    return acked, whole


def test_after_a_power_cut_every_message_of_every_acked_batch_is_on_disk_with_its_id(
    process_server,
    shim,
    tmp_path,
):
    journal = tmp_path / "journal"
    srv = process_server(env={"LD_PRELOAD": str(shim), "PZQ_POWERCUT_JOURNAL": str(journal)})
    acked, whole = batches_until_cut(srv, cut_after=1500)
    found = recovered(tmp_path, journal)
    assert len(acked) >= 1500
    assert acked <= found, f"{len(acked - found)} acknowledged messages lost"
    store = Store(tmp_path / "after-the-cut", max_size=64 << 20, verify=True)
    try:
        remembered = {key.removeprefix("native:").encode() for key, _ in DedupKeys(store).items(b"native:")}
    finally:
        store.close()
    assert whole <= remembered, "an acked batch's id is durable with its messages"
