"""The README stays short, and every relative link of the README and docs/ leads to a file that exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
# Links to pages that another branch of the same change adds; each entry goes once that branch is merged.

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def links(page: Path) -> list[str]:
    """The targets of the page's links that are not absolute URLs (outside code)."""
    text = _CODE.sub("", page.read_text(encoding="utf-8"))
    targets = [m.group(1) for m in _LINK.finditer(text)]
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def relative_links(page: Path) -> list[str]:
    """The targets of the page's links to other files (neither absolute URLs nor anchors of the page)."""
    return [t for t in links(page) if not t.startswith("#")]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    headings = re.findall(r"^#{1,6} +(.+?) *$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.replace("`", "").lower()).replace(" ", "-") for h in headings}


def test_the_readme_is_under_300_lines():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move reference material to docs/"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file(page):
    broken = []
    for target in relative_links(page):
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist: {broken}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_to_a_heading_names_one_that_exists(page):
    broken = []
    for target in links(page):
        if "#" not in target:
            continue
        name, anchor = target.split("#", 1)
        path = (page.parent / name).resolve() if name else page
        if path.suffix == ".md" and path.exists() and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to headings that do not exist: {broken}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#", 1)[0]).resolve() for t in relative_links(ROOT / "README.md")}
    orphans = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link to: {orphans}"


def test_the_link_reader_finds_relative_links_and_skips_urls_anchors_and_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "[a](docs/a.md) ![b](tests/b.png) [c](https://x.org) [d](#top) `[e](e.md)` [f](docs/f.md#part)\n"
        "```\n[g](g.md)\n```\n",
        encoding="utf-8",
    )
    assert relative_links(page) == ["docs/a.md", "tests/b.png", "docs/f.md#part"]


def test_heading_anchors_are_made_as_github_makes_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Native (PZQ)\n## eMQP gateway (EventMQ)\n### `--confirm` and more\n", encoding="utf-8")
    assert anchors(page) == {"native-pzq", "emqp-gateway-eventmq", "--confirm-and-more"}


def test_every_key_of_conf_pzq_toml_has_a_row_in_docs_configuration_md():
    keys = tomllib.loads((ROOT / "conf" / "pzq.toml").read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [key for key in keys if f"| `{key}` |" not in page]
    assert not missing, f"settings of conf/pzq.toml without a row in docs/configuration.md: {missing}"
