"""The README and the manual in docs/ stay navigable and say what the code does: every relative link reaches a
file (and its heading), and the quick start the README shows is the one `make run` runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
QUICK_START = "birder-repro -m experiment=quickstart optim=sgdm,onebit_adam,birder"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(page: Path) -> list[str]:
    """The relative link targets of ``page``, code blocks left out."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md":
            if anchor not in {slug(h) for h in re.findall(r"^#+ (.*)$", where.read_text(), flags=re.M)}:
                broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_reaches_a_page_and_heading(page):
    assert not broken_links(page), f"{page.relative_to(REPO)}: {broken_links(page)}"


def test_a_broken_link_is_noticed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top), [gone](missing.md), [no heading](page.md#nowhere)\n")
    assert broken_links(page) == ["missing.md: no such file", "page.md#nowhere: no such heading"]


def test_every_docs_page_is_in_the_index():
    index = (REPO / "docs" / "README.md").read_text()
    missing = [p.name for p in PAGES if p.parent.name == "docs" and p.name != "README.md"
               and f"]({p.name})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"


def test_the_readme_quick_start_is_what_make_run_runs():
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\nrun:"):].split("\n")[2]
    assert QUICK_START.removeprefix("birder-repro") in recipe, recipe
    assert QUICK_START in (REPO / "README.md").read_text()
