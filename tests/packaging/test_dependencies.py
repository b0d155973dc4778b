"""Each package imports only third-party packages its install extra provides, so an executor installs little.

The core install (client and protocol) is grpcio and protobuf; the Spark
integration adds pyspark (pyarrow with ``[streaming]``); the server and the
tools have extras of their own. Import names are mapped to distributions here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

DISTRIBUTION_OF = {
    "grpc": "grpcio",
    "google": "protobuf",
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "prometheus_client": "prometheus-client",
    "numpy": "numpy",
    "pyspark": "pyspark",
    "pyarrow": "pyarrow",
    "pandas": "pandas",  # the [spark] extra: identity hashing (pandas.util.hash_array) and PySpark's Arrow UDFs
    "rich": "rich",
    "cryptography": "cryptography",
    "redis": "redis",  # the [queues] extra: acker_spark.queues' Redis Streams source
    "pika": "pika",  # ... and its RabbitMQ source
}
PROJECT = {
    "acker_protocol",
    "acker_service",
    "acker_client",
    "acker_spark",
    "acker_cluster",
    "acker_bench",
    "acker_demo",
    "acker_ctl",
}
# Package -> (folder, the extras a user installs for it).
PACKAGES = {
    "acker_protocol": ("proto/acker_protocol", ()),
    "acker_client": ("client/acker_client", ()),
    "acker_spark": ("spark_integration/acker_spark", ("spark", "streaming", "queues")),
    "acker_service": ("acker_service", ("server",)),
    "acker_cluster": ("tools/acker_cluster", ("tools",)),
    "acker_bench": ("tools/acker_bench", ("tools",)),
    "acker_demo": ("tools/acker_demo", ("tools",)),
    "acker_ctl": ("tools/acker_ctl", ()),
}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]


def _distributions(extras: tuple[str, ...]) -> set[str]:
    """Distributions installed by the core plus ``extras`` (self-references expanded)."""
    found = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    todo = list(extras)
    while todo:
        for requirement in PYPROJECT["project"]["optional-dependencies"][todo.pop()]:
            name = _name(requirement)
            if name == PYPROJECT["project"]["name"]:
                todo += re.findall(r"\w+", requirement.split("[", 1)[1])
            else:
                found.add(name)
    return found


def _third_party(folder: Path) -> dict[str, str]:
    """Top-level import name -> first place it is imported, for imports outside the stdlib and the project."""
    seen: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in PROJECT:
                    seen.setdefault(top, f"{path.relative_to(REPO)}:{node.lineno}")
    return seen


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_are_covered_by_the_package_extras(package):
    """Every third-party import of the package is installed by the core dependencies plus its extras."""
    folder, extras = PACKAGES[package]
    installed = _distributions(extras)
    missing = [
        f"{where} imports {top} ({DISTRIBUTION_OF.get(top, 'unknown distribution')})"
        for top, where in _third_party(REPO / folder).items()
        if DISTRIBUTION_OF.get(top) not in installed
    ]
    assert not missing, f"{package} (extras {extras or 'none'}): " + "; ".join(missing)


def test_the_core_install_is_the_client():
    """The core dependencies are exactly grpcio, protobuf and numpy (columnar ops): no rich, metrics or health on executors."""
    assert _distributions(()) == {"grpcio", "protobuf", "numpy"}


def test_dev_installs_every_extra():
    """make test installs .[dev], which must pull in every other extra's distributions."""
    every = set().union(*(_distributions((extra,)) for extra in PYPROJECT["project"]["optional-dependencies"]))
    assert every <= _distributions(("dev",))


def test_every_package_ships_py_typed() -> None:
    """PEP 561: without py.typed in the installed package, users' mypy skips its annotations."""
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for package, (folder, _extras) in PACKAGES.items():
        assert (REPO / folder / "py.typed").is_file(), folder
        assert "py.typed" in package_data.get(package, []), package


def test_make_demo_installs_only_what_the_demo_needs_with_progress(tmp_path: Path) -> None:
    """A fresh `make demo` installs the [tools] extra (no test or lint toolchain), with pip's output shown."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    plan = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={tmp_path / 'venv'}", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    installs = [line for line in plan.splitlines() if " pip install " in line]
    assert any("-e '.[tools]'" in line for line in installs), plan
    assert not any("[dev]" in line or "--quiet" in line for line in installs), plan


def test_a_build_without_cargo_says_how_to_install_rust(tmp_path: Path) -> None:
    """Issue 23: without cargo, setuptools-rust's error suggested a prebuilt wheel that does not exist."""
    env = {k: v for k, v in os.environ.items() if k != "CARGO"}
    env["PATH"] = str(tmp_path)  # nothing on it: no cargo
    done = subprocess.run(
        [sys.executable, "setup.py", "bdist_wheel", "--dist-dir", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "needs cargo, which is not on PATH" in done.stderr and "https://sh.rustup.rs" in done.stderr
    assert "prebuilt wheel" not in done.stderr.replace("There is no prebuilt wheel", "")
    assert not list(tmp_path.glob("*.whl"))


def test_the_installed_pandas_is_one_pyspark_supports_without_a_warning() -> None:
    """Issue 23: every Spark run printed PySpark's FutureWarning about pandas 3; the extras keep pandas below 3."""
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("spark", "connect"):
        assert any(dep.replace(" ", "").startswith("pandas>=2.2,<3") for dep in extras[extra]), extra
