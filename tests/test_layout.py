"""docs/layout.md is generated from the module docstrings by scripts/layout.py: it must match the code."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layout_script():
    spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layout = _layout_script()
layout.describe = functools.cache(layout.describe)  # (every module parsed once for both tests, not twice)


def test_every_module_of_pzq_has_a_docstring():
    missing = layout.undocumented(ROOT)
    assert not missing, f"modules without a docstring (docs/layout.md quotes its first sentence): {missing}"


def test_docs_layout_md_is_what_scripts_layout_py_writes_now():
    current = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert current == layout.render(ROOT), (
        "docs/layout.md is out of date with the modules of pzq/: run `.venv/bin/python scripts/layout.py`"
    )


def test_the_first_sentence_stops_at_the_first_full_stop_but_not_at_an_abbreviation():
    text = "Keys, e.g. ``a|b``, in order.\nMore of it. And more.\n\nA second paragraph."
    assert layout.first_sentence(text) == "Keys, e.g. `a\\|b`, in order."


def test_a_module_the_order_does_not_name_comes_after_the_known_ones(tmp_path):
    package = tmp_path / "pzq"
    (package / "store").mkdir(parents=True)
    for name in ("cli.py", "zzz_new.py", "aaa_new.py", "store/__init__.py", "store/b.py", "store/a.py"):
        (package / name).write_text('"""Doc."""\n')
    names = [p.relative_to(package).as_posix() for p in layout.modules(package)]
    assert names == ["cli.py", "store/__init__.py", "store/a.py", "store/b.py", "aaa_new.py", "zzz_new.py"]
