"""The console scripts' entry points: a script whose install extra is missing says which one to install.

``pip install pyspark-acker[spark]`` and then ``acker-bench`` used to end in a
traceback (``ModuleNotFoundError: No module named 'grpc_health'``). Each entry
point here imports its command's module when it is run; if a third-party
package that only an extra brings is missing, the script prints the ``pip
install`` line that adds it and exits 2. A missing module of the project itself
is a broken install and is raised as it is.

This module lives in the core package (every install has it) and imports the
commands by name only when run, so no library depends on a tool.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

__all__ = ["TARGETS", "launcher"]

# The third-party packages an extra brings, by import name: a script missing one names its extra.
EXTRA_PACKAGES = frozenset(
    {"grpc_health", "grpc_reflection", "prometheus_client", "pyspark", "pyarrow", "pandas", "rich", "redis", "pika"}
)

TARGETS = {
    "acker-server": ("acker_service.cli:main", "server"),
    "acker-healthcheck": ("acker_service.healthcheck:main", "server"),
    "acker-bench": ("acker_bench.cli:main", "tools"),
    "acker-cluster": ("acker_cluster.cli:main", "tools"),
    "acker-demo": ("acker_demo:main", "tools"),
}
"""Each console script that needs an extra: the function it runs and the extra it needs beyond the core install."""


def launcher(script: str) -> Callable[[], int]:
    """The entry point of ``script`` (one of :data:`TARGETS`): runs its function, or names its extra if missing."""
    target, extra = TARGETS[script]
    module_name, _, function = target.partition(":")

    def main() -> int:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            missing = (err.name or "").split(".")[0]
            if missing not in EXTRA_PACKAGES:
                raise  # not a package an extra brings: the install itself is broken
            print(
                f"{script}: the Python package {missing!r} is not installed; {script} needs the [{extra}] extra: "
                f"pip install 'pyspark-acker[{extra}]' (or the wheel with [{extra}] after its path)",
                file=sys.stderr,
            )
            return 2
        return int(getattr(module, function)() or 0)

    main.__name__ = main.__qualname__ = script.replace("-", "_")
    main.__doc__ = f"The ``{script}`` command ({target})."
    return main


acker_server = launcher("acker-server")
acker_healthcheck = launcher("acker-healthcheck")
acker_bench = launcher("acker-bench")
acker_cluster = launcher("acker-cluster")
acker_demo = launcher("acker-demo")
