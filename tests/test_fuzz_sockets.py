"""A socket fuzzer against a running server: random and mutated traffic to every endpoint for a bounded
time; then the server must still be up, answer MONITOR, and hold every message stored before."""

from __future__ import annotations

import random
import socket
import time
import uuid

import msgpack
import pytest
import zmq

from pzq.clients import native as client
from pzq.clients.api import ApiClient
from pzq.protocols import emqp, phpmq

from conftest import start_every_gateway

pytestmark = pytest.mark.timeout(120)
FUZZ_SECONDS = 8.0

# Valid traffic per endpoint, for the fuzzer to mutate.
NATIVE = [[b"1", b"", b"hello"], [b"2", b"h", b"", b"a", b"b"]]
MONITOR = [[b"", b"MONITOR"], [b"", b"STATS"], [b"", b"DEADLETTERS default 5"]]
API = [
    [b"", b"1", b"INFO", msgpack.packb({"queue": "default"})],
    [b"", b"2", b"LEASE", msgpack.packb({"queue": "default", "group": "g", "after": 0, "max": 5})],
    [b"", b"3", b"PRODUCE", msgpack.packb({"messages": [["default", b"x"]]}, use_bin_type=True)],
]
EMQP = [
    [b"", *emqp.request("m1", "default", "", '["run", {"path": "x"}]')[1:]],
    [b"", b"eMQP/1.0", b"INFORM", b"m2", b"default", b"worker"],
    [b"", b"eMQP/1.0", b"READY", b"m3"],
]
PHPMQ = [phpmq.encode(1, [(1, b"default"), (2, b"body")]), phpmq.encode(2, [(1, b"default"), (3, b"5")])]
MQKS = [
    b"c1 consume --confirm q1 e1 --manual-ack\n",
    b"m1 publish e1 data\n",
    b"r1 rebind q1 --add e2\n",
    b"a1 ack c1 --all\n",
    b"p1 ping x\n",
    b"d1 delete_queue q1\n",
]


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.6 and data:
            del data[rng.randrange(len(data))]
        elif choice < 0.8:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        else:
            data += rng.randbytes(rng.randint(1, 64))
    return bytes(data)


def fuzz_frames(rng: random.Random, samples: list[list[bytes]]) -> list[bytes]:
    if rng.random() < 0.3:
        return [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 6))]
    frames = list(rng.choice(samples))
    i = rng.randrange(len(frames))
    frames[i] = mutate(rng, frames[i])
    if rng.random() < 0.2:
        frames.insert(rng.randrange(len(frames) + 1), rng.randbytes(rng.randint(0, 8)))
    return frames


def test_random_and_mutated_traffic_to_every_endpoint_harms_nothing(process_server, tmp_path):
    every = start_every_gateway(process_server, tmp_path, "--max-message-size", "65536")
    srv, phpmq_addr, mqks_addr, front, back, api_dsn = (
        every.server,
        every.phpmq,
        every.mqks,
        every.emqp_front,
        every.emqp_back,
        every.api,
    )
    keep = f"keep-{uuid.uuid4().hex}"  # no fuzzer can guess this queue's name
    kept = [b"kept %d " % i + bytes(range(256)) for i in range(200)]
    with ApiClient(api_dsn, timeout_s=20) as api:
        api.produce([(keep, body) for body in kept])

    rng = random.Random(1234)
    ctx = zmq.Context.instance()
    targets = {}
    for name, endpoint in (
        ("native", srv.receive),
        ("monitor", srv.monitor),
        ("api", api_dsn),
        ("emqp-front", front),
        ("emqp-back", back),
    ):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.connect(endpoint)
        targets[name] = sock
    samples = {"native": NATIVE, "monitor": MONITOR, "api": API, "emqp-front": EMQP, "emqp-back": EMQP}
    sent = dict.fromkeys([*targets, "phpmq", "mqks"], 0)
    raw: dict[str, list[socket.socket]] = {"phpmq": [], "mqks": []}
    try:
        deadline = time.monotonic() + FUZZ_SECONDS
        while time.monotonic() < deadline:
            for name, sock in targets.items():
                try:
                    sock.send_multipart(fuzz_frames(rng, samples[name]), zmq.NOBLOCK)
                    sent[name] += 1
                except zmq.Again:
                    pass
                while sock.poll(0):
                    sock.recv_multipart()
            for name, addr, sample in (("phpmq", phpmq_addr, PHPMQ), ("mqks", mqks_addr, MQKS)):
                conns = raw[name]
                if not conns or (len(conns) < 20 and rng.random() < 0.05):
                    conns.append(socket.create_connection(addr, timeout=5))  # (a SYN retransmits after 1 s)
                conn = rng.choice(conns)
                payload = mutate(rng, rng.choice(sample)) if rng.random() < 0.7 else rng.randbytes(rng.randint(1, 300))
                try:
                    conn.sendall(payload)
                    sent[name] += 1
                    conn.setblocking(False)
                    conn.recv(65536)
                except BlockingIOError:
                    pass
                except OSError:  # closed by the server for bad input: that is allowed
                    conns.remove(conn)
                    conn.close()
                    continue
                conn.settimeout(1)
                if rng.random() < 0.02:  # some clients vanish mid-stream
                    conns.remove(conn)
                    conn.close()
    finally:
        for conn in raw["phpmq"] + raw["mqks"]:
            conn.close()
        for sock in targets.values():
            sock.close(0)
    print(f"\nsocket fuzzer, {FUZZ_SECONDS:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sent.items()))
    assert all(count > 50 for count in sent.values()), sent

    # Let the server work through what it received (commits stop moving), then look at it.
    last, deadline = None, time.monotonic() + 20
    while time.monotonic() < deadline and (now := srv.stats()["syncs"]) != last:
        last = now
        time.sleep(0.5)
    assert srv.proc.poll() is None, "the server died"
    assert "messages:" in client.monitor_request(srv.monitor)
    assert "unexpected error" not in srv.log.read_text()  # no turn failed on a bug
    with ApiClient(api_dsn, timeout_s=20) as api:
        info = api.info(keep)
        rows, _ = api.snapshot(keep, info["first"], info["next"], limit=1000)
    assert [row[4] for row in rows] == kept
