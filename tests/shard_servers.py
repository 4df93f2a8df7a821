"""Three real `pzq serve` processes as the shards of a list, for the Spark tests across shards: each its
own store, ipc files and API port on loopback TCP; the list a TOML file beside them."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from pzq.clients.api import ApiClient
from pzq.shards import ShardList, load

from conftest import ProcessServer, steady_ports

NAMES = ("a", "b", "c")


def steady_endpoint() -> str:
    """A tcp:// endpoint on a loopback port free now, below the kernel's ephemeral range (as
    test_cluster_faults' shards): a shard restarts on its port (conftest.steady_ports)."""
    return f"tcp://127.0.0.1:{steady_ports(1, 12_000, 20_000)[0]}"


class ShardServer(ProcessServer):
    """One shard: a `pzq serve` subprocess; ``endpoint`` is its API's."""

    endpoint = ""


class Shards:
    """Three `pzq serve` processes, each with its own store, ipc files and API port; ``path`` is their list."""

    def __init__(self, root: Path):
        for attempt in range(3):  # (a free port taken before its server bound it: all again, on new ports)
            try:
                self._start(root)
                break
            except RuntimeError as exc:
                self.close()
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise
        self.list: ShardList = load(str(self.path))
        self.clients = {name: ApiClient(srv.endpoint, timeout_s=30) for name, srv in self.servers.items()}

    def _start(self, root: Path) -> None:
        """Each server ``pzq serve --shard NAME --cluster LIST`` on its own store (root/NAME/db)."""
        self.servers: dict[str, ShardServer] = {}
        self.clients = {}
        self.path = root / "shards.toml"
        lines = []
        for name in NAMES:
            (root / name).mkdir(exist_ok=True)
            endpoint = steady_endpoint()
            srv = ShardServer(root / name, "--api-dsn", endpoint, "--shard", name, "--cluster", str(self.path))
            srv.endpoint = endpoint
            self.servers[name] = srv
            lines.append(f'[[shard]]\nname = "{name}"\napi_dsn = "{endpoint}"\nmonitor_dsn = "{srv.monitor}"\n')
        self.path.write_text("\n".join(lines))
        for srv in self.servers.values():
            srv.start()

    def create(self, queue: str, partitions: int) -> None:
        """``pzq queue create QUEUE --partitions K --cluster LIST``: every shard keeps K and makes its partitions."""
        argv = [sys.executable, "-m", "pzq", "queue", "create", queue, "--partitions", str(partitions)]
        done = subprocess.run([*argv, "--cluster", str(self.path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

    def produce(self, queue: str, partitions: int, bodies: list[bytes]) -> dict[str, list[bytes]]:
        """Body i into partition i mod ``partitions``, on the shard the list places it; what went to each shard."""
        places = self.list.place(queue, partitions)
        sent: dict[str, list[tuple[str, bytes]]] = {}
        for i, body in enumerate(bodies):
            name, shard = places[i % len(places)]
            sent.setdefault(shard.name, []).append((name, body))
        for shard_name, messages in sent.items():
            for at in range(0, len(messages), 1000):
                self.clients[shard_name].produce(messages[at : at + 1000])
        return {shard: [body for _, body in messages] for shard, messages in sent.items()}

    def depth(self, queue: str, partitions: int) -> dict[str, int]:
        """partition queue -> its depth on its shard."""
        return {
            name: self.clients[shard.name].info(name)["depth"] for name, shard in self.list.place(queue, partitions)
        }

    def close(self) -> None:
        for api in getattr(self, "clients", {}).values():
            api.close()
        for srv in getattr(self, "servers", {}).values():
            try:
                srv.stop(signal.SIGKILL)
            except Exception:  # noqa: BLE001 - best effort reaping; the test result is what matters
                pass

    def snapshot(self, queue: str, partitions: int) -> list[bytes]:
        """Every body the partitions of ``queue`` store, read without consuming (SNAPSHOT on each shard)."""
        bodies: list[bytes] = []
        for name, shard in self.list.place(queue, partitions):
            api = self.clients[shard.name]
            info = api.info(name)
            after = info["first"]
            while info["depth"] and after < info["next"]:
                messages, after = api.snapshot(name, after, info["next"], 1000)
                bodies += [bytes(m[4]) for m in messages]
        return bodies
