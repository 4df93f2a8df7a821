"""A blocking client of the pzq API (protocols/api.py): what the Spark connector and the tests use.

Every API command is idempotent, so a call that gets no answer in ``attempt_s`` is sent again on a
fresh socket until ``timeout_s`` has passed; a server that restarts in between (even after SIGKILL)
answers the resent request. Only then does the call raise ClientError.
"""

from __future__ import annotations

import collections
import os
import time
import uuid
from collections.abc import Iterator

import zmq

from pzq.clients.sockets import Curve, connect, receive
from pzq.errors import ClientError
from pzq.protocols import api

DEFAULT_ENDPOINT = "tcp://127.0.0.1:11133"
BUSY_WAIT_S = 0.2  # how long a request answered "busy" (the server's memory bound; nothing done) waits to ask again


class ApiError(ClientError):
    """The server refused a request; ``code`` is its machine-readable reason."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ApiClient:
    """One DEALER connection to the API endpoint. Not thread-safe; not picklable (make one per process)."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        timeout_s: float = 60.0,
        attempt_s: float = 5.0,
        curve: Curve | None = None,
    ):
        self.endpoint = endpoint
        self.curve = curve
        self.timeout_s = timeout_s
        self.attempt_s = attempt_s
        self._pid = os.getpid()
        self._ctx = zmq.Context()  # its own: a forked Spark worker must not share its parent's
        self._sock: zmq.Socket | None = None
        self._counter = 0

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = connect(zmq.DEALER, self.endpoint, ctx=self._ctx, curve=self.curve)
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        self._ctx.term()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, command: str, **args) -> dict:
        """Send one request and return its results; raises ApiError (refused) or ClientError (no answer)."""
        self._counter += 1
        request_id = f"{self._pid}-{self._counter}".encode()
        frames = api.request(request_id, command, args)
        deadline = time.monotonic() + self.timeout_s
        while True:
            sock = self._socket()
            sock.send_multipart(frames)
            attempt_end = min(deadline, time.monotonic() + self.attempt_s)
            busy = False
            while (left := attempt_end - time.monotonic()) > 0:
                answer = receive(sock, int(left * 1000) + 1)
                if answer is None:
                    break
                reply = api.parse_reply(answer)
                if reply is None or reply[0] != request_id:
                    continue  # the answer to an earlier attempt, or garbage
                if not reply[1]:
                    code, detail = str(reply[2].get("code")), str(reply[2].get("detail"))
                    if code not in ("busy", "placing") or time.monotonic() + BUSY_WAIT_S >= deadline:
                        raise ApiError(code, detail)
                    busy = True  # (the server holds too much unread, or etcd places the queue: nothing done, ask again)
                    break
                return reply[2]
            if busy:
                time.sleep(BUSY_WAIT_S)
                continue
            # No answer: the server may be restarting. Drop what this socket queued and start over.
            sock.close(0)
            self._sock = None
            if time.monotonic() >= deadline:
                raise ClientError(f"no answer to {command} from {self.endpoint} in {self.timeout_s:.0f} s")

    # -- the commands ------------------------------------------------------------------------------

    def offsets(self, queue: str, group: str) -> tuple[int, int]:
        r = self.call("OFFSETS", queue=queue, group=group)
        return r["base"], r["end"]

    def lease(self, queue: str, group: str, after: int, max_n: int, *, durable: bool = True) -> tuple[int, int]:
        """Lease up to ``max_n`` from ``after`` on: (base, end). Not ``durable``: the reply does not wait
        for the commit of the leases (see pzq/protocols/api.py); hand an end on only after a durable call."""
        extra = {} if durable else {"durable": 0}
        r = self.call("LEASE", queue=queue, group=group, after=after, max=max_n, **extra)
        return r["base"], r["end"]

    def fetch(self, queue: str, group: str, lo: int, hi: int) -> tuple[list[list], int]:
        """Every message leased as ``lo .. hi-1`` (in as many replies as their size needs), and how
        many of that range are gone."""
        messages: list[list] = []
        gone = 0
        while True:
            r = self.call("FETCH", queue=queue, group=group, lo=lo, hi=hi)
            messages += r["messages"]
            gone += r["gone"]
            if r["next"] >= hi:
                return messages, gone
            lo = r["next"]

    def fetch_pages(
        self, queue: str, group: str, lo: int, hi: int, page: int, depth: int = 2
    ) -> Iterator[tuple[list[list], int]]:
        """Every message leased as ``lo .. hi-1``, one reply at a time in lease order: ``(messages, gone)``
        per reply. Up to ``depth`` FETCHes of ``page`` leases are in flight, so that the server reads the
        next page while this one crosses the socket and its caller uses it (the server answers one
        client's requests in order, each within its own budget: no request is longer for it). A reply
        cut short (its bytes, its time) is followed by a FETCH of the rest before the next page. Where a
        reply is late or ``busy``, what is in flight is asked again one at a time, with ``call``'s resends."""
        pending: collections.deque[tuple[bytes, int, int]] = collections.deque()  # sent, in lease order
        early: dict[bytes, tuple[bool, dict]] = {}  # replies that came before the one awaited
        at = lo
        while pending or at < hi:
            while len(pending) < max(1, depth) and at < hi:
                end = min(at + page, hi)
                pending.append((self._send("FETCH", queue=queue, group=group, lo=at, hi=end), at, end))
                at = end
            rid, a, b = pending.popleft()
            reply = early.pop(rid, None) or self._await(rid, {r for r, _, _ in pending}, early)
            if reply is None or not reply[0]:
                if reply is not None and reply[1].get("code") != "busy":
                    raise ApiError(str(reply[1].get("code")), str(reply[1].get("detail")))
                # Late or busy: this range and the rest in flight, one at a time (resent as ``call`` does).
                for _, c, d in [(rid, a, b), *pending]:
                    yield self.fetch(queue, group, c, d)
                pending.clear()
                early.clear()
                continue
            r = reply[1]
            if r["next"] < b:  # cut short: the rest of this page comes before the pages in flight
                pending.appendleft((self._send("FETCH", queue=queue, group=group, lo=r["next"], hi=b), r["next"], b))
            yield r["messages"], r["gone"]

    def _send(self, command: str, **args) -> bytes:
        """Send one request without waiting; its id."""
        self._counter += 1
        request_id = f"{self._pid}-{self._counter}".encode()
        self._socket().send_multipart(api.request(request_id, command, args))
        return request_id

    def _await(self, request_id: bytes, others: set[bytes], early: dict) -> tuple[bool, dict] | None:
        """(ok, results) of the reply to ``request_id``, keeping replies to ``others`` in ``early``;
        None if none came within ``attempt_s``."""
        deadline = time.monotonic() + self.attempt_s
        while (left := deadline - time.monotonic()) > 0:
            answer = receive(self._socket(), int(left * 1000) + 1)
            if answer is None:
                return None
            reply = api.parse_reply(answer)
            if reply is None:
                continue
            if reply[0] == request_id:
                return reply[1], reply[2]
            if reply[0] in others:
                early[reply[0]] = (reply[1], reply[2])
        return None

    def ack_upto(self, queue: str, group: str, upto: int) -> int:
        return self.call("ACK_UPTO", queue=queue, group=group, upto=upto)["base"]

    def info(self, queue: str) -> dict:
        return self.call("INFO", queue=queue)

    def snapshot(self, queue: str, after: int, before: int, limit: int = 1000) -> tuple[list[list], int]:
        r = self.call("SNAPSHOT", queue=queue, after=after, before=before, limit=limit)
        return r["messages"], r["next"]

    def produce(self, messages: list[tuple[str, bytes]], key: str | None = None) -> dict:
        """Store ``[(queue, body), ...]`` durably. ``key`` makes a repeat store nothing; without one a
        random key still makes this call's own resends safe. Messages that fit one PRODUCE (2,000 and
        2 MiB: pzq.protocols.api's MAX_PRODUCE, MAX_PRODUCE_BYTES; or one message alone, however big)
        go in one, all or none; more are cut into PRODUCEs by bytes, in order, each all or none and keyed
        ``key/0``, ``key/1``...: if one fails, those before it are stored, and a call again with the same
        key stores only the rest. Returns ``count`` (stored, or found stored) and ``duplicate`` (all were)."""
        key = key or uuid.uuid4().hex
        pieces = produce_pieces(messages)
        if len(pieces) == 1:
            return self.call("PRODUCE", messages=[list(m) for m in pieces[0]], key=key)
        results = [
            self.call("PRODUCE", messages=[list(m) for m in piece], key=f"{key}/{i}") for i, piece in enumerate(pieces)
        ]
        return {"count": sum(r["count"] for r in results), "duplicate": all(r["duplicate"] for r in results)}


def produce_pieces(
    messages: list[tuple[str, bytes]], most: int = api.MAX_PRODUCE, most_bytes: int = api.MAX_PRODUCE_BYTES
) -> list[list[tuple[str, bytes]]]:
    """``messages`` cut, in order, into PRODUCEs the server takes: at most ``most`` messages and
    ``most_bytes`` of arguments each (a message bigger than that goes alone: the server writes it in
    parts). The same messages always make the same pieces (their keys are the call's key and an index)."""
    pieces: list[list[tuple[str, bytes]]] = [[]]
    size = api.PRODUCE_FRAME
    for queue, body in messages:
        more = api.produce_bytes(queue, body)
        if pieces[-1] and (len(pieces[-1]) >= most or size + more > most_bytes):
            pieces.append([])
            size = api.PRODUCE_FRAME
        pieces[-1].append((queue, body))
        size += more
    return pieces
