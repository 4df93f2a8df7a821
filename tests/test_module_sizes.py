"""Modules at seams (issue 41): no module of pzq/ over MAX_LINES lines and no function over MAX_FUNCTION
lines (its decorators, signature, docstring and body, as ``ast`` spans it), and no module importing
another's private names (a split whose halves do is not a seam). Read from the files alone: no import,
no socket."""

from __future__ import annotations

import ast
from pathlib import Path

import source_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pzq"
MAX_LINES = 400
MAX_FUNCTION = 80

# Being cut at their seams on another branch of issue 41 at the same time as this test was written (the
# store, the broker, the gateways, config.py and the CLI): the lead empties this set as those branches are
# merged, and then nothing of pzq/ may pass the limits. A path here is skipped whether or not it passes.
NOT_YET: frozenset[str] = frozenset()


def _waived(relative: str) -> bool:
    return any(relative == path or relative.startswith(path + "/") for path in NOT_YET)


def oversized(package: Path) -> list[str]:
    """Each module of ``package`` past MAX_LINES lines and each function past MAX_FUNCTION, as
    "path: N lines" and "path:line name(): N lines", paths relative to the package's parent."""
    found = []
    for file in sorted(package.rglob("*.py")):
        relative = file.relative_to(package.parent).as_posix()
        if _waived(relative):
            continue
        if (lines := len(source_files.text(file).splitlines())) > MAX_LINES:
            found.append(f"{relative}: {lines} lines")
        for node in source_files.statements(file):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (length := (node.end_lineno or node.lineno) - first + 1) > MAX_FUNCTION:
                    found.append(f"{relative}:{node.lineno} {node.name}(): {length} lines")
    return found


def test_no_module_of_pzq_is_over_400_lines_nor_any_of_its_functions_over_80():
    found = oversized(PACKAGE)
    assert not found, "cut these at a seam (issue 41):\n" + "\n".join(found)


def test_the_guard_names_a_long_module_and_a_long_nested_function(tmp_path):
    package = tmp_path / "pzq"
    (package / "gateways").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    (package / "long.py").write_text(f"class A:\n    def f(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    (package / "short.py").write_text(
        "def g():\n" + "\n".join(f"    y{i} = {i}" for i in range(MAX_FUNCTION - 1)) + "\n"
    )
    (package / "wide.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(package) == ["pzq/long.py:2 f(): 81 lines", "pzq/wide.py: 401 lines"]


def private_imports(package: Path) -> list[str]:
    """Each ``from <one of ours> import _name`` under ``package``: a split whose halves import each other's
    private names is not a seam (issue 41)."""
    found = []
    for file in sorted(package.rglob("*.py")):
        relative = file.relative_to(package.parent).as_posix()
        for node in source_files.statements(file):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == package.name):
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                found += [f"{relative}:{node.lineno} imports {name} from {node.module}" for name in names]
    return found


def test_no_module_of_pzq_imports_another_ones_private_names():
    found = private_imports(PACKAGE)
    assert not found, "make the name public, or keep it where it is used:\n" + "\n".join(found)


def test_the_private_import_guard_names_the_importer_and_the_name(tmp_path):
    package = tmp_path / "pzq"
    package.mkdir()
    (package / "a.py").write_text("_x = 1\n__all__ = []\n")
    (package / "b.py").write_text("from pzq.a import _x, __all__\nfrom os import _exit\n")
    assert private_imports(package) == ["pzq/b.py:1 imports _x from pzq.a"]


def test_every_path_waived_for_now_still_exists():
    # (a path renamed away would waive nothing, silently: the set must name what is really there)
    assert all((ROOT / path).exists() for path in NOT_YET), sorted(p for p in NOT_YET if not (ROOT / p).exists())
