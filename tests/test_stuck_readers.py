"""Peers that read nothing (pzq/endpoints/stuck.py): the kernel's figures of a real TCP connection, and
the rule that cuts a connection off, on figures a test gives it (no test waits for time to pass)."""

from __future__ import annotations

import socket

from pzq.config import Limits
from pzq.endpoints.stuck import StuckReaders, progress

from conftest import wait_until

LIMITS = Limits(stuck_reader_s=5.0, stuck_check_s=1.0, stuck_checks_per_turn=64)


def test_the_kernel_shows_bytes_waiting_and_none_acknowledged_while_the_peer_reads_nothing():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        writer, _ = listener.accept()
        with reader, writer:
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            writer.setblocking(False)
            try:
                while True:
                    writer.send(b"x" * 65536)
            except BlockingIOError:  # (its receive window is closed: the rest waits in our send queue)
                pass
            queued, acked = wait_until(lambda: (seen := progress(writer.fileno())) and seen[0] and seen)
            assert queued > 0, "the bytes it has not taken wait in the send queue"
            reader.recv(65536)
            wait_until(lambda: progress(writer.fileno())[1] > acked)  # (what it read is acknowledged)
    assert progress(-1) is None


class Kernel:
    """Figures of descriptors a test sets (fd -> (bytes queued, bytes acknowledged)), and what was cut."""

    def __init__(self):
        self.seen: dict[int, tuple[int, int]] = {}
        self.cut: list[int] = []

    def watch(self, limits: Limits = LIMITS) -> StuckReaders:
        return StuckReaders(
            "test", "tcp://127.0.0.1:1", lambda: set(self.seen), limits, look=self.seen.get, cut=self.on_cut
        )

    def on_cut(self, fd: int, endpoint: str) -> None:
        self.cut.append(fd)
        del self.seen[fd]


def test_a_connection_with_bytes_waiting_and_none_acknowledged_for_the_limit_is_cut_off():
    kernel = Kernel()
    kernel.seen = {7: (100_000, 5_000), 8: (100_000, 5_000)}
    watch = kernel.watch()
    for now in range(7):
        if now == 3:
            kernel.seen[8] = (100_000, 6_000)  # (it read something)
        watch.check(float(now))
    assert kernel.cut == [7] and watch.cut_total == 1, "one that reads, however slowly, stays"


def test_a_connection_with_nothing_waiting_is_never_cut_off_however_long_it_is_silent():
    kernel = Kernel()
    kernel.seen = {7: (0, 5_000)}
    watch = kernel.watch()
    for now in range(60):
        watch.check(float(now))
    assert kernel.cut == []


def test_each_connection_is_looked_at_once_a_round_and_a_turn_looks_at_its_share_only():
    kernel = Kernel()
    kernel.seen = {fd: (0, 0) for fd in range(100)}
    looked: list[int] = []
    watch = kernel.watch(Limits(stuck_reader_s=5.0, stuck_check_s=1.0, stuck_checks_per_turn=30))
    watch.look = lambda fd: looked.append(fd) or kernel.seen.get(fd)
    assert [watch.check(0.0) for _ in range(5)] == [30, 30, 30, 10, 0], "then it waits for the next round"
    assert sorted(looked) == list(range(100))
    assert watch.check(1.0) == 30
