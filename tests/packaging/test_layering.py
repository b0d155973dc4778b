"""Package layering: server and client meet only in the protocol package, and no library imports a tool.

Reads every import statement (function-level ones included) of the library
packages, so a new cross-import fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TOOLS = {"acker_cluster", "acker_bench", "acker_demo"}
# Library package -> (its folder, the project packages it must never import).
FORBIDDEN = {
    "acker_protocol": (REPO / "proto" / "acker_protocol", {"acker_service", "acker_client", "acker_spark"} | TOOLS),
    "acker_service": (REPO / "acker_service", {"acker_client", "acker_spark"} | TOOLS),
    "acker_client": (REPO / "client" / "acker_client", {"acker_service", "acker_spark"} | TOOLS),
    "acker_spark": (REPO / "spark_integration" / "acker_spark", {"acker_service"} | TOOLS),
}
# Modules allowed one of the imports above, and why.
EXCEPTIONS = {
    # The user-facing test helper's job is to start real ackers: in-process, or
    # as processes with the launcher (lazily, only for processes=True).
    ("acker_client/testing.py", "acker_service"),
    ("acker_client/testing.py", "acker_cluster"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_library_imports_follow_the_layers(package):
    """A library package imports no project package above or beside it (the listed exceptions aside)."""
    folder, forbidden = FORBIDDEN[package]
    wrong = []
    for path in sorted(folder.rglob("*.py")):
        if "v1" in path.relative_to(folder).parts:
            continue  # generated code imports only protobuf and grpc
        name = f"{package}/{path.relative_to(folder)}"
        wrong += [
            f"{name}:{line} imports {target}"
            for line, target in _imports(path)
            if target in forbidden and (name, target) not in EXCEPTIONS
        ]
    assert not wrong, "layering broken: " + "; ".join(wrong)


def test_the_scan_sees_function_level_imports(tmp_path):
    """The import scan finds imports inside functions, where lazy imports hide."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from acker_service.server import AckerServer\n")
    assert _imports(module) == [(2, "acker_service")]
