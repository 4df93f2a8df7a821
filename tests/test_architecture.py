"""The import arrows of pzq against the table in docs/architecture.md: every import of ours follows an
arrow the table allows, every module has a row, third-party packages stay where the table confines
them, and nothing imports itself back. Imports are read with ``ast``: module level, inside functions
and under ``TYPE_CHECKING`` alike."""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import sys
from pathlib import Path

import source_files

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "architecture.md"
ANY = "*"


@dataclasses.dataclass(frozen=True)
class Row:
    keys: tuple[str, ...]  # module paths under pzq/ ("store" for "store/*", "bench/spark")
    ours: frozenset[str]  # top-level modules or folders it may import; ANY for every one
    third: frozenset[str]  # third-party packages confined to the rows naming them


@dataclasses.dataclass(frozen=True)
class Import:
    importer: str  # "store/queues", "__init__" for the package itself
    target: str  # one of ours ("store/layout", "store" for the package) or a third-party top-level name
    ours: bool
    line: int


def read_table(text: str) -> list[Row]:
    """The rows of the allowed-arrows table: the lines of the first Markdown table whose header names
    "may import"."""
    rows, inside = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            if inside:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "may import" in line:
            inside = True
            continue
        if not inside or set(cells[0]) <= set("-: "):
            continue
        names = [re.findall(r"`([^`]+)`", cell) for cell in cells[:3]]
        keys = tuple(k.removesuffix("/*") for k in names[0])
        rows.append(Row(keys, frozenset(names[1]), frozenset(names[2])))
    return rows


