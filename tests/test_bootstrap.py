"""scripts/bootstrap and scripts/serve: a current .venv starts without pip (offline, at once); changed
metadata or a fresh machine installs. A stand-in python records every call, so nothing is downloaded and
the evidence is the calls made, not a time."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Stands in for both the system python and .venv/bin/python: it logs its arguments, makes a .venv on
# "-m venv", puts a stand-in pzq there on "pip install -e", and fails pip when FAIL_PIP exists.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >>"$CALLS"
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
elif [ "$1 $2" = "-m pip" ]; then
  [ -e "$FAIL_PIP" ] && { echo "pip: no network"; exit 1; }
  case "$*" in *"install -e"*)
    printf '#!/bin/sh\\necho "pzq $*"\\n' >.venv/bin/pzq && chmod +x .venv/bin/pzq;;
  esac
  echo "a setuptools banner"
fi
exit 0
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of the repository's scripts and metadata, with a stand-in python on PYTHON."""
    (tmp_path / "scripts").mkdir()
    for name in ("scripts/bootstrap", "scripts/serve", "setup.cfg", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def serve(checkout: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run scripts/serve ARGS; the result and the python calls it made."""
    calls = checkout / "calls"
    calls.write_text("")
    env = {**os.environ, "PYTHON": str(checkout / "python3"), "CALLS": str(calls), "FAIL_PIP": str(checkout / "nonet")}
    done = subprocess.run([str(checkout / "scripts/serve"), *args], env=env, capture_output=True, text=True, timeout=60)
    return done, calls.read_text().splitlines()


def test_a_fresh_machine_gets_a_venv_and_an_install_then_serve_runs(checkout):
    done, calls = serve(checkout, "--log-level", "debug")
    assert done.returncode == 0, done.stderr
    assert calls[0] == "-m venv .venv"
    assert any("install -e ." in c for c in calls)
    assert done.stdout.strip() == "pzq serve --log-level debug"
    assert "banner" not in done.stdout + done.stderr  # pip's chatter is kept out of sight


def test_a_second_start_with_the_same_metadata_does_not_call_pip(checkout):
    serve(checkout)
    done, calls = serve(checkout, "--queue", "q")
    assert done.returncode == 0, done.stderr
    assert calls == []  # no venv, no pip: works offline
    assert done.stdout.strip() == "pzq serve --queue q"
    assert done.stderr == ""


def test_changed_metadata_reinstalls_once(checkout):
    serve(checkout)
    with open(checkout / "setup.cfg", "a") as f:
        f.write("\n# a new dependency\n")
    done, calls = serve(checkout)
    assert done.returncode == 0, done.stderr
    assert [c for c in calls if "pip" in c] == ["-m pip --quiet --disable-pip-version-check install -e ."]
    assert "changed since the last install" in done.stderr
    assert serve(checkout)[1] == []


def test_a_failed_install_shows_pips_output_and_is_tried_again(checkout):
    serve(checkout)
    (checkout / "pyproject.toml").write_text((checkout / "pyproject.toml").read_text() + "\n")
    (checkout / "nonet").write_text("")
    done, _ = serve(checkout)
    assert done.returncode == 1
    assert "pip: no network" in done.stderr and "failed" in done.stderr
    assert done.stdout == ""  # the server is not started on a stale install
    (checkout / "nonet").unlink()
    done, calls = serve(checkout)
    assert done.returncode == 0 and any("install -e ." in c for c in calls)


def test_the_test_install_does_for_the_service_too(checkout):
    env = {**os.environ, "PYTHON": str(checkout / "python3"), "CALLS": str(checkout / "calls")}
    env["FAIL_PIP"] = str(checkout / "nonet")
    subprocess.run([str(checkout / "scripts/bootstrap"), "test"], env=env, check=True, capture_output=True, timeout=60)
    assert serve(checkout)[1] == []
