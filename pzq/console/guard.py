"""What every request of the console passes before a page sees it, as a plain ASGI middleware: the
Host header must name this console (against DNS rebinding: 421 otherwise; IP literals always pass),
and every answer carries the security headers (a CSP that allows scripts, styles and fetches from the
console's own origin only, no framing, no sniffing, no referrer to other sites, and no caching of
pages and their JSON: they show a session's forms and tokens)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
STATIC_CACHE = b"public, max-age=300"  # (the vendored scripts and styles: nothing of a session's)


def host_names(host: str, configured: str) -> frozenset[str]:
    """The names a browser may call this console by (IP literals are always accepted)."""
    names = {host.lower(), "localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    names.update(name.strip().lower().rstrip(".") for name in configured.split(","))
    return frozenset(n for n in names if n)


def host_of(header: str) -> str | None:
    """The host name of a Host header (without its port or an IPv6 literal's brackets); None if empty."""
    header = header.strip().lower()
    if not header:
        return None
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.partition(":")[0].rstrip(".")


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class Guard:
    """The ASGI middleware around the console's app (``hosts``: the names it answers to)."""

    def __init__(self, app: Any, hosts: frozenset[str]):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = host_of(value.decode("latin-1"))
                break
        if host is not None and host not in self.hosts and not is_ip(host):
            await self._refuse(send, 421, b"unknown host name: this console answers to its own names only\n")
            return
        static = scope["path"].startswith("/static/")

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"cache-control" or static]
                headers.extend(HEADERS)
                headers.append((b"cache-control", STATIC_CACHE if static else b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    async def _refuse(send: Any, status: int, body: bytes) -> None:
        headers = [
            *HEADERS,
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
