"""An asyncio link to pzq's monitor socket, for the web console's process: a few REQ sockets, each
with one request in flight, so that the console never has more than ``size`` requests waiting on pzq
whatever its browsers do. Requests are the monitor's texts (``STATS``, ``QUEUE name``...); a reply
of ``error: ...`` becomes a ``MonitorRefused`` carrying that text.

CURVE: the console authenticates with its own key pair (from a ``.key_secret`` file, or the line
``PUBLIC_Z85 SECRET_Z85`` that ``pzq serve`` hands its child on stdin) and trusts the server's public
key (a Z85 text of 40 characters, or a key file)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from typing import Any

import zmq
import zmq.asyncio
import zmq.utils.z85  # (a submodule: `import zmq` alone does not load it)

from pzq.clients.sockets import check_endpoint, check_ipc_owner
from pzq.errors import ClientError, ConfigError


class MonitorRefused(ClientError):
    """pzq answered ``error: ...`` (the text, without its newline, is the exception's message)."""


class MonitorSilent(ClientError):
    """pzq did not answer in time (or the link is closing)."""


@dataclasses.dataclass(frozen=True)
class CurveKeys:
    """This client's key pair and the server's public key, each as Z85 bytes."""

    public: bytes
    secret: bytes
    server: bytes


def server_key(text: str) -> bytes:
    """The server's public key: ``text`` itself when it is a Z85 key (40 characters), else the key file
    it names. ConfigError when neither."""
    if len(text) == 40 and not os.path.exists(text):
        try:
            zmq.utils.z85.decode(text)
        except (ValueError, KeyError):
            raise ConfigError("--curve-server-key: neither a Z85 key of 40 characters nor a key file") from None
        return text.encode()
    from pzq.curve_keys import load_public

    return load_public(text, "--curve-server-key")


def client_pair_from_line(line: str) -> tuple[bytes, bytes]:
    """(public, secret) from ``PUBLIC_Z85 SECRET_Z85`` (what `pzq serve` writes on its child's stdin)."""
    words = line.split()
    if len(words) != 2 or any(len(w) != 40 for w in words):
        raise ConfigError("--curve-key-stdin: expected one line 'PUBLIC_Z85 SECRET_Z85' on standard input")
    return words[0].encode(), words[1].encode()


def client_pair_from_file(path: str) -> tuple[bytes, bytes]:
    """(public, secret) of a ``.key_secret`` file."""
    from pzq.curve_keys import load_pair

    return load_pair(path, "--curve-client-key")


class MonitorLink:
    """At most ``size`` requests in flight to the monitor at ``endpoint``; ``request`` waits for a free
    socket at most ``timeout_s`` in all (socket and answer). A socket whose answer did not come is
    closed (a REQ socket cannot ask again before it hears back) and a fresh one takes its place."""

    def __init__(self, endpoint: str, *, size: int = 4, timeout_s: float = 5.0, curve: CurveKeys | None = None):
        check_ipc_owner(endpoint)
        check_endpoint(endpoint)  # (a bad one is said at start, in one line, not at every request)
        self.endpoint = endpoint
        self.size = size
        self.timeout_s = timeout_s
        self.curve = curve
        self.ctx = zmq.asyncio.Context()
        self._idle: list[zmq.asyncio.Socket] = []
        self._free = asyncio.Semaphore(size)
        self.sent = 0  # requests sent (tests count them)
        self.sent_by_command: dict[str, int] = {}

    def busy(self) -> bool:
        """True if every socket has a request in flight (the next request would wait)."""
        return self._free.locked()

    def _socket(self) -> zmq.asyncio.Socket:
        if self._idle:
            return self._idle.pop()
        sock = self.ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            sock.curve_publickey, sock.curve_secretkey = self.curve.public, self.curve.secret
            sock.curve_serverkey = self.curve.server
        sock.connect(self.endpoint)
        return sock

    async def request_text(self, text: str, body: bytes | None = None) -> str:
        """The reply text to one request (``body``: the second frame of PUBLISH). MonitorSilent if
        none came in time; MonitorRefused for ``error:`` replies."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            await asyncio.wait_for(self._free.acquire(), self.timeout_s)
        except TimeoutError:
            raise MonitorSilent(f"pzq at {self.endpoint}: every link is busy") from None
        sock = self._socket()
        try:
            command = text.split(" ", 1)[0]
            self.sent += 1
            self.sent_by_command[command] = self.sent_by_command.get(command, 0) + 1
            await sock.send_multipart([text.encode()] if body is None else [text.encode(), body])
            left_ms = max(1, round((deadline - loop.time()) * 1000))
            if not await sock.poll(left_ms):
                raise MonitorSilent(f"no answer from pzq at {self.endpoint} within {self.timeout_s:g} s")
            frames = await sock.recv_multipart()
        except BaseException:  # (no answer, or cancelled mid-request: a REQ socket in an unknown state)
            sock.close(linger=0)
            raise
        else:
            self._idle.append(sock)
        finally:
            self._free.release()
        reply = frames[-1].decode("utf-8", "replace")
        if reply.startswith("error:"):
            raise MonitorRefused(reply.strip())
        return reply

    async def request(self, text: str, body: bytes | None = None) -> Any:
        """The reply to one request, decoded from JSON. ClientError if it is not JSON."""
        reply = await self.request_text(text, body)
        try:
            return json.loads(reply)
        except ValueError:
            raise ClientError(f"the answer from {self.endpoint} is not pzq's ({reply[:60]!r})") from None

    def close(self) -> None:
        """Close every socket (in-flight requests end with an error)."""
        for sock in self._idle:
            sock.close(linger=0)
        self._idle.clear()
        self.ctx.destroy(linger=0)
