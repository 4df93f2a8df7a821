"""A power cut, not just a crash: the server runs with an LD_PRELOAD shim (tests/powercut/powercut.c)
that journals every write to the LMDB data file and which of them an fsync made durable. After a
SIGKILL mid-stream, the data file is rebuilt from the durable writes only (the worst page cache a
machine can lose) and every message the producer was acked for must be in it. With --no-hard-sync
the same cut loses acknowledged messages: the test shows what that option risks."""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest
import zmq

from pzq.protocols import native as wire
from pzq.store import Store

SHIM = Path(__file__).parent / "powercut" / "powercut.c"
MESSAGES = 3000
WINDOW = 50


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the power-cut shim (scripts/test installs gcc)")
    out = tmp_path_factory.mktemp("shim") / "powercut.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIM), "-ldl"], check=True, timeout=120)
    return out


def journaled(journal: Path) -> list[list]:
    """The journal's writes in order, each ``[durable, offset, bytes]``: a 'W' write counts once an 'S'
    (fsync) follows it, a 'D' write (O_DSYNC) at once; an 'F' (a sync that failed) loses every write
    not yet durable for good."""
    raw = journal.read_bytes()
    records: list[list] = []
    pos = 0
    while pos < len(raw):
        kind = raw[pos : pos + 1]
        pos += 1
        if kind == b"S":
            for record in records:
                record[0] = True
            continue
        if kind == b"F":
            records = [record for record in records if record[0]]
            continue
        if pos + 12 > len(raw) or pos + 12 + struct.unpack_from("=QI", raw, pos)[1] > len(raw):
            break  # (the last record, torn by the kill as the shim wrote it: its write never returned to pzq)
        offset, length = struct.unpack_from("=QI", raw, pos)
        pos += 12
        records.append([kind == b"D", offset, raw[pos : pos + length]])
        pos += length
    return records


def durable_image(journal: Path) -> bytes:
    """The data file as only its durable writes left it, replayed in the order they were made."""
    records = journaled(journal)
    image = bytearray()
    for durable, offset, data in records:
        if durable:
            if len(image) < offset + len(data):
                image.extend(bytes(offset + len(data) - len(image)))
            image[offset : offset + len(data)] = data
    return bytes(image)


def produce_until_cut(srv, cut_after: int) -> set[bytes]:
    """Pipeline messages (window WINDOW) and SIGKILL the server once ``cut_after`` acks came back, with
    more in flight; the bodies the producer was acked for."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(srv.receive)
    acked: set[bytes] = set()
    sent: dict[bytes, bytes] = {}
    try:
        for i in range(MESSAGES):
            if len(sent) - len(acked) >= WINDOW:
                assert sock.poll(10_000), "no ack within 10 s"
                ack = wire.parse_produce_ack(sock.recv_multipart())
                assert ack is not None and ack.ok
                acked.add(sent[ack.message_id])
                if len(acked) >= cut_after:
                    break
            body = b"message %06d" % i
            sent[b"%d" % i] = body
            sock.send_multipart(wire.produce(b"%d" % i, [body]))
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(timeout=10)
        while sock.poll(0):  # acks that left before the kill count too
            ack = wire.parse_produce_ack(sock.recv_multipart())
            if ack is not None and ack.ok:
                acked.add(sent[ack.message_id])
    finally:
        sock.close(linger=0)
    return acked


def recovered(tmp_path: Path, journal: Path) -> set[bytes]:
    """The bodies a restart on the rebuilt data file finds."""
    after = tmp_path / "after-the-cut"
    after.mkdir()
    image = durable_image(journal)
    if len(image) < 2 * 4096:  # not even LMDB's meta pages reached the disk: an empty store
        return set()
    (after / "data.mdb").write_bytes(image)
    store = Store(after, max_size=64 << 20, verify=True)
    try:
        return {b"".join(m.frames) for m in store.scan("default", 0, MESSAGES)}
    finally:
        store.close()


def test_after_a_power_cut_every_acknowledged_message_is_on_disk(process_server, shim, tmp_path):
    journal = tmp_path / "journal"
    srv = process_server(env={"LD_PRELOAD": str(shim), "PZQ_POWERCUT_JOURNAL": str(journal)})
    acked = produce_until_cut(srv, cut_after=1500)
    found = recovered(tmp_path, journal)
    assert len(acked) >= 1500
    assert acked <= found, f"{len(acked - found)} acknowledged messages lost"


def produce_until_the_power_goes(srv) -> tuple[set[bytes], int]:
    """Pipeline messages (window WINDOW) until the server stops by itself (its shim cut the power, or a
    sync failed); the bodies the producer was acked for, and how many it sent."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 1000
    sock.connect(srv.receive)
    acked: set[bytes] = set()
    sent: dict[bytes, bytes] = {}

    def take() -> None:
        ack = wire.parse_produce_ack(sock.recv_multipart())
        assert ack is not None and ack.ok
        acked.add(sent[ack.message_id])

    try:
        for i in range(MESSAGES):
            while len(sent) - len(acked) >= WINDOW and srv.proc.poll() is None:
                if sock.poll(100):
                    take()
            if srv.proc.poll() is not None:
                break
            body = b"message %06d" % i
            try:
                sock.send_multipart(wire.produce(b"%d" % i, [body]))
            except zmq.Again:  # (the server is gone: a DEALER without a peer takes nothing)
                break
            sent[b"%d" % i] = body
        srv.proc.wait(timeout=10)
        while sock.poll(0):  # acks that left before the cut count too
            take()
    finally:
        sock.close(linger=0)
    return acked, len(sent)


def test_a_cut_after_a_commits_meta_write_and_before_the_next_sync_finds_none_of_its_acks_sent(
    process_server, shim, tmp_path
):
    # One sync a commit: commit N's meta page reaches the disk with the next data sync. The shim cuts
    # the power at that instant (a meta page written, the sync that would carry it not yet made): an ack
    # of commit N sent before it would name a message the rebuilt store does not have.
    journal = tmp_path / "journal"
    cut = {"LD_PRELOAD": str(shim), "PZQ_POWERCUT_JOURNAL": str(journal), "PZQ_POWERCUT_AT_SYNC": "40"}
    srv = process_server(env=cut)
    acked, sent = produce_until_the_power_goes(srv)
    assert srv.proc.returncode == -signal.SIGKILL, f"the shim did not cut the power within {sent} messages"
    unsynced = [r for r in journaled(journal) if not r[0]]
    assert any(offset < 2 * 4096 for _, offset, _ in unsynced), "the cut fell between a meta write and its sync"
    found = recovered(tmp_path, journal)
    assert len(acked) >= WINDOW, "acks flowed before the cut"
    assert acked <= found, f"{len(acked - found)} acknowledged messages lost"


def test_with_no_hard_sync_a_power_cut_loses_acknowledged_messages(process_server, shim, tmp_path):
    journal = tmp_path / "journal"
    srv = process_server("--no-hard-sync", env={"LD_PRELOAD": str(shim), "PZQ_POWERCUT_JOURNAL": str(journal)})
    acked = produce_until_cut(srv, cut_after=1500)
    found = recovered(tmp_path, journal)
    assert len(acked - found) > 0, "--no-hard-sync risks acknowledged messages: a cut must show it"
