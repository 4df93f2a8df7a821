"""`pzq check` and `pzq dump`: read every record of a store, read-only (a running server may keep
serving), in a child process, so that a store damaged where LMDB itself cannot read it (SIGBUS on a
missing page, an assertion on a wrecked one) is reported in one line instead of killing the command."""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import signal
import stat
from typing import IO

from pzq.errors import DiskFull, StoreDamaged, StoreDenied, StoreError, StoreTooNew
from pzq.store import DeadLetter, Store, side_tables
from pzq.store.backup import hold_off_writers
from pzq.store.disk import disk_full, no_room

# Errors of the reader child kept by name across the pipe, since the class decides the exit status: a
# store too new or damaged exits 3, one this user may not read exits 2, as `pzq serve` does, and a full
# disk 6. (Any other StoreError is check's "cannot read": exit 1.)
_ERRORS: dict[str, type[StoreError]] = {e.__name__: e for e in (StoreTooNew, StoreDamaged, StoreDenied, DiskFull)}


def check(path: str, out: IO[str]) -> bool:
    """Write a line per queue (messages, unreadable, dead letters) and per side table; True if every
    record was readable."""
    return _isolated(_walk, path, None, out)


def dump(path: str, target: str, out: IO[str]) -> bool:
    """Write every readable message, dead letter and set-aside record of the store to ``target`` as
    JSON lines (bytes as base64); True if the whole store was read."""
    return _isolated(_walk, path, target, out)


def _isolated(func, path: str, target: str | None, out: IO[str]) -> bool:
    held = hold_off_writers(path)  # (a read-only view of a store a server writes is refused)
    try:
        return _read(func, path, target, out)
    finally:
        if held is not None:
            os.close(held)


def _read(func, path: str, target: str | None, out: IO[str]) -> bool:
    try:
        there = stat.S_ISDIR(os.stat(path).st_mode)
    except PermissionError as exc:  # (a directory on the way cannot be searched: not "no store")
        raise StoreDenied(f"{path}: {exc.strerror}: this user may not read the store") from None
    except OSError:
        there = False
    if not there:
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
            name, text = text
            raise _ERRORS.get(name, StoreError)(text)  # (the class decides the exit status: kept)
        if kind == "done":
            ok = text == "clean"
            continue
        out.write(text + "\n")
    child.join()
    if child.exitcode and child.exitcode > 0:
        raise StoreDamaged(
            f"{path}: the reader failed (exit {child.exitcode}): the store is damaged in a way "
            "pzq cannot name; restore it from a backup"
        )
    if child.exitcode == -signal.SIGBUS and _full(path, target):
        # (LMDB's pages are allocated before it maps them: this would be a mapping of something else;
        # on a full disk that is no sign of damage, so the store is not called damaged)
        raise disk_full(target or path, "the reader died of SIGBUS, which a full disk causes")
    if child.exitcode and child.exitcode < 0:
        raise StoreDamaged(
            f"{path}: LMDB could not read part of the store (the reader died of "
            f"{signal.Signals(-child.exitcode).name}): restore it from a backup; `pzq dump` copies "
            "out what comes before the damage"
        )
    return ok


def _full(*paths: str | None) -> bool:
    """Whether the filesystem of any of ``paths`` (or its directory) has no block left for this user."""
    for path in filter(None, paths):
        try:
            st = os.statvfs(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)))
        except OSError:
            continue
        if st.f_bavail * st.f_frsize < 64 << 10:
            return True
    return False


def _child(func, path: str, target: str | None, conn) -> None:
    try:
        func(path, target, lambda kind, text: conn.send((kind, text)))
    except StoreError as exc:
        conn.send(("error", (type(exc).__name__, str(exc))))
    except OSError as exc:  # (the store's own are StoreErrors by now: this is dump's output file)
        if no_room(exc):
            conn.send(("error", ("DiskFull", str(disk_full(target or path, "the dump could not be written whole")))))
        else:
            conn.send(("error", ("StoreError", f"{exc.filename or target}: {exc.strerror or exc}")))
    except Exception as exc:  # noqa: BLE001 - this child is the boundary: whatever a damaged store does, one line
        text = (
            f"{path}: reading the store failed ({type(exc).__name__}: {exc}): it is damaged; restore it from a backup"
        )
        conn.send(("error", ("StoreDamaged", text)))
    finally:
        conn.close()


def _walk(path: str, target: str | None, say) -> None:
    store = Store(path, readonly=True)
    sink = open(target, "w", encoding="utf-8") if target else None
    clean = True
    try:
        for info in store.queues():
            counts = {"message": 0, "dead": 0, "unreadable": 0}
            for kind, record in store.previews.audit(info.name):
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
        damaged = store.previews.damaged()
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
