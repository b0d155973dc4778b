"""The documentation: every relative link resolves, no hard-coded test counts, the layout table matches the tree."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The page without its fenced code blocks (links and headings inside code are not markdown)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of ``path``."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(path), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    """Every relative link of the page names an existing file and, after '#', a heading of it."""
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: {broken}"


def test_anchors_follow_github(tmp_path):
    """Headings become GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, code ignored."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A `code_name` heading: here\n\n```sh\n# a shell comment\n```\n")
    assert _anchors(page) == {"title", "a-code_name-heading-here"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_hard_coded_test_counts(page):
    """Pages never state how many tests there are: such a number is stale after the next commit."""
    counts = re.findall(r"\b\d[\d,]* (?:tests|test cases)\b", page.read_text())
    assert not counts, f"{page.relative_to(REPO)} states test counts: {counts}"


def _layout_paths() -> list[str]:
    """The paths named in the first column of the README's repository layout table."""
    text = (REPO / "README.md").read_text()
    table = text.split("## Repository layout", 1)[1].split("\n## ", 1)[0]
    paths = []
    for row in re.findall(r"^\| ([^|]+) \|", table, flags=re.M):
        paths += [p.rstrip("/") for p in re.findall(r"`([^`]+)`", row)]
    return paths


def test_layout_table_names_only_existing_paths():
    """Every path in the README's layout table exists."""
    missing = [p for p in _layout_paths() if not (REPO / p).exists()]
    assert not missing, f"the README's layout table names paths that do not exist: {missing}"


def test_layout_table_covers_the_tree():
    """Every top-level entry and every Python package outside tests appears in the README's layout table."""
    listed = set(_layout_paths())
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    top = {f.split("/")[0] for f in files if not f.startswith(".") and f != "README.md"}
    packages = {
        f.rsplit("/", 1)[0] for f in files if f.endswith("/__init__.py") and not {"tests", "v1"} & set(f.split("/"))
    }
    # A folder counts as listed when it, or a path inside it, is.
    unlisted = sorted(p for p in top | packages if not any(x == p or x.startswith(p + "/") for x in listed))
    assert not unlisted, f"the README's layout table does not mention: {unlisted}"
