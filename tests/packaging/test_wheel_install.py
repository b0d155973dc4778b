"""The README's install, run: the project's wheel in a fresh virtualenv, every console script starting from it.

The wheel (built from a clean copy of this tree, or ACKER_TEST_WHEEL) is
installed, not editable, into a new venv without system site-packages. Its
dependencies come from the test's own environment through a folder of links
that leaves this project out (pyspark alone is ~300 MB; pip is not asked to
fetch it again), so whatever the tools import of the project comes from the
wheel. A package missing from pyproject.toml's list then fails here as a user
would meet it: ``ModuleNotFoundError`` from ``acker-bench --help``.

Deselect with ``-m "not venv"`` (the wheel needs a Rust toolchain).
"""

from __future__ import annotations

import json
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO, run_checked

pytestmark = [pytest.mark.venv, pytest.mark.timeout(900)]

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = sorted(PYPROJECT["project"]["scripts"])
# The extras a user installs (dev is the test and lint toolchain).
USER_EXTRAS = sorted(set(PYPROJECT["project"]["optional-dependencies"]) - {"dev"})
PROJECT_NAMES = ("pyspark_acker", "__editable__", "acker_")


def _dependencies_without_the_project(folder: Path) -> Path:
    """Links to every entry of this environment's site-packages but the project's own (editable hooks, metadata)."""
    folder.mkdir()
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site).iterdir():
            if entry.name.startswith(PROJECT_NAMES) or entry.suffix == ".pth" or (folder / entry.name).exists():
                continue
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.fixture(scope="module")
def installed(project_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the project's wheel; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel-venv")
    env_dir = root / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    run_checked(base_python, "-m", "venv", "--without-pip", env_dir)
    venv_python = env_dir / "bin" / "python"
    site = Path(run_checked(venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site / "dependencies.pth").write_text(f"{_dependencies_without_the_project(root / 'dependencies')}\n")
    pip = (sys.executable, "-m", "pip", "--python", venv_python, "--disable-pip-version-check")
    run_checked(*pip, "install", "--quiet", "--no-deps", project_wheel)
    # Every user extra's requirements are met (by the linked dependencies): pip finds nothing to fetch.
    extras = ",".join(USER_EXTRAS)
    run_checked(*pip, "install", "--quiet", "--no-index", f"pyspark-acker[{extras}] @ {project_wheel.as_uri()}")
    return env_dir / "bin"


def _tree_packages() -> dict[str, Path]:
    """Every acker_* package under the tree's source folders (tests and build output aside) -> its folder."""
    found = {}
    for init in REPO.rglob("__init__.py"):
        parts = init.parent.relative_to(REPO).parts
        if not parts or parts[0] in ("tests", "build", "dist") or parts[0].startswith("."):
            continue
        top = init.parent  # named from its topmost package folder, as the wheel names it
        while (top.parent / "__init__.py").exists():
            top = top.parent
        if top.name.startswith("acker_"):
            found[".".join(init.parent.relative_to(top.parent).parts)] = init.parent
    return found


def test_the_wheel_holds_every_package_of_the_tree(project_wheel: Path) -> None:
    names = set(zipfile.ZipFile(project_wheel).namelist())
    in_wheel = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    missing = sorted(set(_tree_packages()) - in_wheel)
    assert not missing, f"packages in the tree but not in the wheel {project_wheel.name}: {missing}"


def test_the_wheel_holds_no_module_the_tree_lacks(project_wheel: Path) -> None:
    """A module deleted from the tree but left in an in-place build's build/lib must not ship."""
    packages = _tree_packages()
    stale = []
    for name in zipfile.ZipFile(project_wheel).namelist():
        package, _, file = name.rpartition("/")
        if file.endswith((".py", ".pyi")) and ".dist-info" not in package:
            folder = packages.get(package.replace("/", "."))
            if folder is None or not (folder / file).exists():
                stale.append(name)
    assert not stale, f"{project_wheel.name} holds modules this tree does not have (a stale build/?): {stale}"


def test_the_wheel_declares_every_console_script(project_wheel: Path) -> None:
    with zipfile.ZipFile(project_wheel) as wheel:
        (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = wheel.read(entry_points).decode()
    declared = {line.split("=")[0].strip() for line in text.split("[console_scripts]")[1].splitlines() if "=" in line}
    assert declared >= set(SCRIPTS), text


def test_the_project_comes_from_the_wheel(installed: Path) -> None:
    code = "import acker_service, acker_client, acker_spark, acker_bench; print(acker_service.__file__)"
    where = run_checked(installed / "python", "-c", code, cwd=installed)
    assert "site-packages" in where and str(REPO) not in where, where


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_starts(installed: Path, script: str) -> None:
    out = run_checked(installed / script, "--help", cwd=installed)
    assert "usage:" in out.lower(), out


def test_acker_bench_runs_a_short_mode(installed: Path) -> None:
    out = run_checked(installed / "acker-bench", "--mode", "simulate", "--seeds", "3", "--json", cwd=installed)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["seeds"] == 3 and summary["failures"] == 0, summary
