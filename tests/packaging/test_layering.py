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


# acker_service's moving wing (acker_service/moving/): layout changes, handoffs, catch-up.
SERVICE = REPO / "acker_service"
WING = SERVICE / "moving"
# What the wing stands on: the ledger and its vocabulary. Nothing that serves (shard, servicer, server, ...).
BELOW_WING = {"batch", "config", "handoff", "ledger", "outcome_columns"}
# The modules that use the wing; the ledger engines and everything else below it never import it.
WING_USERS = {"cli", "metrics", "server", "servicer", "shard"}


def _service_imports(path: Path, text: str | None = None) -> set[str]:
    """The acker_service modules ``path`` imports, as dotted paths inside the package (relative imports resolved)."""
    package = list(path.relative_to(SERVICE).parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(text if text is not None else path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                parts = base + (node.module.split(".") if node.module else [a.name for a in node.names][:1])
            elif node.module and node.module.split(".")[0] == "acker_service":
                parts = node.module.split(".")[1:]
            else:
                continue
            found.add(".".join(parts))
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("acker_service.")}
    return found


def test_the_moving_wing_stands_on_the_ledger_only():
    """The wing imports its own modules and the ledger's vocabulary, never what serves it (no upward import)."""
    wrong = []
    for path in sorted(WING.rglob("*.py")):
        for target in sorted(_service_imports(path)):
            head = target.split(".")[0]
            if head != "moving" and head not in BELOW_WING:
                wrong.append(f"acker_service/moving/{path.name} imports acker_service.{target}")
    assert not wrong, "moving wing layering broken: " + "; ".join(wrong)


def test_only_the_serving_modules_import_the_moving_wing():
    """The ledger engines, batch, config and the rest of the core know nothing of moves."""
    wrong = [
        f"acker_service/{path.name} imports acker_service.{target}"
        for path in sorted(SERVICE.glob("*.py"))
        if path.stem not in WING_USERS
        for target in sorted(_service_imports(path))
        if target.split(".")[0] == "moving"
    ]
    assert not wrong, "the core imports the moving wing: " + "; ".join(wrong)


def test_the_service_scan_resolves_relative_imports():
    """A wing module's ``from ..shard import Shard`` is seen as an import of acker_service.shard."""
    text = "from ..shard import Shard\nfrom .layout import Layout\nimport acker_service.server\n"
    assert _service_imports(WING / "membership.py", text) == {"shard", "moving.layout", "server"}


def test_server_and_client_decode_apply_requests_with_one_codec():
    """Only acker_protocol.apply_codec turns ApplyRequest bytes into a message in the libraries' Python code.

    The acker's steady Apply path hands the bytes to the native core; its moves,
    and the client's re-routing of a refused batch, split them with the codec.
    """
    allowed = {
        "acker_protocol/apply_codec.py",
        "acker_client/batching.py",  # to_request(): the client's own bytes, for inspection
    }
    wrong = []
    for package in ("acker_protocol", "acker_service", "acker_client"):
        folder = FORBIDDEN[package][0]
        for path in sorted(folder.rglob("*.py")):
            name = f"{package}/{path.relative_to(folder)}"
            if "v1" in path.relative_to(folder).parts or name in allowed:
                continue
            if "ApplyRequest.FromString" in path.read_text():
                wrong.append(name)
    assert not wrong, "ApplyRequest decoded outside the codec in: " + ", ".join(wrong)
    assert "acker_protocol.apply_codec" in {
        node.module for node in ast.walk(ast.parse((REPO / "client/acker_client/relayout.py").read_text()))
        if isinstance(node, ast.ImportFrom)
    }  # fmt: skip


# acker_spark's folders: which of the package's folders each may not import, and why.
SPARK = REPO / "spark_integration" / "acker_spark"
DRIVERS = {"executor_read", "streaming", "output"}
SPARK_FORBIDDEN = {
    # What runs inside the user's job serves every driver: it knows none of them.
    "steps": DRIVERS,
    # The tracking layer under the drivers (book, checkpoint, emission log, ...) serves them all: it imports none.
    "tracking": DRIVERS | {"queues"},
    # The package's shared modules (run report, policy, dead letters, ...) sit below every folder but the steps.
    "": DRIVERS,
}


def _spark_imports(path: Path, text: str | None = None) -> set[str]:
    """The acker_spark modules ``path`` imports, as dotted paths inside the package (relative imports resolved)."""
    package = list(path.relative_to(SPARK).parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(text if text is not None else path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "acker_spark":
                parts = node.module.split(".")[1:]
            else:
                continue
            found.add(".".join(parts))
    return found


def _folder(dotted: str) -> str:
    """The folder of an acker_spark module (its first part if that is a folder; "" for a top-level module)."""
    head = dotted.split(".")[0]
    return head if (SPARK / head).is_dir() else ""


def test_acker_spark_folders_follow_their_layers():
    """Steps and the tracking layer import no driver, and the package's shared modules import none of the driver
    folders."""
    wrong = []
    for path in sorted(SPARK.rglob("*.py")):
        rel = path.relative_to(SPARK)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue  # the package's public names gather every folder
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        for target in sorted(_spark_imports(path)):
            if _folder(target) in SPARK_FORBIDDEN.get(folder, set()) - {folder}:
                wrong.append(f"acker_spark/{rel} imports acker_spark.{target}")
    assert not wrong, "acker_spark layering broken: " + "; ".join(wrong)


def test_the_folder_scan_resolves_relative_imports():
    """A step's ``from ..executor_read.source_pipeline import X`` is seen as an import of a driver."""
    text = "from ..executor_read.source_pipeline import SourcePipeline\nfrom .frames import pack_ids\n"
    assert _spark_imports(SPARK / "steps" / "step.py", text) == {"executor_read.source_pipeline", "steps.frames"}
    assert _folder("executor_read.source_pipeline") in SPARK_FORBIDDEN["steps"]


def test_no_import_cycles_across_acker_spark_folders():
    """No loop of imports between modules of different acker_spark folders either (lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in SPARK.rglob("*.py"):
        rel = path.relative_to(SPARK).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[name] = _spark_imports(path)  # a package's own name stands for its __init__
    for name in graph:
        graph[name] = {t for t in graph[name] if t in graph and t != name}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


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
                    targets.add(module[len(package) + 1 :].split(".")[0])
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


PACKAGE_FOLDERS = (
    {name: folder for name, (folder, _) in FORBIDDEN.items()}
    | {f"acker_spark.{sub.name}": sub for sub in sorted(SPARK.iterdir()) if (sub / "__init__.py").is_file()}
    | {"acker_service.moving": WING}
)


@pytest.mark.parametrize("package", sorted(PACKAGE_FOLDERS))
def test_no_import_cycles_inside_a_package(package):
    """No two modules of a library package (or of one of acker_spark's folders) import each other, even lazily."""
    cycle = _cycle(_module_graph(PACKAGE_FOLDERS[package], package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_lazy_cycle():
    """A cycle closed by a function-level import is found."""
    assert _cycle({"executor": {"frames"}, "frames": {"executor"}}) == ["executor", "frames", "executor"]
