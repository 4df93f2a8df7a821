"""A small blocking MQKS client (one TCP connection, one line per request): the CLI's `pzq mqks`, the
tests and `pzq bench --protocol mqks` use it. Lines are written and read by protocols/mqks.py; every
read has a timeout."""

from __future__ import annotations

import itertools
import secrets
import time

from pzq.clients.sockets import tcp_connect
from pzq.errors import ClientError
from pzq.protocols.mqks_client import Delivery, parse_answer, parse_delivery, request_line

MAX_LINE = 64 << 20  # an unfinished line longer than this is not an MQKS server speaking
MAX_KEPT = 100_000  # other lines kept while waiting for an answer


class MqksClient:
    """Lines out with fresh request ids; lines in, buffered."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:25000", *, timeout_s: float = 5.0, prefix: str | None = None):
        self.sock = tcp_connect(endpoint, timeout_s=timeout_s)
        self.timeout_s = timeout_s
        # Request ids double as message ids: a random prefix keeps them unique across clients and runs.
        prefix = prefix if prefix is not None else secrets.token_hex(4) + "-"
        self._ids = (f"{prefix}{n}" for n in itertools.count(1))
        self._buf = b""
        self.pending: list[str] = []  # lines read while waiting for another one

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> MqksClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, line: str) -> None:
        """Write one line as it is (a raw request, for tests and tools); its newline is added."""
        self.write(line.encode() + b"\n")

    def write(self, lines: bytes) -> None:
        """Write whole lines, each ending with its newline."""
        try:
            self.sock.sendall(lines)
        except OSError as exc:
            raise ClientError(f"the connection to the MQKS server failed: {exc}") from None

    def request(self, action: str, data: str = "", *, confirm: bool = False) -> str:
        """Send one request; returns its request id."""
        request_id = next(self._ids)
        self.write(request_line(request_id, action, data, confirm))
        return request_id

    def read_line(self, timeout_s: float | None = None) -> str | None:
        """The next line from the server, or None if none came in time."""
        if self.pending:
            return self.pending.pop(0)
        self.sock.settimeout(self.timeout_s if timeout_s is None else timeout_s)
        while b"\n" not in self._buf:
            try:
                more = self.sock.recv(65536)
            except TimeoutError:
                return None
            except OSError as exc:
                raise ClientError(f"the connection to the MQKS server failed: {exc}") from None
            if len(self._buf) > MAX_LINE:
                raise ClientError(f"a line of over {MAX_LINE} bytes from the server: is an MQKS server there?")
            if not more:
                raise ClientError("the server closed the connection")
            self._buf += more
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace")

    def wait_ok(self, request_id: str) -> str:
        """Wait for the answer to ``request_id``, keeping other lines for later; raises on an error."""
        kept: list[str] = []
        deadline = time.monotonic() + self.timeout_s  # however many other lines come meanwhile
        try:
            while True:
                line = self.read_line(max(0.001, deadline - time.monotonic()))
                if line is None or time.monotonic() > deadline or len(kept) > MAX_KEPT:
                    raise ClientError(f"no answer to {request_id} within {self.timeout_s} s")
                answer = parse_answer(line, request_id)
                if answer is None:
                    kept.append(line)
                elif answer.ok:
                    return answer.data
                else:
                    raise ClientError(f"{request_id} refused: error id {answer.data} (in the server log)")
        finally:
            self.pending[:0] = kept

    def publish(self, event: str, data: str, *, confirm: bool = True) -> None:
        request_id = self.request("publish", f"{event} {data}", confirm=confirm)
        if confirm:
            self.wait_ok(request_id)

    def consume(
        self,
        queue: str,
        events: list[str] | None = None,
        *,
        manual_ack: bool = False,
        add: bool = False,
        prefetch: int | None = None,
    ) -> str:
        """Start a consumer (durably confirmed); returns its consumer id. ``prefetch`` (pzq only) caps
        its unacked messages."""
        parts = [
            queue,
            *(["--add"] if add else []),
            *(events or []),
            *(["--manual-ack"] if manual_ack else []),
            *([f"--prefetch={prefetch}"] if prefetch else []),
        ]
        consumer = self.request("consume", " ".join(parts), confirm=True)
        self.wait_ok(consumer)
        return consumer

    def receive(self, timeout_s: float | None = None) -> Delivery | None:
        """The next delivery (other lines are skipped), or None if none came in time."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            line = self.read_line(max(0.001, deadline - time.monotonic()))
            if line is None:
                return None
            delivery = parse_delivery(line)
            if delivery is not None:
                return delivery
            if time.monotonic() > deadline:  # only other lines, however many: still none in time
                return None

    def ack(self, consumer: str, msg_id: str = "--all", *, confirm: bool = False) -> None:
        request_id = self.request("ack", f"{consumer} {msg_id}", confirm=confirm)
        if confirm:
            self.wait_ok(request_id)

    def reject(self, consumer: str, msg_id: str = "--all", *, confirm: bool = False) -> None:
        request_id = self.request("reject", f"{consumer} {msg_id}", confirm=confirm)
        if confirm:
            self.wait_ok(request_id)
