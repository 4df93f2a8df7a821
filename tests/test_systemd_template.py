"""systemd/pzq@.service, the shards' template unit, tried without root or a running systemd: sandboxed as
pzq.service is, verified by systemd-analyze, and its own command line run as written for two instances
on one store (the second refused with exit 13, which the unit does not restart)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_install_systemd import _security_offline

from pzq.clients.admin import admin_request
from pzq.errors import ClientError, ExitCode

from conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "systemd"
TEMPLATE = UNITS / "pzq@.service"
_SANDBOX = re.compile(  # (as tests/test_install_systemd.py reads a unit's sandbox)
    r"(NoNewPrivileges|Protect\w+|Private\w+|Restrict\w+|LockPersonality|MemoryDeny\w+|SystemCall\w+|"
    r"CapabilityBoundingSet|AmbientCapabilities|UMask|RemoveIPC)$"
)

pytestmark = pytest.mark.timeout(120)


def settings(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def sandbox(unit: Path) -> dict[str, list[str]]:
    return {key: values for key, values in settings(unit).items() if _SANDBOX.match(key)}


def test_the_template_is_sandboxed_exactly_as_the_server_unit_and_differs_only_where_an_instance_must():
    server, template = settings(UNITS / "pzq.service"), settings(TEMPLATE)
    assert len(sandbox(TEMPLATE)) >= 20 and sandbox(TEMPLATE) == sandbox(UNITS / "pzq.service")
    differ = {key for key in server.keys() | template.keys() if server.get(key) != template.get(key)}
    assert differ == {"Description", "StateDirectory", "RuntimeDirectory", "Environment", "ExecStart"}
    assert template["StateDirectory"] == ["pzq/%i"] and template["Environment"] == ["PZQ_CONFIG=/etc/pzq/%i.toml"]
    assert "13" in template["RestartPreventExitStatus"][0].split()  # (another shard's store: no crash loop)


def test_the_template_passes_systemd_analyze_verify_as_an_instance(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    pzq = Path(sys.executable).with_name("pzq")
    unit = tmp_path / "pzq@a.service"  # (verify wants an instance of a template)
    unit.write_text(TEMPLATE.read_text().replace("/opt/pzq/.venv/bin/pzq", str(pzq)))
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pzq" not in done.stderr, done.stderr


@pytest.mark.skipif(not _security_offline(), reason="no systemd-analyze with --offline (systemd 250 or newer)")
def test_systemd_analyze_security_scores_the_template_at_most_2_5(tmp_path):
    unit = tmp_path / "pzq@a.service"
    unit.write_text(TEMPLATE.read_text())
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= 2.5, done.stdout


def exec_start(instance: str, tmp_path: Path) -> list[str]:
    """The template's ExecStart for ``instance``, its /etc and /var/lib paths moved into tmp_path."""
    line = settings(TEMPLATE)["ExecStart"][0].replace("%i", instance)
    line = line.replace("/opt/pzq/.venv/bin/pzq", str(Path(sys.executable).with_name("pzq")))
    line = line.replace("/etc/pzq/", f"{tmp_path}/etc/").replace("/var/lib/pzq/", f"{tmp_path}/lib/")
    return shlex.split(line)


def test_the_units_command_line_runs_shard_a_from_its_own_file_and_store_and_b_is_refused_on_it(tmp_path):
    (tmp_path / "etc").mkdir()
    listed = "".join(f'[[shard]]\nname = "{n}"\nmonitor_dsn = "ipc://{tmp_path}/{n}.sock"\n' for n in "ab")
    (tmp_path / "etc" / "shards.toml").write_text(listed)
    off = "".join(f'{key} = ""\n' for key in ("phpmq_dsn", "mqks_dsn", "emqp_frontend_dsn", "emqp_backend_dsn"))
    for name in ("a", "b"):
        (tmp_path / "etc" / f"{name}.toml").write_text(
            f'cluster = "{tmp_path}/etc/shards.toml"\nmonitor_dsn = "ipc://{tmp_path}/{name}.sock"\n'
            f'receive_dsn = "ipc://{tmp_path}/{name}-r"\nsend_dsn = "ipc://{tmp_path}/{name}-s"\n'
            f'api_dsn = ""\nemqp_publish_dsn = ""\ndisk_reserve = "0"\n{off}'
        )
    shard_a = subprocess.Popen(exec_start("a", tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        answered: list = []

        def up() -> bool:
            try:
                answered.append(admin_request(f"ipc://{tmp_path}/a.sock", ["WHERE", "q"], timeout_s=0.5))
            except ClientError:  # (not up yet)
                return False
            return True

        wait_until(up, 20)
        assert answered[-1]["shard"] == "a" and (tmp_path / "lib" / "a" / "data.mdb").exists()
    finally:
        shard_a.terminate()
        assert shard_a.wait(timeout=30) == 0
    # Instance b started by mistake on a's store (a copied unit file, a wrong --database): refused, exit 13.
    argv = exec_start("b", tmp_path)
    argv[argv.index("--database") + 1] = str(tmp_path / "lib" / "a")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.WRONG_SHARD, done.stderr
    assert "'a'" in done.stderr and "'b'" in done.stderr
