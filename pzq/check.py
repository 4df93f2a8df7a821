"""`pzq check` and `pzq dump`: read every record of a store, read-only (a running server may keep
serving), in a child process, so that a store damaged where LMDB itself cannot read it (SIGBUS on a
missing page, an assertion on a wrecked one) is reported in one line instead of killing the command."""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import signal
import subprocess
import sys
from typing import IO

import lmdb

from pzq.errors import StoreDamaged, StoreError
from pzq.store import DeadLetter, Store, side_tables

ADVICE = "run `pzq check` to see what is readable, then restore it from a backup or `pzq dump` what is readable"


def verify_pages(path: str) -> int:
    """Walk every B-tree page of the store at ``path`` in a child process before the server opens it;
    returns the records seen. Raises StoreDamaged (one line) if LMDB cannot walk it: a wrecked page
    makes LMDB abort the process, and a server that met it while serving would abort, restart, serve
    up to the same page and abort again. (A fresh interpreter, not a fork: py-lmdb refuses a second
    environment on a path its process already has open.)"""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from pzq.check import _verify_main; _verify_main(sys.argv[1])", path],
        capture_output=True,
        text=True,
        env=env,
    )
    data_file = os.path.join(path, "data.mdb")
    answer = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    if child.returncode < 0:
        raise StoreDamaged(
            f"{data_file} is damaged: LMDB died of {signal.Signals(-child.returncode).name} walking it; " + ADVICE
        )
    if child.returncode != 0 or not answer.isdigit():
        raise StoreDamaged(f"{data_file} is damaged: {answer or 'its reader failed'}; " + ADVICE)
    return int(answer)


def _verify_main(path: str) -> None:
    try:
        env = lmdb.open(path, readonly=True, lock=False, max_dbs=64, subdir=True)
        seen = 0
        with env.begin(buffers=True) as txn:
            names = [bytes(name) for name in txn.cursor().iternext(values=False)]
            for name in [None, *names]:
                db = env.open_db(name, txn=txn, create=False) if name is not None else None
                # Keys only: every branch and leaf page is read; values stay where they are.
                for _ in txn.cursor(db=db).iternext(values=False):
                    seen += 1
        env.close()
        print(seen)
    except Exception as exc:  # noqa: BLE001 - this child is the boundary: whatever the file does, one line
        print(f"{type(exc).__name__}: {exc}")


def check(path: str, out: IO[str]) -> bool:
    """Write a line per queue (messages, unreadable, dead letters) and per side table; True if every
    record was readable."""
    return _isolated(_walk, path, None, out)


def dump(path: str, target: str, out: IO[str]) -> bool:
    """Write every readable message, dead letter and set-aside record of the store to ``target`` as
    JSON lines (bytes as base64); True if the whole store was read."""
    return _isolated(_walk, path, target, out)


def _isolated(func, path: str, target: str | None, out: IO[str]) -> bool:
    if not os.path.isdir(path):
        raise StoreError(f"{path}: no store there")
    reader, writer = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child, args=(func, path, target, writer))
    child.start()
    writer.close()
    ok = True
    while True:
        try:
            kind, text = reader.recv()
        except EOFError:
            break
        if kind == "error":
            raise StoreError(text)
        if kind == "done":
            ok = text == "clean"
            continue
        out.write(text + "\n")
    child.join()
    if child.exitcode and child.exitcode > 0:
        raise StoreError(
            f"{path}: the reader failed (exit {child.exitcode}): the store is damaged in a way "
            "pzq cannot name; restore it from a backup"
        )
    if child.exitcode and child.exitcode < 0:
        raise StoreError(
            f"{path}: LMDB could not read part of the store (the reader died of "
            f"{signal.Signals(-child.exitcode).name}): restore it from a backup; `pzq dump` copies "
            "out what comes before the damage"
        )
    return ok


def _child(func, path: str, target: str | None, conn) -> None:
    try:
        func(path, target, lambda kind, text: conn.send((kind, text)))
    except StoreError as exc:
        conn.send(("error", str(exc)))
    except Exception as exc:  # noqa: BLE001 - this child is the boundary: whatever a damaged store does, one line
        conn.send(
            (
                "error",
                f"{path}: reading the store failed ({type(exc).__name__}: {exc}): it is damaged; "
                "restore it from a backup",
            )
        )
    finally:
        conn.close()


def _walk(path: str, target: str | None, say) -> None:
    store = Store(path, readonly=True)
    sink = open(target, "w", encoding="utf-8") if target else None
    clean = True
    try:
        for info in store.queues():
            counts = {"message": 0, "dead": 0, "unreadable": 0}
            for kind, record in store.audit(info.name):
                if record is None:
                    counts["unreadable"] += 1
                    continue
                counts[kind] += 1
                message = record.message if isinstance(record, DeadLetter) else record
                if sink:
                    _line(
                        sink,
                        {
                            "queue": info.name,
                            "id": message.id,
                            "enqueued_us": message.enqueued_us,
                            "expires_us": message.expires_us,
                            "deliveries": message.deliveries,
                            "frames": message.frames,
                            "meta": message.meta,
                            **({"dead": record.reason} if isinstance(record, DeadLetter) else {}),
                        },
                    )
            clean = clean and not counts["unreadable"] and counts["message"] == info.count
            say(
                "line",
                f"queue {info.name!r}: {counts['message']} messages (its counter says {info.count}), "
                f"{counts['dead']} dead letters, {counts['unreadable']} unreadable",
            )
        for table in side_tables(store):
            before = store.unreadable_records
            count = len(table.items())
            bad = store.unreadable_records - before
            clean = clean and not bad
            say("line", f"table {table.NAME}: {count} records, {bad} unreadable")
        damaged = store.damaged()
        if sink is not None:
            for key, value in damaged:
                _line(sink, {"damaged_key": key, "raw": value})
        say("line", f"table damaged: {len(damaged)} records set aside earlier")
        say("done", "clean" if clean else "damaged")
    finally:
        if sink:
            sink.close()
        store.close()


def _line(sink: IO[str], record: dict) -> None:
    sink.write(json.dumps(_plain(record), ensure_ascii=False) + "\n")


def _plain(value):
    """JSON-able: bytes as {"b64": ...}, containers walked."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
