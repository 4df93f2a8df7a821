"""The registry over TLS: a real etcd serving https with client-certificate auth (certificates made by
openssl for the test), reached with the CA and this server's certificate (--etcd-ca, --etcd-cert,
--etcd-key), and refused, named, without them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from etcd_cluster import ETCD, needs_etcd, wait_for

from pzq.etcd_registry import EtcdRegistry
from pzq.shards import Shard

from conftest import steady_ports

pytestmark = [needs_etcd, pytest.mark.timeout(120)]
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def certificates(folder: Path) -> None:
    """ca.crt; server.crt for 127.0.0.1 and client.crt, both signed by it (their .key beside)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=pzq-test-ca", cwd=folder)  # fmt: skip
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=folder)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "2", "-extfile", "san.cnf", cwd=folder)  # fmt: skip


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    folder = tmp_path_factory.mktemp("etcd-tls")
    certificates(folder)
    client, peer = steady_ports(2, 20_000, 30_000)
    url = f"https://127.0.0.1:{client}"
    argv = [
        ETCD or "etcd", "--name", "t0", "--data-dir", str(folder / "data"),
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"t0=http://127.0.0.1:{peer}",
        "--cert-file", str(folder / "server.crt"), "--key-file", str(folder / "server.key"),
        "--trusted-ca-file", str(folder / "ca.crt"), "--client-cert-auth", "--log-level", "warn",
    ]  # fmt: skip
    with open(folder / "etcd.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log)
    yield url, folder
    proc.kill()
    proc.wait(10)


def registry(url: str, folder: Path, tmp_path: Path, tls: tuple[str, str, str]) -> EtcdRegistry:
    return EtcdRegistry(url, "/tls/", Shard("a", api_dsn="tcp://127.0.0.1:1"), "id-a", str(tmp_path / "c"), 100, tls)


@needs_openssl
def test_with_the_ca_and_a_client_certificate_the_shard_registers_over_tls(tls_etcd, tmp_path):
    url, folder = tls_etcd
    tls = (str(folder / "ca.crt"), str(folder / "client.crt"), str(folder / "client.key"))
    made = registry(url, folder, tmp_path, tls)
    made.start()
    try:
        wait_for(lambda: made.view.alive == frozenset({"a"}) and made.view.reachable, timeout=30)
        made.place("q", 0)
        wait_for(lambda: "q" in made.placements)
    finally:
        made.stop()


@needs_openssl
@pytest.mark.parametrize("given", ["no client certificate", "no CA"])
def test_without_its_certificate_or_the_ca_etcd_is_unreachable_and_the_error_says_tls(tls_etcd, tmp_path, given):
    url, folder = tls_etcd
    ca, cert, key = str(folder / "ca.crt"), str(folder / "client.crt"), str(folder / "client.key")
    tls = (ca, "", "") if given == "no client certificate" else ("", cert, key)
    made = registry(url, folder, tmp_path, tls)
    made.start()
    try:
        wait_for(lambda: made.stats()["call_failures_total"] >= 2, timeout=30)
        assert not made.view.reachable and made.view.alive == frozenset()
        assert "SSL" in made.view.error or "certificate" in made.view.error, made.view.error
    finally:
        made.stop()
