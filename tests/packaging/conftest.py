"""The project's wheel, built once per session from a clean copy of this tree (or ACKER_TEST_WHEEL when given).

A clean copy: only the files git tracks or would track (no build/, no built
extension, no egg-info), so what the wheel holds comes from pyproject.toml's
package list and not from leftovers of an earlier in-place build. ``make test``
passes the wheel deploy/images/build.sh built from this tree a moment before
as ACKER_TEST_WHEEL, so the session does not build the same wheel twice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What a clean copy leaves out when this tree is not a git checkout (an unpacked sdist, say).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "target", "*.egg-info", "__pycache__", "*.so", ".pytest_cache", ".hypothesis"
)


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: commands run as in a fresh shell, not inside this checkout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run_checked(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a command with a clean environment; fail the test with its output when it fails. Returns stdout."""
    done = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env if env is not None else clean_env(),
        check=False,
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def clean_copy(dest: Path) -> Path:
    """Copy this tree's source files (tracked, or untracked but not ignored) to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        shutil.copytree(REPO, dest, ignore=_NOT_SOURCE, symlinks=True)
        return dest
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet staged is still listed
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, as the README builds it (``pip wheel --no-deps . -w dist/``), from a clean copy."""
    given = os.environ.get("ACKER_TEST_WHEEL")
    if given:
        return Path(given)
    source = clean_copy(tmp_path_factory.mktemp("source"))
    dist = tmp_path_factory.mktemp("dist")
    env = clean_env()
    # Cargo's build of the native ledger: this checkout's target folder when it has one, so an
    # unchanged crate's dependencies are not compiled again.
    env.setdefault("CARGO_TARGET_DIR", str(REPO / "acker_service" / "native" / "target"))
    run_checked(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", source, "-w", dist, cwd=source, env=env)
    (wheel,) = dist.glob("pyspark_acker-*.whl")
    return wheel
