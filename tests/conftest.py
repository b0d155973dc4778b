"""Suite-wide: how ``make test`` spreads the suite over two pytest-xdist workers.

``make test`` runs ``pytest -n 2 --dist loadscope``. Tests that share expensive
session fixtures must run in one worker, or each worker would build them
again, so the unit of work is a whole top-level folder (``tests/spark`` with
its one SparkSession and Spark Connect server, ``tests/compose`` with its
compose project, ``tests/deploy`` with its Prometheus, ...). The two longest
folders, ``spark`` and ``packaging`` (documentation blocks that start Spark),
are handed out first, so neither runs alone at the end. Run serially (plain
``pytest``), nothing here changes the order.
"""

from __future__ import annotations

from typing import Any

import pytest

_FIRST = ("spark", "packaging")


def folder_of(nodeid: str) -> str:
    """The top-level test folder of a node id (``tests/spark/test_x.py::t`` -> ``spark``)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "top"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One work unit per top-level folder, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class FolderScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with a folder as the scope."""

        def _split_scope(self, nodeid: str) -> str:
            return folder_of(nodeid)

    config.option.loadscopereorder = False  # keep the order set below, not tests per folder
    return FolderScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the longest folders first (a stable sort keeps each folder's own order)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: index for index, name in enumerate(_FIRST)}
    items.sort(key=lambda item: rank.get(folder_of(item.nodeid), len(_FIRST)))
