"""Every ```python block of the README and docs/ runs, as written, against a local acker cluster (issue 12).

The convention (docs/testing.md):

- a fenced block tagged ``python`` is run as a script of its own;
- ``<!-- continues -->`` on the line before a block runs it after the previous
  python block of the same page, as one script (say so in the text too);
- ``<!-- notest: why -->`` on the line before a block skips it, with the reason;
- the scripts get ``ACKER_ADDRESSES`` (three shards, in shard order) and run in a
  fresh directory holding ``in/``, a directory of text files; relative paths
  such as ``out.sqlite`` land there.

Blocks that use Spark are also marked ``spark`` (each starts its own local Spark).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from acker_client.testing import local_cluster

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_NOTEST = re.compile(r"^\s*<!--\s*notest:\s*(\S.*?)\s*-->\s*$")
_CONTINUES = re.compile(r"^\s*<!--\s*continues\s*-->\s*$")
INPUT = {
    "in/a.txt": "the quick brown fox\njumps over the lazy dog\n",
    "in/b.txt": "alpha,beta,gamma\nbeta,gamma\n",
}


@dataclass
class Script:
    """Consecutive blocks of one page run as one script, named by the first block's line."""

    page: Path
    line: int
    blocks: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def code(self) -> str:
        return "\n\n".join(self.blocks)

    @property
    def spark(self) -> bool:
        return "pyspark" in self.code or "acker_spark" in self.code


def scripts(page: Path) -> Iterator[Script]:
    """The page's python blocks grouped into scripts (see the module docstring)."""
    lines = page.read_text().splitlines()
    current: Script | None = None
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence or not fence[2]:
            i += 1
            continue
        indent, language, start = fence[1], fence[2], i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if language != "python":
            continue
        before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        if _NOTEST.match(before):
            continue
        assert "notest" not in before, f"{page.name}:{start + 1}: write <!-- notest: the reason -->"
        code = textwrap.dedent("\n".join(body))
        if _CONTINUES.match(before):
            assert current is not None, f"{page.name}:{start + 1}: <!-- continues --> with no python block before it"
            current.blocks.append(code)
            continue
        if current is not None:
            yield current
        current = Script(page, start + 1, [code])
    if current is not None:
        yield current


ALL = [s for page in PAGES for s in scripts(page)]


@pytest.fixture(scope="module")
def addresses() -> Iterator[str]:
    """One 3-shard cluster for every script, on free loopback ports."""
    with local_cluster(3, message_timeout=30.0) as ackers:
        yield ",".join(ackers.addresses)


@pytest.mark.docs
@pytest.mark.parametrize(
    "script", [pytest.param(s, id=s.id, marks=[pytest.mark.spark] if s.spark else []) for s in ALL]
)
def test_block_runs_as_written(script: Script, addresses: str, tmp_path: Path) -> None:
    for name, text in INPUT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "snippet.py").write_text(script.code)
    env = dict(os.environ, ACKER_ADDRESSES=addresses, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{script.id} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_the_convention_finds_the_blocks() -> None:
    """The parser sees blocks (a regex that matched nothing would make the test above vacuous)."""
    assert any(s.page.name == "README.md" for s in ALL)
    assert any(len(s.blocks) > 1 for s in ALL)  # a continued block


def test_example_addresses_match_the_compose_file() -> None:
    """acker-i listens on 7100+i in deploy/docker-compose.yml; examples must say so."""
    for page in PAGES:
        for match in re.finditer(r"\backer-(\d+):(\d+)\b", page.read_text()):
            assert int(match[2]) == 7100 + int(match[1]), f"{page.name}: {match[0]}"
