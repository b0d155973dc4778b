"""Suite-wide: how ``make test`` spreads its first tier over two pytest-xdist workers.

``make test`` runs every test not marked ``chaos`` on two workers (``PYTEST_WORKERS``,
default ``-n 2 --dist loadscope``), then the ``chaos`` tests serially (Makefile,
docs/testing.md). Tests that share expensive session fixtures must run in one
worker, or each worker would build them again, so the unit of work is a whole
top-level folder (``tests/spark`` with
its one SparkSession and Spark Connect server, ``tests/compose`` with its
compose project, ``tests/deploy`` with its Prometheus, ...), except that
``tests/spark`` is three units. The Spark tests which run a driver of their own
in a subprocess (a killed driver, speculation on a standalone cluster) need none
of the shared fixtures. The rest is split in two halves of about the same length,
each building its own SparkSession once: ``spark-read`` (the executor-read
``SourcePipeline``, Structured Streaming, and everything on the Spark Connect
server, which is built once in that half) and ``spark`` (RDD and DataFrame
bolts over SourcePipeline's records, output, leases, redrive). As one unit, the non-subprocess
part of ``tests/spark`` held one worker for most of the first tier (about 700 s
of serial test time on a loaded machine, against the tier's 823 s). The longest
units are handed out first, so none runs alone at the end. Run serially (plain
``pytest``), nothing here changes the order.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings

# Property tests check what code does, not how fast: hypothesis' default 200 ms deadline per example
# turns a loaded 2-core machine into failures (the speed targets are the benchmarks' job).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

# Longest first, by --durations runs of each folder: tools and packaging (Spark benches, the demo, the
# documentation's Spark blocks, the packed venv) each take several times the subprocess unit's ~140 s.
_FIRST = ("spark", "spark-read", "tools", "packaging", "spark-subprocess")
_SUBPROCESS_DRIVERS = {
    "tests/spark/test_exactly_once_faults.py",
    "tests/spark/test_source_restart.py",
    "tests/spark/test_source_speculation.py",
    "tests/spark/test_speculation.py",
}
# The spark-read half: every file that uses the Spark Connect server is here, so it starts once.
_SPARK_READ_PREFIXES = ("tests/spark/test_source_", "tests/spark/test_connect", "tests/spark/test_stream")


def unit_of(nodeid: str) -> str:
    """The work unit of a node id: its top-level folder (``tests/client/...`` -> ``client``), or a Spark unit."""
    path = nodeid.split("::", 1)[0]
    if path in _SUBPROCESS_DRIVERS:
        return "spark-subprocess"
    if path.startswith(_SPARK_READ_PREFIXES):
        return "spark-read"
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "top"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One work unit per top-level folder (see :func:`unit_of`), handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with a work unit as the scope."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep the order set below, not tests per folder
    return FolderScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the longest units first (a stable sort keeps each unit's own order)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: index for index, name in enumerate(_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(_FIRST)))
