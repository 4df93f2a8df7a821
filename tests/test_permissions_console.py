"""The web console under permissions: it is a monitor client whose CURVE key is named ``console``, so
its reads of bodies (a queue's first messages, its dead letters) and its changes (publish, purge,
requeue, delete) are what ``[keys.console]`` grants. A refused read is said on the queue's page in place
of its list (403, the JSON twin too, its figures still there); a refused change is the notice the
operator is sent back to, nothing changed; never a 500. A real server, a real console process, HTTP."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner
from console_run import SECRET, Browser, ConsoleProcess
from test_permissions_monitor import SEEDED, seed

from pzq.cli import cli
from pzq.clients import native as client

from permission_keys import TENANTS

pytestmark = pytest.mark.timeout(120)

CONSOLE_ON_ORDERS = (
    TENANTS
    + """
[keys.console]
produce = ["orders.*"]
consume = ["orders.*"]
manage = ["orders.*"]
"""
)


@pytest.fixture
def operator(make_server, tenants, tmp_path):
    """(server, console process, a logged-in browser): the console's key may do everything on
    ``orders.*`` and nothing on ``payroll``; both queues seeded."""
    assert CliRunner().invoke(cli, ["keygen", str(tenants.root / "console"), "console"]).exit_code == 0
    shutil.copy(tenants.root / "console" / "console.key", tenants.clients)
    tenants.write(CONSOLE_ON_ORDERS)
    seed(tmp_path / "db", ("orders.x", "payroll"))
    srv = make_server(queue="orders.x", **tenants.config())
    secret_file = tmp_path / "console.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    process = ConsoleProcess(
        tmp_path,
        srv.monitor,
        "--http-auth-file",
        str(secret_file),
        "--curve-client-key",
        str(tenants.root / "console" / "console.key_secret"),
        "--curve-server-key",
        str(tenants.root / "server" / "server.key"),
    )
    browser = Browser(process.url)
    assert browser.log_in()[0] == 200
    yield srv, process, browser
    assert process.stop() == 0, process.text()


def figures(srv, tenants, queue: str) -> tuple[int, int]:
    q = client.stats(srv.monitor, curve=tenants.curve("stranger"))["queues"][queue]
    return q["depth"], q["dead_letters"]


def change(browser: Browser, path: str, **fields: str) -> tuple[int, str]:
    status, page, _ = browser.open(path, {"csrf": browser.csrf("/queue?name=orders.x"), **fields})
    return status, page


def notice(page: str) -> str:
    found = re.search(r'<p class="notice" role="status">([^<]*)</p>', page)
    return found.group(1) if found else ""


def test_a_queue_the_consoles_key_may_not_consume_shows_its_figures_and_says_why_its_lists_are_not_shown(
    operator,
):
    srv, process, browser = operator
    status, page = browser.get("/queue?name=payroll")
    assert status == 403
    assert re.search(r'data-figure="depth"[^>]*>3<', page), "the figures are anyone's"
    for kind, command in (("messages", "PEEK"), ("dead", "DEAD")):
        said = re.search(rf'data-refused="{kind}">([^<]*)<', page)
        assert said and said.group(1).startswith(
            f"not permitted: console has no consume right on queue &#39;payroll&#39; ({command})"
        )
    assert "payroll dead" not in page and "payroll died" not in page, "no body is shown"
    status, body, _ = browser.open("/api/queue?name=payroll")
    data = json.loads(body)
    assert status == 403 and data["figures"]["depth"] == 3 and data["messages"] is None
    assert "no consume right" in data["not_permitted"]["dead"]
    status, page = browser.get("/queue?name=orders.x")
    assert status == 200 and "orders.x dead 0" in page and "orders.x died 0" in page


def test_a_change_the_consoles_key_may_not_make_is_refused_with_a_clear_notice_and_nothing_changes(operator, tenants):
    srv, process, browser = operator
    forms = [
        ("/queue/purge", {"confirm": "yes"}, "manage", "PURGE"),
        ("/queue/publish", {"body": "forged"}, "produce", "PUBLISH"),
        ("/queue/requeue", {"which": "all"}, "manage", "REQUEUE"),
        ("/queue/delete", {"which": "all", "confirm": "yes"}, "manage", "DELETEDEAD"),
    ]
    for path, fields, right, command in forms:
        status, page = change(browser, path, name="payroll", **fields)
        assert status == 403, path  # (the queue page it leads back to hides its lists too)
        assert notice(page).startswith(
            f"not permitted, nothing was changed: console has no {right} right on queue &#39;payroll&#39; ({command})"
        ), notice(page)
    assert figures(srv, tenants, "payroll") == (SEEDED, SEEDED)
    status, page = change(browser, "/queue/purge", name="orders.x", confirm="yes")
    assert status == 200 and notice(page) == f"purged {SEEDED} ready message(s)"
    status, page = change(browser, "/queue/requeue", name="orders.x", which="all")
    assert status == 200 and notice(page) == f"requeued {SEEDED} dead letter(s)"
    refusals = client.stats(srv.monitor, curve=tenants.curve("stranger"))["permissions"]["refused"]["console"]
    assert refusals["manage"] == 3 and refusals["produce"] == 1
