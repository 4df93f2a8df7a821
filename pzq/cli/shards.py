"""`pzq shards run N`: N `pzq serve` shards on this machine for development, their list written with free
ports, stopped together (docs/operations.md, Shards; production runs one systemd pzq@NAME unit a shard)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import click

from pzq import shards
from pzq.cli.common import errors_to_exit, fail
from pzq.clients.admin import admin_request
from pzq.errors import ClientError, ConfigError, ExitCode

ROLES = ("receive_dsn", "send_dsn", "consume_dsn", "api_dsn")  # the list's tcp endpoints (monitor: ipc)
SEED = ("phpmq_dsn", "mqks_dsn", "emqp_frontend_dsn", "emqp_backend_dsn", "emqp_publish_dsn")
READY_S = 30  # how long the shards have to answer their monitor at start (a slow disk, a busy machine)
# the options the runner gives each child (one after -- would name every shard alike, or share a store)
RUNNER_SETS = {"--shard", "--cluster", "--database", *(f"--{role.replace('_', '-')}" for role in (*ROLES, *SEED))}
RUNNER_SETS |= {"--monitor-dsn", "--base-port"}
IPC_PATH_MAX = 100  # an ipc:// socket path's bytes at most (the kernel's sun_path is 108 with its NUL)


@click.group("shards")
def shards_group() -> None:
    """Run shards for development (production: one systemd pzq@NAME unit a shard, docs/operations.md)."""


@shards_group.command("run")
@click.argument("count", metavar="N", type=click.IntRange(1, 64))
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False),
    default="./pzq-shards",
    show_default=True,
    help="Where shards.toml, each shard's store (DIR/sI) and its log (DIR/sI.log) go.",
)
@click.option(
    "--seed-gateways/--no-seed-gateways",
    default=False,
    show_default=True,
    help="Give each shard PHPMQ, MQKS and eMQP endpoints too, on free ports (printed; not in the list).",
)
@click.argument("serve_options", nargs=-1, type=click.UNPROCESSED, metavar="[-- SERVE OPTIONS]")
@errors_to_exit
def shards_run(count: int, folder: str, seed_gateways: bool, serve_options: tuple[str, ...]) -> None:
    """Start N `pzq serve` shards (s0 .. sN-1) on this machine: writes DIR/shards.toml with free loopback
    ports (their monitors on ipc in their stores), starts one child a shard with --shard sI --cluster
    DIR/shards.toml, prints the list, and stops them all on SIGINT or SIGTERM. A shard that exits is
    said, not started again (production leaves that to systemd). Options after -- go to every child."""
    taken = sorted({option.split("=")[0] for option in serve_options} & RUNNER_SETS)
    if taken:
        raise ConfigError(
            f"{', '.join(taken)} after --: `pzq shards run` sets it for each shard itself (--seed-gateways gives "
            "each shard PHPMQ, MQKS and eMQP endpoints)"
        )
    base = Path(folder).absolute()
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--dir {folder}: {exc.strerror or exc}") from None
    serving = _serving(base)
    if serving:  # (a second run would write its list over the first's, and take the first's shards as its own)
        raise ConfigError(
            f"--dir {folder}: shards of an earlier run serve there still ({', '.join(serving)}): stop them "
            "(Ctrl-C or SIGTERM to that `pzq shards run`), or give another --dir"
        )
    ports = iter(_free_ports(count * (len(ROLES) + (len(SEED) if seed_gateways else 0))))
    plan = []
    for i in range(count):
        name = f"s{i}"
        monitor = f"ipc://{base / name / 'monitor'}"
        if len(monitor) - len("ipc://") > IPC_PATH_MAX:
            raise ConfigError(f"--dir {folder}: {monitor} is too long an ipc:// path: give a shorter --dir")
        endpoints = {role: f"tcp://127.0.0.1:{next(ports)}" for role in ROLES} | {"monitor_dsn": monitor}
        seeds = {role: f"tcp://127.0.0.1:{next(ports)}" if seed_gateways else "" for role in SEED}
        plan.append((shards.Shard(name, **endpoints), seeds))
    listed = shards.ShardList(tuple(shard for shard, _ in plan))
    cluster = base / "shards.toml"
    try:
        cluster.write_text(_toml(listed))
    except OSError as exc:
        raise ConfigError(f"--dir {folder}: cannot write {cluster}: {exc.strerror or exc}") from None
    Runner(base, cluster, plan, list(serve_options)).run()


def _serving(base: Path) -> list[str]:
    """The shards in ``base`` whose monitor (ipc, in its store's folder) takes a connection: a run's that
    serves still. (One refused or absent: a run stopped, or killed leaving its socket file.)"""
    found = []
    for path in sorted(base.glob("s*/monitor")):
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
            except OSError:
                continue
        found.append(path.parent.name)
    return found


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held together while they are found: none twice)."""
    held = []
    try:
        for _ in range(count):
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def _toml(listed: shards.ShardList) -> str:
    return "".join(
        "[[shard]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entry.items()) + "\n"
        for entry in listed.to_dict()
    )


PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_runner() -> None:
    """In each child before it runs pzq: a runner killed outright (SIGKILL, a crash) cannot stop its
    shards, which are in sessions of their own, so the kernel sends each SIGTERM when it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Runner:
    """The children of `pzq shards run`: started, watched (one that exits is said), stopped together."""

    def __init__(self, base: Path, cluster: Path, plan: list, extra: list[str]) -> None:
        self.base, self.cluster, self.plan, self.extra = base, cluster, plan, extra
        self.children: dict[str, subprocess.Popen] = {}
        self.stopping = threading.Event()
        self.gone: dict[str, int] = {}  # the shards that exited at start: said once, by _await_ready

    def argv(self, shard: shards.Shard, seeds: dict[str, str]) -> list[str]:
        options = {"shard": shard.name, "cluster": str(self.cluster), "database": str(self.base / shard.name)}
        if any(part == "--etcd" or part.startswith("--etcd=") for part in self.extra):
            del options["cluster"]  # (registered in etcd instead: the list is written for the operator only)
        options |= {role: getattr(shard, role) for role in (*ROLES, "monitor_dsn")} | seeds
        flags = [part for key, value in options.items() for part in (f"--{key.replace('_', '-')}", value)]
        return [sys.executable, "-m", "pzq", "serve", *flags, *self.extra]

    def run(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: self.stopping.set())
        try:
            for shard, seeds in self.plan:
                if self.stopping.is_set():  # (a signal while they start: the rest are not started)
                    break
                with open(self.log(shard.name), "ab") as log:  # (the child keeps its own copy)
                    self.children[shard.name] = subprocess.Popen(
                        self.argv(shard, seeds),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # (Ctrl-C reaches the runner, which stops them in order)
                        preexec_fn=_die_with_runner,
                    )
            self._await_ready()
            if self.children and len(self.gone) == len(self.children):
                fail("every shard exited at start: see their logs", ExitCode.FAILURE)
            if not self.stopping.is_set():  # (stopped while they started: no list to announce, nothing to watch)
                self._announce()
                self._watch()
        finally:
            self._stop()

    def _await_ready(self) -> None:
        """Until each shard's monitor answers, or it exits (said, and left), or 30 s have passed."""
        waiting = {shard.name: shard.monitor_dsn for shard, _ in self.plan if shard.name in self.children}
        deadline = time.monotonic() + READY_S
        while waiting and time.monotonic() < deadline and not self.stopping.is_set():
            for name, monitor in list(waiting.items()):
                status = self.children[name].poll()
                if status is not None:
                    del waiting[name]
                    self.gone[name] = status
                    click.echo(f"pzq: shard {name} exited at start, status {status}: see {self.log(name)}", err=True)
                    continue
                try:
                    admin_request(monitor, ["WHERE", "-"], timeout_s=0.5)
                    del waiting[name]
                except ClientError:
                    pass
            self.stopping.wait(0.1)
        if waiting and not self.stopping.is_set():
            click.echo(f"pzq: not answering after {READY_S} s: {', '.join(waiting)} (see their logs)", err=True)

    def log(self, name: str) -> Path:
        return self.base / f"{name}.log"

    def _announce(self) -> None:
        click.echo(f"{len(self.plan)} shards, their list in {self.cluster}:")
        for shard, seeds in self.plan:
            pid = self.children[shard.name].pid
            state = f"exited at start, status {self.gone[shard.name]}" if shard.name in self.gone else f"pid {pid}"
            click.echo(f"  {shard.name} ({state}, log {self.log(shard.name)})")
            for role, dsn in {**shard.endpoints(), **{k: v for k, v in seeds.items() if v}}.items():
                click.echo(f"    {role:<18} {dsn}")
        click.echo("Ctrl-C (or SIGTERM) stops them all.")

    def _watch(self) -> None:
        """Until a signal, or every child has exited: say each one that exits (not started again)."""
        running = {name: child for name, child in self.children.items() if name not in self.gone}
        while running and not self.stopping.wait(0.2):
            for name, child in list(running.items()):
                status = child.poll()
                if status is not None:
                    del running[name]
                    click.echo(f"pzq: shard {name} exited with status {status}: see {self.log(name)}", err=True)
        if not running:
            fail("every shard has exited", ExitCode.FAILURE)

    def _stop(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name, child in self.children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                click.echo(f"pzq: shard {name} did not stop within 20 s of SIGTERM: killed", err=True)
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if self.children and self.stopping.is_set():
            click.echo(f"stopped {len(self.children)} shards")
