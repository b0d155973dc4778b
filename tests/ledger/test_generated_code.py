"""The committed protobuf/gRPC modules must match what scripts/generate_proto.py produces now."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "proto" / "acker_protocol" / "v1"
SCRIPT = REPO / "scripts" / "generate_proto.py"
HOW_TO_FIX = (
    "regenerate with `make proto` (or `PATH=.venv/bin:$PATH .venv/bin/python scripts/generate_proto.py` "
    "from the repo root) and commit proto/acker_protocol/v1"
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """Run the generator into a temporary directory and return the generated package folder."""
    out = tmp_path_factory.mktemp("generated")
    env = dict(os.environ)
    # protoc finds the mypy-protobuf plugins (protoc-gen-mypy*) on PATH; they live next to
    # this interpreter in the venv, which need not be activated when pytest runs.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"generate_proto.py exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return out / "acker_protocol" / "v1"


def test_generator_produces_the_expected_modules(fresh):
    """The generator writes the message module, the gRPC module and both typed stubs."""
    names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    assert names == ["acker_pb2.py", "acker_pb2.pyi", "acker_pb2_grpc.py", "acker_pb2_grpc.pyi"]


def test_committed_code_is_not_stale(fresh):
    """Every generated file equals the committed one byte for byte."""
    stale = []
    for new in sorted(p for p in fresh.iterdir() if p.is_file()):
        committed = GENERATED / new.name
        if not committed.exists():
            stale.append(f"{committed.relative_to(REPO)} is missing")
        elif committed.read_bytes() != new.read_bytes():
            stale.append(f"{committed.relative_to(REPO)} differs from what proto/ generates")
    assert not stale, "generated code is stale: " + "; ".join(stale) + f"; {HOW_TO_FIX}"


def test_no_leftover_generated_files(fresh):
    """No committed *_pb2* file exists that the generator no longer produces (a removed proto)."""
    produced = {p.name for p in fresh.iterdir()}
    leftovers = sorted(p.name for p in GENERATED.glob("*_pb2*") if p.name not in produced)
    assert not leftovers, f"proto/acker_protocol/v1 holds files proto/ no longer generates: {leftovers}; delete them"
