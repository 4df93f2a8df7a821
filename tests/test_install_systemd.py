"""scripts/install-systemd and the units it installs, tried without root or a running systemd (issue 29,
item 4): the script with --root into a temp directory, the units' own command lines run as written."""

from __future__ import annotations

import getpass
import os
import pwd
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pzq.cli import cli
from pzq.store import Store

from conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-systemd"
UNITS = ROOT / "systemd"
ME = getpass.getuser()


def _install(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--user", ME, "--no-install", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _settings(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_install_into_a_root_writes_the_config_units_and_a_pzq_on_path(tmp_path):
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    config = tmp_path / "etc" / "pzq" / "pzq.toml"
    assert 'database = "/var/lib/pzq"' in config.read_text()
    assert 'monitor_dsn = "ipc:///run/pzq/monitor"' in config.read_text()
    assert _mode(config) == 0o640
    link = tmp_path / "usr" / "local" / "bin" / "pzq"
    assert link.is_symlink() and os.readlink(link) == "/opt/pzq/.venv/bin/pzq"
    for unit in ("pzq.service", "pzq-backup.service", "pzq-backup.timer"):
        installed = tmp_path / "etc" / "systemd" / "system" / unit
        assert _mode(installed) == 0o644
        if unit.endswith(".service"):
            assert _settings(installed)["User"] == [ME]
    assert "systemctl daemon-reload" in done.stdout  # (what to run on the target: nothing was started here)


def test_the_unit_passes_only_the_config_file_so_its_keys_are_never_overridden():
    settings = _settings(UNITS / "pzq.service")
    assert settings["ExecStart"] == ["/opt/pzq/.venv/bin/pzq serve --config /etc/pzq/pzq.toml"]
    assert settings["Environment"] == ["PZQ_CONFIG=/etc/pzq/pzq.toml"]  # (no PZQ_* setting beside it)


def test_secret_files_the_config_names_and_those_given_become_the_service_users_alone(tmp_path):
    etc = tmp_path / "etc" / "pzq"
    etc.mkdir(parents=True)
    (etc / "console.secret").write_text("a console secret of enough bytes\n")
    (etc / "server.key_secret").write_text("not really a key\n")
    for name in ("console.secret", "server.key_secret"):
        os.chmod(etc / name, 0o644)  # (as a newcomer leaves them)
    given = tmp_path / "given.key_secret"
    given.write_text("x")
    os.chmod(given, 0o640)
    # A config kept from before: its keys name the files as the target sees them (under /etc/pzq)
    (etc / "pzq.toml").write_text(
        'database = "/var/lib/pzq"\nmonitor_dsn = "ipc:///run/pzq/monitor"\n'
        'http_auth_file = "/etc/pzq/console.secret"\ncurve_secret_key = "/etc/pzq/server.key_secret"\n'
        'curve_clients = "/etc/pzq/clients"\n'
    )
    done = _install(tmp_path, "--secret", str(given))
    assert done.returncode == 0, done.stderr
    for secret in (etc / "console.secret", etc / "server.key_secret", given):
        assert _mode(secret) == 0o600, secret
        if os.geteuid() == 0:  # (only root may give a file away)
            assert pwd.getpwuid(secret.stat().st_uid).pw_name == ME
            assert secret.stat().st_gid == pwd.getpwnam(ME).pw_gid
        assert f"{secret}: owner {ME}, mode 0600" in done.stdout
    assert "note" not in done.stderr  # (the kept file already says what the unit used to pass)


def test_a_secret_not_there_yet_and_a_kept_config_that_moves_the_store_are_named(tmp_path):
    etc = tmp_path / "etc" / "pzq"
    etc.mkdir(parents=True)
    (etc / "pzq.toml").write_text('database = "./pzq-data"\nhttp_auth_file = "/etc/pzq/console.secret"\n')
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sets database = './pzq-data'" in done.stderr and "'/var/lib/pzq'" in done.stderr
    assert f"secret file {etc / 'console.secret'} is not there yet" in done.stderr
    assert f"chown {ME}:" in done.stderr and "chmod 0600" in done.stderr
    assert (etc / "pzq.toml").read_text().startswith('database = "./pzq-data"')  # (the operator's file kept)


def test_the_script_refuses_an_unknown_argument_and_a_service_user_that_does_not_exist(tmp_path):
    wrong = _install(tmp_path, "--databse", "x")
    assert wrong.returncode == 2 and "unknown argument --databse" in wrong.stderr
    nobody = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(tmp_path), "--user", "no-such-user-pzq", "--no-install"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert nobody.returncode == 1 and "no user no-such-user-pzq" in nobody.stderr
    helped = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0 and "--secret FILE" in helped.stdout and "--root DIR" in helped.stdout


def test_the_closing_hints_monitor_command_works_with_the_installed_config(tmp_path, make_server):
    srv = make_server()
    hint = next(line for line in SCRIPT.read_text().splitlines() if line.strip().startswith("pzq monitor"))
    argv = shlex.split(hint.split("#")[0])
    assert argv == ["pzq", "monitor", "--config", "/etc/pzq/pzq.toml"]
    assert _install(tmp_path).returncode == 0
    config = tmp_path / "etc" / "pzq" / "pzq.toml"
    config.write_text(config.read_text().replace('"ipc:///run/pzq/monitor"', f'"{srv.monitor}"'))
    shown = CliRunner().invoke(cli, [*argv[1:3], str(config)], prog_name="pzq")  # (the hint's own words)
    assert shown.exit_code == 0, shown.stderr
    assert "messages" in shown.stdout


def _unit_commands(unit: Path, key: str, backups: Path) -> list[list[str]]:
    """The unit's ``key=`` command lines as systemd runs them, pointed at this checkout and ``backups``."""
    commands = []
    for line in _settings(unit).get(key, []):
        line = line.replace("%%", "%").replace("/var/lib/pzq-backups", str(backups))
        argv = shlex.split(line)
        commands.append([a.replace("/opt/pzq/.venv/bin/pzq", f"{sys.executable} -m pzq") for a in argv])
    return commands


def test_the_backup_units_command_lines_take_a_dated_backup_and_keep_the_newest(tmp_path):
    store = Store(str(tmp_path / "db"), max_size=64 << 20)
    store.put_many("default", [[b"one"], [b"two"]], now_us=1)
    store.commit()
    store.close()
    (tmp_path / "pzq.toml").write_text(f'database = "{tmp_path / "db"}"\n')
    backups = tmp_path / "backups"
    backups.mkdir()
    for old in ("pzq-20200101T000000Z", "pzq-20200102T000000Z", "pzq-20200103T000000Z"):
        (backups / old).mkdir()
        (backups / old / "data.mdb").write_bytes(b"old")
    stale = backups / ".pzq-20200104T000000Z.partial-abc"  # a killed run's, two days old
    stale.mkdir()
    os.utime(stale, (0, 0))
    fresh = backups / ".pzq-29990101T000000Z.partial-def"  # a run going on now
    fresh.mkdir()
    env = {**os.environ, "PZQ_CONFIG": str(tmp_path / "pzq.toml"), "KEEP": "2"}
    unit = UNITS / "pzq-backup.service"
    for argv in _unit_commands(unit, "ExecStart", backups) + _unit_commands(unit, "ExecStartPost", backups):
        ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert ran.returncode == 0, ran.stderr
    left = sorted(os.listdir(backups))
    assert left[0] == fresh.name and left[1] == "pzq-20200103T000000Z" and len(left) == 3
    assert left[2].startswith("pzq-2") and left[2].endswith("Z")  # today's, by UTC time
    checked = CliRunner().invoke(cli, ["check", str(backups / left[2])], prog_name="pzq")
    assert checked.exit_code == 0 and "2 messages" in checked.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_every_unit_passes_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart's program exists: this interpreter's pzq instead of /opt/pzq's.
    pzq = Path(sys.executable).with_name("pzq")
    for unit in ("pzq.service", "pzq-backup.service", "pzq-backup.timer"):
        (tmp_path / unit).write_text((UNITS / unit).read_text().replace("/opt/pzq/.venv/bin/pzq", str(pzq)))
    result = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            *(str(tmp_path / u) for u in ("pzq.service", "pzq-backup.service", "pzq-backup.timer")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "pzq" not in result.stderr, result.stderr  # no warning about any of them


def test_the_backup_units_retention_removes_only_the_timers_own_backups_whatever_else_is_there(tmp_path):
    # An operator's own backups beside the timer's (docs/operations.md's example is named pzq-1, which
    # sorts before every dated name) and a name with a space are not the timer's to remove.
    store = Store(str(tmp_path / "db"), max_size=64 << 20)
    store.put_many("default", [[b"one"]], now_us=1)
    store.commit()
    store.close()
    (tmp_path / "pzq.toml").write_text(f'database = "{tmp_path / "db"}"\n')
    backups = tmp_path / "backups"
    backups.mkdir()
    mine = ("pzq-1", "pzq-before upgrade", "pzq-manual")
    for name in (*mine, "pzq-20200101T000000Z", "pzq-20200102T000000Z"):
        (backups / name).mkdir()
        (backups / name / "data.mdb").write_bytes(b"old")
    (backups / "pzq-before").mkdir()  # (what a split on the space would name)
    env = {**os.environ, "PZQ_CONFIG": str(tmp_path / "pzq.toml"), "KEEP": "2"}
    unit = UNITS / "pzq-backup.service"
    for argv in _unit_commands(unit, "ExecStart", backups) + _unit_commands(unit, "ExecStartPost", backups):
        ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert ran.returncode == 0, ran.stderr
    left = set(os.listdir(backups))
    assert {*mine, "pzq-before", "pzq-20200102T000000Z"} <= left and "pzq-20200101T000000Z" not in left
    assert len(left) == len(mine) + 3  # (and today's)


def test_a_killed_runs_partial_copy_is_removed_even_when_the_next_run_fails(tmp_path):
    # The partial copy of a run killed (systemctl stop, a reboot) is as big as a backup: left until a
    # later run's ExecStartPost, it can take the room that run needs, so that run fails before its
    # ExecStartPost, and every run after it too.
    backups = tmp_path / "backups"
    backups.mkdir()
    killed = backups / ".pzq-20200104T000000Z.partial-abc"
    killed.mkdir()
    (killed / "data.mdb").write_bytes(b"half")
    os.utime(killed, (time.time() - 7200, time.time() - 7200))  # two hours ago: the run before this one
    (tmp_path / "pzq.toml").write_text(f'database = "{tmp_path / "no store"}"\n')
    env = {**os.environ, "PZQ_CONFIG": str(tmp_path / "pzq.toml"), "KEEP": "2"}
    unit = UNITS / "pzq-backup.service"
    ran = None
    for argv in _unit_commands(unit, "ExecStartPre", backups) + _unit_commands(unit, "ExecStart", backups):
        ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
        if ran.returncode != 0:
            break  # (as systemd does: nothing after a failed command runs)
    assert ran is not None and ran.returncode != 0 and "no store there" in ran.stderr
    assert not killed.exists()


def test_the_backup_directory_is_there_for_a_first_backup_by_hand_and_a_hung_run_is_given_up(tmp_path):
    # docs/operations.md's first backup is `sudo -u pzq pzq backup ... /var/lib/pzq-backups/pzq-1`, before
    # the timer (whose StateDirectory= makes it) ever ran: as pzq, /var/lib/pzq-backups could not be made.
    done = _install(tmp_path)
    assert done.returncode == 0, done.stderr
    backups = tmp_path / "var" / "lib" / "pzq-backups"
    assert backups.is_dir() and _mode(backups) == 0o700
    assert backups.stat().st_uid == pwd.getpwnam(ME).pw_uid
    # A run that hangs (a stalled remote disk) holds its snapshot: the store would grow without end.
    limit = _settings(UNITS / "pzq-backup.service").get("TimeoutStartSec", ["infinity"])[0]
    assert limit not in ("infinity", "0")


def _installed_venv(root: Path) -> None:
    """What the install's venv is to the script: /opt/pzq/.venv/bin/python, here this interpreter (a
    link would lose the venv: Python finds it from the path it was started by)."""
    python = root / "opt" / "pzq" / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)


def _printed(done: subprocess.CompletedProcess, start: str) -> list[str]:
    """The printout's command line that starts with ``start``, its comment cut, as words."""
    line = next(line for line in done.stdout.splitlines() if line.strip().startswith(start))
    return shlex.split(line.split("#")[0])


def test_an_install_makes_the_servers_key_pair_turns_curve_on_and_its_printout_lets_a_client_in(
    tmp_path, process_server, monkeypatch
):
    # Issue 42: the README named a key file nothing made, and the install left CURVE off.
    root = tmp_path / "root"
    _installed_venv(root)  # (the install's venv makes the key: no `pzq` on PATH before it is installed)
    done = _install(root)
    assert done.returncode == 0, done.stderr
    etc = root / "etc" / "pzq"
    assert _mode(etc / "server.key_secret") == 0o600 and _mode(etc / "server.key") == 0o644
    assert pwd.getpwuid((etc / "server.key_secret").stat().st_uid).pw_name == ME
    assert (etc / "clients").is_dir() and not os.listdir(etc / "clients")
    installed = (etc / "pzq.toml").read_text()
    for line in (
        'curve_secret_key = "/etc/pzq/server.key_secret"',
        'curve_clients = "/etc/pzq/clients"',
        'phpmq_dsn = ""',  # (no key in PHPMQ's nor MQKS's protocol: pzq refuses them beside CURVE)
        'mqks_dsn = ""',
        'unauthenticated = "monitor"',  # (its socket in /run/pzq: root and the service user only)
    ):
        assert f"\n{line}\n" in installed, line
    assert "CURVE is on" in done.stdout
    # The installed config, as the target reads it, serves: here its /etc/pzq is under the temp root.
    config = tmp_path / "pzq.toml"
    config.write_text(installed.replace('"/etc/pzq/', f'"{etc}/'))
    srv = process_server("--config", str(config))  # (the test's own store and endpoints)
    client = tmp_path / "client"
    client.mkdir()
    monkeypatch.chdir(client)
    shutil.copy(etc / "server.key", client / "server.key")  # (the printout: a copy of the public key)
    keygen = _printed(done, "pzq keygen")
    assert keygen == ["pzq", "keygen", ".", "NAME"]
    made = CliRunner().invoke(cli, [*keygen[1:3], "alice"], prog_name="pzq")
    assert made.exit_code == 0, made.output
    produce = [a.replace("NAME", "alice") for a in _printed(done, "pzq produce")[1:]]
    produce[1:1] = ["--receive-dsn", srv.receive, "--timeout", "1s"]
    refused = CliRunner().invoke(cli, produce, prog_name="pzq")
    assert refused.exit_code != 0  # (a key not yet allowed)
    copy = _printed(done, "sudo cp")
    assert copy == ["sudo", "cp", "NAME.key", "/etc/pzq/clients/"]
    shutil.copy(client / "alice.key", etc / "clients")
    assert _printed(done, "sudo systemctl reload") == ["sudo", "systemctl", "reload", "pzq"]
    srv.proc.send_signal(signal.SIGHUP)  # (ExecReload's own signal)
    assert wait_until(lambda: "CURVE client keys re-read: 1 allowed" in srv.log.read_text(), timeout_s=10)
    allowed = CliRunner().invoke(cli, produce, prog_name="pzq")
    assert allowed.exit_code == 0, allowed.output
    assert srv.stats()["messages"] == 1


def test_an_install_over_an_existing_one_keeps_its_keys_and_no_curve_says_so_plainly(tmp_path):
    root = tmp_path / "root"
    _installed_venv(root)
    assert _install(root).returncode == 0
    etc = root / "etc" / "pzq"
    before = {name: (etc / name).read_bytes() for name in ("server.key", "server.key_secret")}
    (etc / "clients" / "alice.key").write_text("a client's key\n")
    again = _install(root)
    assert again.returncode == 0, again.stderr
    assert {name: (etc / name).read_bytes() for name in before} == before  # (clients trust that key)
    assert "kept (a key pair is never replaced)" in again.stdout
    assert (etc / "clients" / "alice.key").exists() and _mode(etc / "server.key_secret") == 0o600
    # Security terminated elsewhere: no keys, CURVE off in the config, and the printout says so.
    other = tmp_path / "other"
    _installed_venv(other)
    plain = _install(other, "--no-curve")
    assert plain.returncode == 0, plain.stderr
    assert not (other / "etc" / "pzq" / "server.key_secret").exists()
    assert '\ncurve_secret_key = ""\n' in (other / "etc" / "pzq" / "pzq.toml").read_text()
    assert "CURVE is OFF (--no-curve): every endpoint serves any client that reaches it" in plain.stdout


def test_a_kept_config_with_curve_off_is_told_how_to_turn_it_on(tmp_path):
    etc = tmp_path / "etc" / "pzq"
    etc.mkdir(parents=True)
    (etc / "pzq.toml").write_text('database = "/var/lib/pzq"\nmonitor_dsn = "ipc:///run/pzq/monitor"\n')
    done = _install(tmp_path)  # (and no venv to make a key with: said, with the command for the target)
    assert done.returncode == 0, done.stderr
    assert "has CURVE off: to turn it on, set curve_secret_key" in done.stderr
    assert "/opt/pzq/.venv/bin/pzq keygen /etc/pzq server" in done.stderr
    assert "CURVE is OFF" in done.stdout and "(--no-curve)" not in done.stdout
    assert (etc / "pzq.toml").read_text().startswith('database = "/var/lib/pzq"')  # (the operator's file kept)


# The directives that sandbox a unit (not where it may write: each unit names its own paths).
_SANDBOX = re.compile(
    r"(NoNewPrivileges|Protect\w+|Private\w+|Restrict\w+|LockPersonality|MemoryDeny\w+|SystemCall\w+|"
    r"CapabilityBoundingSet|AmbientCapabilities|UMask|RemoveIPC)$"
)


def _sandbox(unit: Path) -> dict[str, list[str]]:
    return {key: values for key, values in _settings(unit).items() if _SANDBOX.match(key)}


def test_the_backup_unit_is_sandboxed_as_the_server_is_and_reads_the_store_read_only():
    # Issue 42: `systemd-analyze security` scored pzq.service 1.9 and pzq-backup.service 7.0.
    server, backup = _sandbox(UNITS / "pzq.service"), _sandbox(UNITS / "pzq-backup.service")
    assert len(server) >= 20 and backup == server
    settings = _settings(UNITS / "pzq-backup.service")
    assert settings["ReadOnlyPaths"] == ["-/var/lib/pzq/data.mdb"]  # (the copy only reads it)
    assert settings["StateDirectory"] == ["pzq pzq-backups"]  # (writes: the backups, the store's reader slot)


def _security_offline() -> bool:
    if shutil.which("systemd-analyze") is None:
        return False
    helped = subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True, timeout=60, check=False)
    return "--offline" in helped.stdout


