"""Every ```python block of the README and docs/ runs, as written, against a local acker cluster (issue 12).

The convention (docs/testing.md):

- a fenced block tagged ``python`` is run as a script of its own;
- ``<!-- continues -->`` on the line before a block runs it after the previous
  python block of the same page, as one script (say so in the text too);
- ``<!-- notest: why -->`` on the line before a block skips it, with the reason;
- the scripts get ``ACKER_ADDRESSES`` (three shards, in shard order) and
  ``REDIS_URL`` (a redis-server of the run's own), and run in a
  fresh directory holding ``in/``, a directory of text files; relative paths
  such as ``out.sqlite`` land there.

Blocks that use Spark are also marked ``spark``; they run one after another in one
Python process (``doc_runner.py``), so they share one JVM instead of starting one
each, and each still starts and stops its own SparkSession.
"""

from __future__ import annotations

import json
import os
import re
import select
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
def addresses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One 3-shard cluster for every script, on free loopback ports, and a redis-server (``REDIS_URL``)."""
    from acker_bench.brokers import running_redis

    with local_cluster(3, message_timeout=30.0) as ackers, running_redis(tmp_path_factory.mktemp("redis")) as redis:
        before = os.environ.get("REDIS_URL")
        os.environ["REDIS_URL"] = redis.url  # the queue examples read it, as ACKER_ADDRESSES
        try:
            yield ",".join(ackers.addresses)
        finally:
            if before is None:
                del os.environ["REDIS_URL"]
            else:
                os.environ["REDIS_URL"] = before


SCRIPT_TIMEOUT = 600.0


def _env(addresses: str) -> dict[str, str]:
    """The scripts' environment: the cluster's addresses and this process's import path."""
    return dict(os.environ, ACKER_ADDRESSES=addresses, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


class SparkRunner:
    """doc_runner.py in a subprocess: runs the Spark scripts one at a time in one Python process and JVM."""

    def __init__(self, addresses: str, home: Path) -> None:
        self._addresses, self._log, self._workdir = addresses, home / "runner.log", home / "workdir"
        self._proc: subprocess.Popen[str] | None = None
        self._results: int | None = None

    def _start(self) -> subprocess.Popen[str]:
        read, write = os.pipe()
        if self._workdir.exists():  # a runner before this one died: a fresh JVM gets a fresh directory
            self._workdir = self._workdir.with_name(self._workdir.name + "-next")
        self._workdir.mkdir()
        with open(self._log, "a") as log:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("doc_runner.py")), str(write)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=_env(self._addresses),
                cwd=self._workdir, pass_fds=(write,), text=True, start_new_session=True,
            )  # fmt: skip
        os.close(write)
        self._proc, self._results = proc, read
        return proc

    def run(self, directory: Path) -> int | str:
        """Run ``directory/snippet.py``: its exit status, or why the runner gave no status."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        assert proc.stdin is not None and self._results is not None
        proc.stdin.write(json.dumps({"dir": str(directory)}) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([self._results], [], [], SCRIPT_TIMEOUT)
        line = os.read(self._results, 4096).decode() if ready else ""
        if not line:  # timed out or the runner died: start a fresh one for the next script
            self.stop()
            return f"no result (runner {'timed out' if not ready else 'exited'}); its log: {self._log}"
        return int(json.loads(line)["exit"])

    def stop(self) -> None:
        """End the runner (its stdin closes; killed if it does not exit)."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        if self._results is not None:
            os.close(self._results)
            self._results = None


@pytest.fixture(scope="module")
def spark_runner(addresses: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkRunner]:
    """One runner, so one JVM, for every Spark script of the run; stopped at the end of the module."""
    runner = SparkRunner(addresses, tmp_path_factory.mktemp("doc-runner"))
    try:
        yield runner
    finally:
        runner.stop()


@pytest.mark.docs
@pytest.mark.parametrize(
    "script", [pytest.param(s, id=s.id, marks=[pytest.mark.spark] if s.spark else []) for s in ALL]
)
def test_block_runs_as_written(script: Script, addresses: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for name, text in INPUT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "snippet.py").write_text(script.code)
    if script.spark:
        status = request.getfixturevalue("spark_runner").run(tmp_path)
        out, err = ((tmp_path / f).read_text() if (tmp_path / f).exists() else "" for f in ("stdout.txt", "stderr.txt"))
        assert status == 0, f"{script.id} failed ({status}):\n{out[-2000:]}\n{err[-4000:]}"
        return
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, env=_env(addresses), capture_output=True, text=True,
        timeout=SCRIPT_TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{script.id} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


@pytest.mark.docs
def test_a_failing_spark_script_fails_its_test(spark_runner: SparkRunner, tmp_path: Path) -> None:
    """The shared runner reports a script's exception and exit status, and runs the next script after it."""
    failing, passing = tmp_path / "failing", tmp_path / "passing"
    for directory, code in ((failing, "import sys\nprint('about to fail')\nsys.exit(3)\n"), (passing, "print('ok')\n")):
        directory.mkdir()
        (directory / "snippet.py").write_text(code)
    assert spark_runner.run(failing) == 3
    assert (failing / "stdout.txt").read_text() == "about to fail\n"
    raising = tmp_path / "raising"
    raising.mkdir()
    (raising / "snippet.py").write_text("raise ValueError('from the script')\n")
    assert spark_runner.run(raising) == 1
    assert "ValueError: from the script" in (raising / "stderr.txt").read_text()
    assert spark_runner.run(passing) == 0
    assert (passing / "stdout.txt").read_text() == "ok\n"


def test_the_convention_finds_the_blocks() -> None:
    """The parser sees blocks (a regex that matched nothing would make the test above vacuous)."""
    assert any(s.page.name == "README.md" for s in ALL)
    assert any(len(s.blocks) > 1 for s in ALL)  # a continued block


def test_example_addresses_match_the_compose_file() -> None:
    """acker-i listens on 7100+i in deploy/docker-compose.yml; examples must say so."""
    for page in PAGES:
        for match in re.finditer(r"\backer-(\d+):(\d+)\b", page.read_text()):
            assert int(match[2]) == 7100 + int(match[1]), f"{page.name}: {match[0]}"
