"""pzq's own source files read and parsed once a worker, for the tests that read every one of them
(test_architecture and test_module_sizes: a parse of the package takes 0.7-2 s, and each of their tests
parsed it again). A file is read again when its size or time changed (tests write packages of their own
in tmp_path)."""

from __future__ import annotations

import ast
import collections
import functools
import os
from pathlib import Path


def text(file: Path) -> str:
    """The file's text (UTF-8)."""
    return _read(*_key(file))[0]


def parsed(file: Path) -> ast.Module:
    """The file's syntax tree (shared: callers only read it)."""
    return _read(*_key(file))[1]


def _key(file: Path) -> tuple[str, int, int]:
    stat = os.stat(file)
    return str(file), stat.st_mtime_ns, stat.st_size


@functools.cache
def _read(path: str, mtime_ns: int, size: int) -> tuple[str, ast.Module]:
    source = Path(path).read_text(encoding="utf-8")
    return source, ast.parse(source, path)


def statements(file: Path) -> list[ast.stmt]:
    """Every statement of the file, nested ones (in functions, classes, if/try/with/for/match bodies)
    included, breadth first as ``ast.walk`` goes; its expressions are not walked into (an import, a
    def or a class is a statement: a walk of every node took half the time of a check)."""
    return list(_statements(*_key(file)))


@functools.cache
def _statements(path: str, mtime_ns: int, size: int) -> tuple[ast.stmt, ...]:
    found: list[ast.stmt] = []
    todo = collections.deque([_read(path, mtime_ns, size)[1]])
    while todo:
        node = todo.popleft()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, ()) or ():
                if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                    if isinstance(child, ast.stmt):
                        found.append(child)
                    todo.append(child)
    return tuple(found)
