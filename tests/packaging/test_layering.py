"""Package layering: server and client meet only in the protocol package, and no library imports a tool.

Reads every import statement (function-level ones included) of the library
packages, so a new cross-import fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

TOOLS = {"acker_cluster", "acker_bench", "acker_demo", "acker_ctl"}
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
    # as processes with the launcher (acker_service.process_cluster, lazily).
    ("acker_client/testing.py", "acker_service"),
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


def _module_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Module -> sibling modules it imports (relative or absolute, TYPE_CHECKING ones included)."""
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        targets = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1:
                    targets |= {module.split(".")[0]} if module else {a.name for a in node.names}
                elif node.level == 0 and module.startswith(package + "."):
                    targets.add(module.split(".")[1])
        graph[name] = targets & modules - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_cycles_inside_a_package(package):
    """No two modules of a library package import each other, directly or around a loop (lazily or not)."""
    folder, _ = FORBIDDEN[package]
    cycle = _cycle(_module_graph(folder, package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_lazy_cycle():
    """A cycle closed by a function-level import is found."""
    assert _cycle({"executor": {"frames"}, "frames": {"executor"}}) == ["executor", "frames", "executor"]
