"""What the permission tests of every protocol share: CURVE keys for two tenants and a stranger, the
permissions file beside the clients directory (the ``tenants`` fixture of conftest.py), and a SIGHUP
waited for.

The tenants: ``orders`` may produce to, consume from and manage ``orders.*``; ``payroll`` the same on
``payroll``; ``stranger`` has an allowed key but no section, so ``[default]`` applies to it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner
from zmq.utils.monitor import recv_monitor_message

from pzq.cli import cli

TENANTS = """
[keys.orders]
produce = ["orders.*"]
consume = ["orders.*"]
manage = ["orders.*"]

[keys.payroll]
produce = ["payroll"]
consume = ["payroll"]
manage = ["payroll"]
"""

# The same, with the orders key narrowed to producing only (what a SIGHUP test changes to).
ORDERS_PRODUCE_ONLY = """
[keys.orders]
produce = ["orders.*"]

[keys.payroll]
produce = ["payroll"]
consume = ["payroll"]
manage = ["payroll"]
"""


def networks(payroll: str) -> str:
    """Rights per source network for the raw-TCP gateways' tests: 127.0.0.0/8 (orders) on ``orders.*``,
    127.0.0.2 (more specific: payroll) on ``payroll``; [default] grants the native queue, since the
    native sockets then serve clients without a key (pzq/server/access.py)."""
    return f"""
[default]
produce = ["default"]
consume = ["default"]

[networks."127.0.0.0/8"]
produce = ["orders.*"]
consume = ["orders.*"]
manage = ["orders.*"]

[networks."127.0.0.2/32"]
produce = ["{payroll}"]
consume = ["{payroll}"]
manage = ["{payroll}"]
"""


class Tenants:
    """Keys on disk (``keygen``), the clients directory and the permissions file beside it."""

    def __init__(self, root: Path):
        self.root = root
        runner = CliRunner()
        for name in ("server", "orders", "payroll", "stranger"):
            result = runner.invoke(cli, ["keygen", str(root / name), name])
            assert result.exit_code == 0, result.output
        self.clients = root / "clients"
        self.clients.mkdir()
        for name in ("orders", "payroll", "stranger"):
            shutil.copy(root / name / f"{name}.key", self.clients)
        self.permissions = root / "permissions.toml"  # beside the clients directory: found without a flag
        self.write(TENANTS)

    def write(self, text: str) -> None:
        """Replace the permissions file (a SIGHUP makes it count on a running server)."""
        self.permissions.write_text(text)

    def curve(self, name: str) -> tuple[str, str]:
        """``name``'s secret key file and the server's public key file, as pzq's clients take them."""
        return str(self.root / name / f"{name}.key_secret"), str(self.root / "server" / "server.key")

    def cli_curve(self, name: str) -> list[str]:
        """The `pzq` command's options for ``name``'s key."""
        secret, server = self.curve(name)
        return ["--curve-client-key", secret, "--curve-server-key", server]

    def config(self) -> dict[str, str]:
        """The server's CURVE settings (make_server's overrides); the permissions file is found beside."""
        return {
            "curve_secret_key": str(self.root / "server" / "server.key_secret"),
            "curve_clients": str(self.clients),
        }


def reload(srv, timeout_s: float = 5.0) -> None:
    """What SIGHUP does to a ThreadServer (``srv``), waited for until the loop has done it."""
    from conftest import wait_until  # (conftest imports this module for its fixture)

    before = srv.server.reloads
    srv.server.request_reload()
    wait_until(lambda: srv.server.reloads > before, timeout_s)


HANDSHAKE_ENDS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def handshake(sock: zmq.Socket, endpoint: str, timeout_ms: int = 5000) -> bool:
    """Connect ``sock`` (a client with its CURVE keys set) to ``endpoint``: True when the server let it
    in, False when it refused the handshake. A refusal is silence on the wire, so the socket's monitor
    tells how the handshake ended."""
    monitor = sock.get_monitor_socket(HANDSHAKE_ENDS)
    try:
        sock.connect(endpoint)
        if not monitor.poll(timeout_ms):
            pytest.fail(f"the handshake with {endpoint} did not end within {timeout_ms} ms")
        return recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sock.disable_monitor()
        monitor.close(0)
