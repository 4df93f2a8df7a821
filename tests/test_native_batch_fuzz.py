"""Mutated bodies frames (wide headers, ext and str types, nils, nested arrays, cut or padded bytes,
huge declared lengths): whatever ``split_bodies`` accepts must be stored by ``put_encoded`` so that every
reader (scan: delivery and FETCH; plain_run: the batched take; lease_headers: Spark; audit: check and
dump; preview: the console) reads back exactly what msgpack reads in the frame, and whatever it cannot
read that way must be refused whole."""

from __future__ import annotations

import random

import msgpack
import pytest

from pzq.errors import ProtocolError
from pzq.protocols.native_batch import Caps, encode_bodies, split_bodies

CAPS = Caps(max_messages=1000, max_bytes=1 << 20, max_message_size=1 << 16, max_frames=5000)
# msgpack type bytes a hostile producer would try: arrays, bins, ext, str, nil, the never-used 0xc1, ints
TRIED = [0x90, 0x91, 0x9F, 0xDC, 0xDD, 0xC4, 0xC5, 0xC6, 0xC7, 0xD4, 0xD9, 0xA1, 0xC0, 0xFF, 0x00, 0x7F, 0xC1]


def _mutated(rng: random.Random) -> bytes:
    sizes = [0, 1, 2, 5, 300]
    bodies = [
        [bytes(rng.randrange(256) for _ in range(rng.choice(sizes))) for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(1, 4))
    ]
    data = bytearray(encode_bodies(bodies))
    for _ in range(rng.randint(0, 3)):
        op, at = rng.randrange(4), rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(at, len(data) - 1)] = rng.choice(TRIED) if rng.random() < 0.7 else rng.randrange(256)
        elif op == 1:
            data[at:at] = bytes([rng.choice(TRIED)])
        elif op == 2 and data:
            del data[min(at, len(data) - 1)]
        else:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
    return bytes(data)


@pytest.mark.parametrize("seed", range(3))
def test_every_bodies_frame_accepted_reads_back_the_same_through_every_reader_and_the_rest_is_refused(store, seed):
    rng = random.Random(seed)
    expected: list[list[bytes]] = []
    refused = 0
    for _ in range(1500):
        data = _mutated(rng)
        try:
            messages = split_bodies(data, CAPS)
        except ProtocolError:
            refused += 1
            continue
        decoded = msgpack.unpackb(data)  # (what it accepted is one msgpack array of arrays of bin)
        assert [msgpack.unpackb(m) for m in messages] == decoded
        assert all(type(m) is list and m and all(type(f) is bytes for f in m) for m in decoded)
        assert store.put_encoded("q", messages, now_us=5) == len(messages)
        expected += decoded
    assert refused and expected  # (both kinds were tried)
    store.commit()
    assert [m.frames for m in store.scan("q", 0, 10**6)] == expected
    run, _, stopped = store.plain_run("q", 0, 10**6, 1 << 40, set())
    assert not stopped and run.frames == expected
    assert sum(entry[1] for entry in store.lease_headers("q", 0, 10**6)) == len(expected)
    assert [kind for kind, record in store.previews.audit("q") if record is not None] == ["message"] * len(expected)
    previews = store.previews.first("q", 10**6, 8)
    assert [p.body_size for p in previews] == [sum(map(len, m)) for m in expected]
