"""The page walk: read every B-tree page of a store in a child interpreter before a server opens it, so
that a store damaged where LMDB itself cannot read it (SIGBUS on a missing page, an assertion on a
wrecked one) is refused in one line instead of killing the server mid-turn, again after each restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from pzq.errors import StoreDamaged

ADVICE = "run `pzq check` to see what is readable, then restore it from a backup or `pzq dump` what is readable"


def verify_pages(path: str) -> int:
    """Walk every B-tree page of the store at ``path`` in a child process; returns the records seen.
    Raises StoreDamaged (one line) if LMDB cannot walk it: a wrecked page makes LMDB abort the process,
    and a server that met it while serving would abort, restart, serve up to the same page and abort
    again. (A fresh interpreter, not a fork: py-lmdb refuses a second environment on a path its process
    already has open.)"""
    child = subprocess.run([sys.executable, "-c", _WALK, path], capture_output=True, text=True)
    data_file = os.path.join(path, "data.mdb")
    answer = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    if child.returncode < 0:
        raise StoreDamaged(
            f"{data_file} is damaged: LMDB died of {signal.Signals(-child.returncode).name} walking it; " + ADVICE
        )
    if child.returncode != 0 or not answer.isdigit():
        raise StoreDamaged(f"{data_file} is damaged: {answer or 'its reader failed'}; " + ADVICE)
    return int(answer)


# The child's whole program: lmdb alone, not pzq (importing pzq.store took the child 0.45 s to start
# where lmdb takes 0.1 s: paid at every start of a server on a store that has data).
_WALK = """
import sys

import lmdb

try:
    env = lmdb.open(sys.argv[1], readonly=True, lock=False, max_dbs=64, subdir=True)
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
except Exception as exc:  # this child is the boundary: whatever the file does, one line
    print(f"{type(exc).__name__}: {exc}")
"""
