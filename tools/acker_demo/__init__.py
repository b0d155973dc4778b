"""acker-demo: the word-count job with tracking, injected failures and replays, on local ackers and local Spark.

A tool beside the Spark integration (needs the ``[tools]`` and ``[spark]``
extras): ``wordcount`` holds the job's bolts, sink and expected counts, ``cli``
the command that runs it and prints what happened.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["main", "missing_dependencies"]


def missing_dependencies() -> list[str]:
    """The packages the demo needs that are not installed (it runs local Spark and prints with rich)."""
    return [name for name in ("pyspark", "rich") if importlib.util.find_spec(name) is None]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``acker-demo`` command: says how to install what is missing instead of an import traceback."""
    missing = missing_dependencies()
    if missing:
        print(
            f"acker-demo: needs {' and '.join(missing)} (and Java 17 for Spark); install them with "
            "pip install 'pyspark-acker[tools]', or run make demo from a clone",
            file=sys.stderr,
        )
        return 2
    from .cli import main as run

    return run(argv)
