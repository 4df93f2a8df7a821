"""A stand-in for `pzq console` (tests/test_console_process.py), with the same command line and the same
duties towards its supervisor: it binds --http-dsn (one line on stderr and exit 2 if it cannot), reads
its CURVE pair from the first line of stdin (--curve-key-stdin), answers every page with pzq's STATS
asked on its behalf, logs a SIGHUP, exits 0 on SIGTERM and when its stdin reaches EOF (the server is gone).

    python tests/console_stand_in.py console --http-dsn http://127.0.0.1:PORT --monitor-dsn ENDPOINT ...
    python tests/console_stand_in.py serve ARGS...   # `pzq serve ARGS`, with this script as its console
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import zmq


def console(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="console-stand-in")
    for option in ("--http-dsn", "--monitor-dsn", "--http-auth-file", "--http-host-names", "--curve-server-key"):
        parser.add_argument(option)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--curve-key-stdin", action="store_true")
    args = parser.parse_args(argv)
    keys = sys.stdin.buffer.readline().split() if args.curve_key_stdin else None
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    hangup = "pzq console (stand-in): SIGHUP"
    signal.signal(signal.SIGHUP, lambda signum, frame: print(hangup, file=sys.stderr, flush=True))
    host, _, port = args.http_dsn.removeprefix("http://").rstrip("/").rpartition(":")

    def stats() -> bytes | None:
        sock = zmq.Context.instance().socket(zmq.REQ)
        sock.linger = 0
        if keys:
            sock.curve_publickey, sock.curve_secretkey = keys
            sock.curve_serverkey = args.curve_server_key.encode()
        try:
            sock.connect(args.monitor_dsn)
            sock.send(b"STATS")
            return sock.recv() if sock.poll(3000) else None
        finally:
            sock.close(0)

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            body = stats()
            self.send_response(200 if body is not None else 503)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args) -> None:
            pass

    try:
        server = ThreadingHTTPServer((host, int(port)), Page)
    except OSError as exc:
        print(f"pzq console: cannot listen on {args.http_dsn}: {exc}", file=sys.stderr, flush=True)
        return 2
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"pzq console (stand-in) at {args.http_dsn}", file=sys.stderr, flush=True)
    while sys.stdin.buffer.read(4096):  # (the supervisor writes nothing more: EOF is the server gone)
        pass
    return 0


def serve(argv: list[str]) -> None:
    """`pzq serve` whose console child is this script."""
    import pzq.server.console_child as child

    child.console_command = lambda: [sys.executable, os.path.abspath(__file__), "console"]
    from pzq.cli import cli

    cli(["serve", *argv], prog_name="pzq")


if __name__ == "__main__":
    if sys.argv[1] == "console":
        sys.exit(console(sys.argv[2:]))
    serve(sys.argv[2:])
