"""`pzq console` as a real subprocess against a test server's monitor endpoint, and a person at a
browser speaking plain HTTP to it (urllib: keeps the session cookie, follows a form's redirect)."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

SECRET = "correct horse battery staple"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConsoleProcess:
    """``python -m pzq console`` for the server at ``monitor``; stopped (SIGTERM, status 0) by ``stop``."""

    def __init__(
        self, tmp_path: Path, monitor: str, *extra: str, port: int | None = None, wait: bool = True, stdin: str = ""
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"console-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pzq", "console", "--http-dsn", self.url, "--monitor-dsn", monitor, *extra]
            + ["--poll-interval", "0.5"],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "wb"),  # noqa: SIM115 - the child's, closed when it ends
            env={**os.environ, "PZQ_LOG_LEVEL": "info"},
        )
        if stdin and self.proc.stdin is not None:
            self.proc.stdin.write(stdin.encode())
            self.proc.stdin.close()
        if wait:
            self.wait_serving()

    def wait_serving(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pzq console exited {self.proc.returncode}: {self.text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pzq console did not serve within {timeout_s} s: {self.text()}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


class Browser:
    """A person at a browser: keeps the session cookie, follows the redirect after a form."""

    def __init__(self, url: str):
        self.url = url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def open(
        self, path: str, form: dict | None = None, headers: dict | None = None, method: str | None = None
    ) -> tuple[int, str, dict]:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers or {}, method=method)
        try:
            with self.opener.open(request, timeout=15) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), dict(exc.headers)

    def get(self, path: str) -> tuple[int, str]:
        status, body, _ = self.open(path)
        return status, body

    def log_in(self, secret: str = SECRET) -> tuple[int, str]:
        status, body, _ = self.open("/login", {"secret": secret})
        return status, body

    def csrf(self, path: str = "/") -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.get(path)[1])
        assert found, "a logged-in page carries the session's CSRF token"
        return found.group(1)
