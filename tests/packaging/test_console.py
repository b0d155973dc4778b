"""Console scripts name the install extra they need when one of its packages is missing, instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from acker_protocol import console

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _run(script: str, hidden: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script``'s entry point in a fresh interpreter where the package ``hidden`` cannot be imported."""
    code = (
        f"import sys; sys.modules[{hidden!r}] = None; sys.argv = [{script!r}, *{list(args)!r}]; "
        f"from acker_protocol.console import launcher; sys.exit(launcher({script!r})())"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_every_script_that_needs_an_extra_starts_through_the_launcher() -> None:
    for script, (_, extra) in console.TARGETS.items():
        name = script.replace("-", "_")
        assert PROJECT["scripts"][script] == f"acker_protocol.console:{name}", script
        assert extra in PROJECT["optional-dependencies"], extra
        assert getattr(console, name).__name__ == name


@pytest.mark.parametrize(("script", "hidden"), [("acker-bench", "grpc_health"), ("acker-server", "prometheus_client")])
def test_a_missing_extra_is_named_with_its_install_line(script: str, hidden: str) -> None:
    done = _run(script, hidden, "--help")
    extra = console.TARGETS[script][1]
    assert done.returncode == 2, done.stderr
    assert f"{script}: the Python package {hidden!r} is not installed" in done.stderr
    assert f"pip install 'pyspark-acker[{extra}]'" in done.stderr and "Traceback" not in done.stderr


def test_with_its_packages_the_script_runs_as_before() -> None:
    done = _run("acker-bench", "a_package_nobody_imports", "--help")
    assert done.returncode == 0 and "--mode" in done.stdout, done.stderr


def test_a_missing_module_of_the_project_itself_is_not_blamed_on_an_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(console.TARGETS, "acker-bench", ("acker_no_such_module:main", "tools"))
    with pytest.raises(ModuleNotFoundError, match="acker_no_such_module"):
        console.launcher("acker-bench")()
