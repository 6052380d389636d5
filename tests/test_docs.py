"""The documentation a newcomer reads: a short README that links every topic in docs/, and links that resolve.

Every markdown link in README.md, docs/ and bench/README.md points at a file that exists (and, with an anchor, at
a heading in it), and every repository path a document names in backticks exists, so a renamed module cannot
leave a document pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 12 * 1024  # the front page: what spectune is, the two commands, the pages, the CLI, where things go
DOCUMENTS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"`((?:app|engine|store|foundation|tests|bench|scripts|docs|samples|\.ci)/[\w./-]*[\w/])`")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#+ (.+)$", path.read_text(encoding="utf-8"))}


def links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(doc: Path) -> None:
    broken = []
    for target in links(doc):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked (no network here)
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(doc: Path) -> None:
    named = {m.group(1) for m in REPO_PATH.finditer(doc.read_text(encoding="utf-8"))}
    placeholder = re.compile(r"[*<>]|\b[A-Z]{3,}\b")  # engine/engines/NAME.py names a file to write
    missing = sorted(p for p in named if not placeholder.search(p) and not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_readme_is_a_front_page_that_links_every_topic() -> None:
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= README_LIMIT, f"README.md is {readme.stat().st_size} bytes"
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(readme)}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"docs the README does not link: {unlinked}"
    assert "## Two commands" in readme.read_text(encoding="utf-8") and "## Extending spectune" in readme.read_text(
        encoding="utf-8"
    )


def test_the_checks_catch_a_broken_link_and_a_missing_path(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# Top\n\n[ok](x.md#top) [gone](nowhere.md) [bad anchor](x.md#nothing)\n", encoding="utf-8")
    assert links(doc) == ["x.md#top", "nowhere.md", "x.md#nothing"]
    assert "top" in anchors(doc) and "nothing" not in anchors(doc)
    assert REPO_PATH.findall("see `engine/theory.py` and `engine/analysis/theory.py`.") == [
        "engine/theory.py",
        "engine/analysis/theory.py",
    ]
    assert not (ROOT / "engine/theory.py").exists() and (ROOT / "engine/analysis/theory.py").exists()
