"""Names a hostile client gives (queue names it produces to) shown by the operator's commands against a real
server: never as raw escape sequences that would retitle or clear the operator's terminal, or reorder a line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pzq.cli import cli
from pzq.clients.api import ApiClient

pytestmark = pytest.mark.timeout(120)

NO_SETTINGS = {"PZQ_CONFIG": None, "PZQ_MONITOR_DSN": None, "PZQ_DATABASE": None}
HOSTILE = "\x1b]0;owned\x07\x1b[2J\u202eevil"  # (retitle the terminal, clear it, then a right-to-left override)


def test_queue_names_a_client_made_with_escape_sequences_are_shown_escaped_by_list_and_monitor(make_server, tmp_path):
    srv = make_server(api_dsn=f"ipc://{tmp_path}/api")
    with ApiClient(srv.config.api_dsn, timeout_s=10) as api:
        api.produce([(HOSTILE, b"m")])  # (any producer names its queue: the API's, PHPMQ's, MQKS's)
    assert HOSTILE in srv.stats()["queues"]
    for command in (["queue", "list"], ["monitor"]):
        result = CliRunner().invoke(cli, [*command, "--monitor-dsn", srv.monitor], env=NO_SETTINGS)
        assert result.exit_code == 0, result.output
        assert not any(c in result.output for c in "\x1b\x07\u202e"), (command, result.output)
        assert "\\x1b]0;owned\\x07\\x1b[2J\\u202eevil" in result.output, (command, result.output)