def module_path(package: Path, file: Path) -> str:
    """ "store/queues" for pzq/store/queues.py, "store" for pzq/store/__init__.py, "__init__" for pzq's."""
    parts = list(file.relative_to(package).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return "/".join(parts)


@functools.cache  # (read once a run, not by each of four tests: 6-8 s each on a busy machine)
def read_imports(package: Path) -> list[Import]:
    """Every import of every module under ``package`` (a directory named pzq), in file order."""
    modules = {module_path(package, f): f for f in sorted(package.rglob("*.py"))}
    found = []
    for name, file in modules.items():
        is_package = file.name == "__init__.py"
        here = [] if name == "__init__" else name.split("/")
        for node in source_files.statements(file):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(_resolved(name, alias.name.split("."), [], modules, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, up level - 1 packages
                    base = here if is_package else here[:-1]
                    base = base[: len(base) - node.level + 1]
                    dotted = ["pzq", *base, *(node.module.split(".") if node.module else [])]
                else:
                    dotted = (node.module or "").split(".")
                for alias in node.names:
                    found.append(_resolved(name, dotted, [alias.name], modules, node.lineno))
    return found


def _resolved(importer: str, dotted: list[str], names: list[str], modules: dict, line: int) -> Import:
    if dotted[0] != "pzq":
        return Import(importer, dotted[0], False, line)
    path = "/".join(dotted[1:]) or "__init__"
    if names and f"{path}/{names[0]}".removeprefix("__init__/") in modules:  # from pzq.store import pages
        path = f"{path}/{names[0]}".removeprefix("__init__/")
    return Import(importer, path, True, line)


def row_of(module: str, rows: list[Row]) -> tuple[str, Row] | None:
    """The most specific row covering ``module``: its key and the row."""
    best = None
    for row in rows:
        for key in row.keys:
            if (module == key or module.startswith(key + "/")) and (best is None or len(key) > len(best[0])):
                best = (key, row)
    return best


def top(module: str) -> str:
    return module.split("/")[0]


def violations(package: Path, rows: list[Row]) -> tuple[list[str], list[str], list[str]]:
    """(arrows the table does not allow, modules no row covers, third-party imports out of place)."""
    confined = {name for row in rows for name in row.third}
    arrows, uncovered, third = set(), set(), set()
    for imp in read_imports(package):
        found = row_of(imp.importer, rows)
        if found is None:
            uncovered.add(f"pzq/{imp.importer}: no row of {TABLE.name} covers it")
            continue
        key, row = found
        if imp.ours:
            if ANY not in row.ours and top(imp.target) != top(imp.importer) and top(imp.target) not in row.ours:
                arrows.add(f"{imp.importer} -> {imp.target} (the row `{key}` does not allow `{top(imp.target)}`)")
        elif imp.target in confined and imp.target not in row.third:
            third.add(f"{imp.importer} imports {imp.target} (confined to the rows naming it; `{key}` does not)")
    for file in package.rglob("*.py"):  # modules that import nothing need a row too
        if row_of(module_path(package, file), rows) is None:
            uncovered.add(f"pzq/{module_path(package, file)}: no row of {TABLE.name} covers it")
    return sorted(arrows), sorted(uncovered), sorted(third)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one node (or a node importing itself), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graphs here are a few hundred nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges.get(node, ()):
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(edges):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def module_cycles(package: Path) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for imp in read_imports(package):
        if imp.ours:
            edges.setdefault(imp.importer, set()).add(imp.target)
    return cycles(edges)


ROWS = read_table(TABLE.read_text(encoding="utf-8"))
PACKAGE = ROOT / "pzq"


def test_every_module_of_pzq_is_covered_by_a_row_of_the_table():
    assert ROWS, f"no table of allowed arrows found in {TABLE}"
    _, uncovered, _ = violations(PACKAGE, ROWS)
    assert not uncovered, "modules without a row:\n" + "\n".join(uncovered)


def test_every_import_of_ours_follows_an_arrow_the_table_allows():
    arrows, _, _ = violations(PACKAGE, ROWS)
    assert not arrows, f"arrows {TABLE.name} does not allow:\n" + "\n".join(arrows)


def test_third_party_packages_stay_in_the_rows_that_name_them():
    _, _, third = violations(PACKAGE, ROWS)
    assert not third, "third-party imports out of place:\n" + "\n".join(third)


def test_no_module_of_pzq_imports_itself_back_through_others():
    found = module_cycles(PACKAGE)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_the_table_itself_draws_no_circles():
    edges: dict[str, set[str]] = {}
    for row in ROWS:
        for key in row.keys:
            edges.setdefault(top(key), set()).update(t for t in row.ours if t != ANY and t != top(key))
    assert not cycles(edges), f"{TABLE.name} allows circles: {cycles(edges)}"


def test_the_reader_sees_imports_in_functions_under_type_checking_and_relative_ones(tmp_path):
    package = tmp_path / "pzq"
    (package / "store").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "store" / "__init__.py").write_text("from .queues import Queues\n")
    (package / "store" / "queues.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pzq.check import walk\n"
    )
    (package / "check.py").write_text("def walk():\n    import lmdb\n    from pzq import store\n")
    found = {(i.importer, i.target, i.ours) for i in read_imports(package)}
    assert found >= {
        ("store", "store/queues", True),
        ("store/queues", "check", True),
        ("check", "lmdb", False),
        ("check", "store", True),
    }
    assert module_cycles(package) == [["check", "store", "store/queues"]]
    rows = read_table("| module | may import (ours) | third |\n|---|---|---|\n| `store/*` | `errors` | `lmdb` |\n")
    arrows, uncovered, third = violations(package, rows)
    assert arrows == ["store/queues -> check (the row `store` does not allow `check`)"]
    assert "pzq/check: no row of architecture.md covers it" in uncovered and third == []


def test_gateways_and_endpoints_import_nothing_of_the_broker_not_even_for_type_checking():
    # They see the broker only as gateways/contract.py's BrokerSurface (mypy checks the Broker fits it).
    found = [
        f"pzq/{imp.importer}.py:{imp.line} imports {imp.target}"
        for imp in read_imports(PACKAGE)
        if imp.ours and top(imp.importer) in ("gateways", "endpoints") and top(imp.target) == "broker"
    ]
    assert not found, "the broker reached past BrokerSurface:\n" + "\n".join(found)


def test_the_broker_rule_catches_an_import_under_type_checking(tmp_path):
    package = tmp_path / "pzq"
    (package / "gateways").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "gateways" / "x.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pzq.broker.accounts import Stale\n"
    )
    found = [(i.importer, i.target) for i in read_imports(package) if i.ours]
    assert found == [("gateways/x", "broker/accounts")]


def deepest_chains(folder: Path) -> dict[str, int]:
    """Each class defined in ``folder``'s modules and the longest run of ``class X(Y)`` links under it
    through classes of that folder (a base from elsewhere, ``SideTable[K, V]``'s ``Generic`` or a
    ``NamedTuple``, ends the chain: it is not one of the folder's floors)."""
    bases: dict[str, list[str]] = {}
    for file in sorted(folder.glob("*.py")):
        for node in source_files.statements(file):
            if isinstance(node, ast.ClassDef):
                names = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]
                bases[node.name] = [n.id for n in names if isinstance(n, ast.Name)]

    def depth(name: str, seen: frozenset[str] = frozenset()) -> int:
        ours = [b for b in bases.get(name, []) if b in bases and b not in seen]
        return max((1 + depth(b, seen | {name}) for b in ours), default=0)

    return {name: depth(name) for name in bases}


def test_no_class_of_the_store_derives_through_a_chain_deeper_than_two():
    deep = {name: links for name, links in deepest_chains(PACKAGE / "store").items() if links > 2}
    assert not deep, f"store classes stacked more than two floors deep (issue 41: parts held, not inherited): {deep}"


def test_the_chain_reader_counts_the_floors_of_a_stack(tmp_path):
    (tmp_path / "a.py").write_text("class Core:\n    pass\nclass Verbs(Core):\n    pass\n")
    (tmp_path / "b.py").write_text("class More(Verbs):\n    pass\nclass Top(More, Verbs):\n    pass\n")
    (tmp_path / "c.py").write_text("from typing import Generic\nclass Table(Generic[K]):\n    pass\n")
    assert deepest_chains(tmp_path) == {"Core": 0, "Verbs": 1, "More": 2, "Top": 3, "Table": 0}