@pytest.mark.skipif(not _security_offline(), reason="no systemd-analyze with --offline (systemd 250 or newer)")
def test_systemd_analyze_security_scores_both_services_at_most_2_5():
    for unit in ("pzq.service", "pzq-backup.service"):
        done = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNITS / unit)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        found = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
        assert found, done.stdout + done.stderr
        print(f"systemd-analyze security: {unit} {found.group(1)}")  # (-s shows the figures)
        assert float(found.group(1)) <= 2.5, done.stdout


def test_an_install_without_python3_venv_says_so_before_it_changes_anything(tmp_path):
    # Debian's python3 has no ensurepip without python3-venv: `python3 -m venv` would fail midway.
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").write_text(
        f'#!/bin/sh\ncase "$*" in *ensurepip*) exit 1 ;; esac\nexec {shutil.which("python3")} "$@"\n'
    )
    (shim / "python3").chmod(0o755)
    root = tmp_path / "root"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--user", ME],  # (an install that builds the venv)
        env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "install python3-venv" in done.stderr, done.stderr
    assert not root.exists()


def test_a_kept_config_naming_its_secret_in_a_new_directory_gets_a_directory_the_service_can_enter(tmp_path):
    # (made by keygen under the install's umask 077, the directory was root's alone, 0700: the service
    # user could not reach its own secret key)
    root = tmp_path / "root"
    _installed_venv(root)
    etc = root / "etc" / "pzq"
    etc.mkdir(parents=True)
    (etc / "pzq.toml").write_text(
        'curve_secret_key = "/etc/pzq/keys/server.key_secret"\ncurve_clients = "/etc/pzq/clients"\n'
    )
    done = _install(root)
    assert done.returncode == 0, done.stderr
    assert _mode(etc / "keys") == 0o750
    assert _mode(etc / "keys" / "server.key_secret") == 0o600
