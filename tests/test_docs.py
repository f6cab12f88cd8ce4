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
    missing = [
        p.name for p in PAGES if p.parent.name == "docs" and p.name != "README.md" and f"]({p.name})" not in index
    ]
    assert not missing, f"docs/README.md does not list {missing}"


def test_the_readme_quick_start_is_what_make_run_runs():
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\nrun:") :].split("\n")[2]
    assert QUICK_START.removeprefix("birder-repro") in recipe, recipe
    assert QUICK_START in (REPO / "README.md").read_text()


# The README's sections that report a committed experiment, and the docs page that reports it in full: every number
# the README states there must be one the page states (a rerun that changes the page must change the README too).
EXPERIMENT_SECTIONS = {"## Where Birder pays": "docs/time-to-accuracy.md"}


def numbers(text: str) -> set[str]:
    """The numbers written in ``text`` (``18.0``, ``1.6``, ``4.2`` of ``4.2x``, ``2,5`` ...), as written."""
    return set(re.findall(r"\d+(?:[.,]\d+)*", text))


def stated_elsewhere(number: str, text: str) -> bool:
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", text) is not None


def readme_section(heading: str) -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index(heading)
    end = readme.find("\n## ", start + len(heading))
    return readme[start : end if end > 0 else None]


@pytest.mark.parametrize("heading", sorted(EXPERIMENT_SECTIONS))
def test_the_readme_states_the_numbers_its_experiment_page_states(heading):
    section = readme_section(heading)
    page = (REPO / EXPERIMENT_SECTIONS[heading]).read_text()
    missing = sorted(n for n in numbers(section) if not stated_elsewhere(n, page))
    assert not missing, f"README's {heading!r} states {missing}, which {EXPERIMENT_SECTIONS[heading]} does not"


def test_a_number_the_page_does_not_state_is_noticed():
    assert stated_elsewhere("18.0", "Birder 18.0 ± 1.6 s") and not stated_elsewhere("18.0", "Birder 18.05 s")
    assert not stated_elsewhere("2.7", "2.68 MB") and stated_elsewhere("4.2", "4.2x the best")
    assert numbers("4.2x at 50 Mbit/s, 670,730 parameters") == {"4.2", "50", "670,730"}
