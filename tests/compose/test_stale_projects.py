"""An interrupted run's compose project is removed by the next run, and a running run's project is left alone."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from .conftest import PREFIX, PROJECT_LABEL, _run, remove_stale_projects, stale_projects


def _dead_pid() -> int:
    """The id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_project_is_stale_only_when_its_test_process_is_gone() -> None:
    dead = _dead_pid()
    live = f"{PREFIX}{os.getpid()}abc123"
    stale = f"{PREFIX}{dead}0f0f0f"
    assert stale_projects({live, stale, "otherproject", f"{PREFIX}notapid", "deploy"}) == [stale]


def test_the_network_of_an_interrupted_run_is_removed_and_a_live_one_kept() -> None:
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False).returncode != 0:
        pytest.skip("no Docker engine answers `docker info`")
    projects = {
        "stale": f"{PREFIX}{_dead_pid()}{secrets.token_hex(3)}",
        "live": f"{PREFIX}{os.getpid()}{secrets.token_hex(3)}",
    }
    networks = {kind: f"{project}_default" for kind, project in projects.items()}
    for kind, project in projects.items():
        _run("docker", "network", "create", "--label", f"{PROJECT_LABEL}={project}", networks[kind])
    try:
        removed = remove_stale_projects()
        assert projects["stale"] in removed and projects["live"] not in removed
        names = _run("docker", "network", "ls", "--format", "{{.Name}}").split()
        assert networks["stale"] not in names
        assert networks["live"] in names
    finally:
        _run("docker", "network", "rm", *networks.values(), check=False)
